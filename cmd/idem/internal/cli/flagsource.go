package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
	"weak"

	"github.com/agnivade/levenshtein"
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
			errs = append(errs, fmt.Errorf("invalid value %q in %s (--%s): %s", v, origin, f.Name, wanted(f, err)))
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

// Errors of the flag package, matched to say them as every other error
// of the binary says them.
var (
	reUndefined = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	reNeedsArg  = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
	reBadValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([^:]*): (.*)$`)
)

// flagError rewrites an error of fs.Parse: a mistyped flag gets the
// closest known flag as a hint, a refused value says what is wanted.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if m := reUndefined.FindStringSubmatch(msg); m != nil {
		s := fmt.Sprintf("unknown flag --%s", m[1])
		if near := closestFlag(fs, m[1]); near != "" {
			s += fmt.Sprintf("; did you mean --%s?", near)
		}
		return s
	}
	if m := reNeedsArg.FindStringSubmatch(msg); m != nil {
		s := fmt.Sprintf("--%s needs a value", m[1])
		if f := fs.Lookup(m[1]); f != nil {
			s += ": " + wanted(f, errors.New(""))
		}
		return s
	}
	if m := reBadValue.FindStringSubmatch(msg); m != nil {
		f := fs.Lookup(m[2])
		if f == nil {
			return msg
		}
		return fmt.Sprintf("invalid value %q for --%s: %s", m[1], f.Name, wanted(f, errors.New(m[3])))
	}
	return msg
}

// closestFlag returns the flag of fs nearest to name by edit distance, or
// "" when none is close enough to be what was meant.
func closestFlag(fs *flag.FlagSet, name string) string {
	best, bestD := "", 0
	fs.VisitAll(func(f *flag.Flag) {
		d := levenshtein.ComputeDistance(name, f.Name)
		if best == "" || d < bestD {
			best, bestD = f.Name, d
		}
	})
	// A third of the name, at least 1 and at most 3 edits: --upstrem is
	// --upstream, --x is nothing.
	limit := min(max(len(name)/3, 1), 3)
	if best == "" || bestD > limit {
		return ""
	}
	return best
}

// wanted says what the flag f accepts, for a value it refused with err:
// the flag package's own types refuse with "parse error", which says
// nothing to a user; other values already say what they want.
func wanted(f *flag.Flag, err error) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err.Error()
	}
	switch g.Get().(type) {
	case time.Duration:
		return "want a duration such as 24h, 90s or 500ms"
	case bool:
		return "want true or false"
	case int, int64:
		return "want a whole number"
	case uint, uint64:
		return "want a whole number, 0 or more"
	case float64:
		return "want a number"
	}
	if err.Error() == "" {
		return "want a value"
	}
	return err.Error()
}
