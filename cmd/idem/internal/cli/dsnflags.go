package cli

import (
	"flag"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
)

// dsnFlag is a DSN flag (--store, --cache) with its other sources, so a
// password need not be on the command line: --NAME, else --NAME-file (the
// file's first line), else the environment variable (envName: $IDEM_STORE,
// $IDEM_CACHE), else the default. Every command reads a DSN this way.
type dsnFlag struct {
	name  string
	value string
	file  string
}

// registerDSN adds --name and --name-file to fs; def is the default.
func registerDSN(fs *flag.FlagSet, name, def, help string) *dsnFlag {
	d := &dsnFlag{name: name}
	fs.StringVar(&d.value, name, def, dsnHelp(name, help))
	fs.StringVar(&d.file, name+"-file", "", dsnFileHelp(name))
	return d
}

// dsnHelp is the help of the DSN flag name, whose own help is help.
func dsnHelp(name, help string) string {
	return help + " (also --" + name + "-file, $" + envName(name) + ")"
}

// dsnFileHelp is the help of the DSN flag name's --name-file.
func dsnFileHelp(name string) string {
	return "read the " + name + " `DSN` from the first line of this file (keeps a password out of the process list)"
}

// Help of the DSN flags.
const (
	storeHelp = "store `DSN`: " + storeurl.Supported
	cacheHelp = "Redis `URL` of a replay cache in front of the store: " + storeurl.CacheSupported
)

func storeFlag(fs *flag.FlagSet) *dsnFlag {
	return registerDSN(fs, "store", storeurl.Default, storeHelp)
}

func cacheFlag(fs *flag.FlagSet, help string) *dsnFlag {
	return registerDSN(fs, "cache", "", help)
}

// resolve settles the DSN after fs was parsed: the command line's --NAME,
// else its --NAME-file, else the environment's $ENV (set by parse), else a
// --NAME-file from the environment or the config file, else --NAME as the
// config file or the default gives it.
func (d *dsnFlag) resolve(fs *flag.FlagSet) error {
	cmd := onCommandLine(fs)
	switch {
	case cmd[d.name] && cmd[d.name+"-file"]:
		return usageErr(fs, "give --%s or --%s-file, not both", d.name, d.name)
	case cmd[d.name]:
	case cmd[d.name+"-file"] || (d.file != "" && originOf(fs, d.name) != "$"+envName(d.name)):
		v, err := storeurl.ReadFile(d.file)
		if err != nil {
			return usageErr(fs, "--%s-file: %v", d.name, err)
		}
		d.value = v
	}
	// A DSN that names no store is a refused configuration, like any
	// value of the wrong shape: exit status 2, before anything runs.
	if d.value == "" {
		return nil
	}
	parse := func(v string) error { _, err := storeurl.Parse(v); return err }
	if d.name == "cache" {
		parse = func(v string) error { _, err := storeurl.ParseCache(v); return err }
	}
	if err := parse(d.value); err != nil {
		return usageErr(fs, "--%s: %v", d.name, err)
	}
	return nil
}
