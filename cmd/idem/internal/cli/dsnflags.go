package cli

import (
	"flag"
	"os"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
)

// dsnFlag is a DSN flag (--store, --cache) with its other sources, so a
// password need not be on the command line: --NAME, else --NAME-file (the
// file's first line), else the environment variable, else the default.
// Every command reads a DSN this way.
type dsnFlag struct {
	name, env string
	value     string
	file      string
}

// registerDSN adds --name and --name-file to fs; def is the default.
func registerDSN(fs *flag.FlagSet, name, env, def, help string) *dsnFlag {
	d := &dsnFlag{name: name, env: env}
	fs.StringVar(&d.value, name, def, help+" (also --"+name+"-file, $"+env+")")
	fs.StringVar(&d.file, name+"-file", "", "read the "+name+" `DSN` from the first line of this file (keeps a password out of the process list)")
	return d
}

func storeFlag(fs *flag.FlagSet) *dsnFlag {
	return registerDSN(fs, "store", storeurl.StoreEnv, storeurl.Default, "store `DSN`: "+storeurl.Supported)
}

func cacheFlag(fs *flag.FlagSet, help string) *dsnFlag {
	return registerDSN(fs, "cache", storeurl.CacheEnv, "", help)
}

// resolve settles the DSN after fs was parsed.
func (d *dsnFlag) resolve(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case set[d.name] && set[d.name+"-file"]:
		return usageErr(fs, "give --%s or --%s-file, not both", d.name, d.name)
	case set[d.name]:
	case d.file != "":
		v, err := storeurl.ReadFile(d.file)
		if err != nil {
			return usageErr(fs, "--%s-file: %v", d.name, err)
		}
		d.value = v
	case os.Getenv(d.env) != "":
		d.value = os.Getenv(d.env)
	}
	return nil
}
