package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"weak"
)

// A flag's value comes from, in order of precedence: the command line,
// its environment variable (envName), the proxy's config file, the
// default. parse applies the environment to every command; the layers
// below the command line go through setFrom, which records where each
// value came from.

// envName is the environment variable of the flag name: --max-body is
// IDEM_MAX_BODY.
func envName(name string) string {
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applyEnv sets every flag of fs that the command line left alone and
// whose environment variable is set (and not empty).
func applyEnv(fs *flag.FlagSet) error {
	return setFrom(fs, func(name string) (value, origin string, ok bool) {
		env := envName(name)
		v, ok := os.LookupEnv(env)
		return v, "$" + env, ok && v != ""
	})
}

// setOn reports the flags of fs set on the command line (or by an earlier
// source), by name.
func setOn(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// setFrom sets every flag of fs not set yet (on the command line or by an
// earlier layer) for which lookup has a value, and records its origin. A
// value the flag refuses is an error naming its origin and the flag.
func setFrom(fs *flag.FlagSet, lookup func(name string) (value, origin string, ok bool)) error {
	set := setOn(fs)
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		v, origin, ok := lookup(f.Name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("invalid value %q in %s (--%s): %v", v, origin, f.Name, err))
			return
		}
		flagSetsMu.Lock()
		if info := flagSets[weak.Make(fs)]; info != nil {
			info.origins[f.Name] = origin
		}
		flagSetsMu.Unlock()
	})
	return errors.Join(errs...)
}

// originOf returns where the flag name of fs took its value from when it
// was not the command line ("$IDEM_STORE", "config file idem.json"); empty
// for the command line and the default.
func originOf(fs *flag.FlagSet, name string) string {
	flagSetsMu.Lock()
	defer flagSetsMu.Unlock()
	if info := flagSets[weak.Make(fs)]; info != nil {
		return info.origins[name]
	}
	return ""
}

// onCommandLine returns the flags of fs set on the command line itself.
func onCommandLine(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		if originOf(fs, f.Name) == "" {
			set[f.Name] = true
		}
	})
	return set
}
