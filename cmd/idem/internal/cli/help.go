package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"weak"
)

// A command's help has five parts: the synopsis and the description (the
// synopsis string given to newFlags, split at its first blank line), the
// flags with their defaults (read from the flag set, so a new flag cannot
// be left out), and the examples and exit status of helpDocs.

// helpDoc is the part of a command's help that its flag set cannot tell.
type helpDoc struct {
	// examples are command lines, each optionally preceded by "# comment"
	// lines saying what it does.
	examples []string
	// exit describes the exit status when it means more than
	// success/failure/usage error; empty for exitDefault.
	exit string
}

// exitDefault is the exit status of every command unless its helpDoc says
// more.
const exitDefault = `  0  success
  1  the command failed; the reason is on stderr
  2  usage error: the command line, its environment or config file is
     refused before anything runs (an unknown flag, a value of the wrong
     type, settings that exclude each other or are missing)`

// helpDocs holds the examples and exit status of every command and
// subcommand, keyed by its path ("reconcile resolve"). TestHelpIsComplete
// fails for a command without examples.
var helpDocs = map[string]helpDoc{
	"proxy": {examples: []string{
		"# idempotency in front of the API on port 3000, one tenant per Authorization, keys in ./idem.db",
		"idem proxy --upstream http://127.0.0.1:3000 --tenant-from authorization",
		"# shared PostgreSQL store, metrics and the console on 127.0.0.1:9090, unknown outcomes asked about",
		"idem proxy --upstream http://api:3000 --listen :8080 --store postgres://idem@db/idem --tenant-from authorization \\\n    --tenant-secret-file /etc/idem/tenant.secret --admin 127.0.0.1:9090 --resolve-url http://api:3000/internal/resolve",
		"# per-route settings from a config file, the store from the environment",
		"IDEM_STORE=postgres://idem@db/idem idem proxy --config /etc/idem/proxy.json",
		"# 202 for a duplicate in flight, charges identified by two members only",
		"idem proxy --upstream http://127.0.0.1:3000 --tenant-from authorization --in-progress-status 202 --fields amount,payment.currency",
	}},
	"migrate": {examples: []string{
		"idem migrate --store postgres://idem@db:5432/idem",
	}},
	"inspect": {examples: []string{
		"# the key as the client sent it, quoted or bare",
		`idem inspect --route /v1/charges '"order-42"'`,
		"idem inspect --store postgres://idem@db/idem --tenant acme --route /v1/charges --json order-42",
		"# save a binary body",
		"idem inspect --scope '0:POST /v1/files' --body-out answer.bin upload-7",
	}},
	"delete": {examples: []string{
		"idem delete --route /v1/charges order-42",
		"# only if it has not run again since idem inspect showed fence 1732500000000000",
		"idem delete --route /v1/charges --fence 1732500000000000 order-42",
		"idem delete --store postgres://idem@db/idem --cache redis://cache:6379/0 --route /v1/charges order-42",
	}},
	"keys": {examples: []string{
		"idem keys list --route /v1/charges --state unknown",
	}},
	"keys list": {examples: []string{
		"# the newest 50 records",
		"idem keys list",
		"# one tenant's failed charges, 200 at a time, as JSON",
		"idem keys list --tenant acme --route /v1/charges --state failed_retryable --limit 200 --json",
		"# the next page: the cursor printed at the end of the previous one",
		"idem keys list --tenant acme --after 1763892000000000.MDpQT1NUIC92MS9jaGFyZ2Vz.b3JkZXItNDI",
		"# every record of one key, whatever its route",
		`idem keys list --key '"order-42"'`,
	}},
	"sweep": {examples: []string{
		"idem sweep --store postgres://idem@db/idem",
	}},
	"reap": {examples: []string{
		"idem reap --store postgres://idem@db/idem",
		"# keep expired records for audit, show progress",
		"idem reap --soft --batch 1000 --progress",
	}},
	"reconcile": {examples: []string{
		"idem reconcile list --all",
		`idem reconcile resolve --route /v1/charges --fence 1732500000000000 --completed --status 201 --body '{"id":"ch_1"}' order-42`,
	}},
	"reconcile list": {examples: []string{
		"idem reconcile list",
		"idem reconcile list --all --json --limit 1000",
	}},
	"reconcile resolve": {examples: []string{
		"# it took effect: retries replay this answer",
		"# (the fence is the one idem reconcile list showed: the execution decided about)",
		"idem reconcile resolve --route /v1/charges --fence 1732500000000000 --completed --status 201 \\\n    --header 'Content-Type: application/json' --body @charge.json order-42",
		"# it certainly did not: the next retry runs it",
		"idem reconcile resolve --route /v1/charges --fence 1732500000000000 --retryable order-42",
	}},
	"reconcile run": {examples: []string{
		"idem reconcile run --resolve-url http://api:3000/internal/resolve",
		"idem reconcile run --resolve-url http://api:3000/internal/resolve --batch 500 --progress",
	}},
	"outbox": {examples: []string{
		"idem outbox dead",
		"idem outbox redeliver --store postgres://app@db/app --kind charge idem_MnaYiURNN8vF2Oofuv3GCyBe-eMEWIv-6QdEAw960OI",
	}},
	"outbox dead": {examples: []string{
		"# the newest 50 dead letters of the default queue, in ./idem.db",
		"idem outbox dead",
		"idem outbox dead --store postgres://app@db/app --queue payments --limit 500 --json",
	}},
	"outbox show": {examples: []string{
		"# the key outbox.KeyFor gave the message (idem outbox dead lists it)",
		"idem outbox show --kind charge idem_MnaYiURNN8vF2Oofuv3GCyBe-eMEWIv-6QdEAw960OI",
	}},
	"outbox redeliver": {examples: []string{
		"# once the provider is back: the same key, fence and payload, 10 attempts",
		"idem outbox redeliver --store postgres://app@db/app --kind charge idem_MnaYiURNN8vF2Oofuv3GCyBe-eMEWIv-6QdEAw960OI",
		"idem outbox redeliver --kind charge --json idem_MnaYiURNN8vF2Oofuv3GCyBe-eMEWIv-6QdEAw960OI",
	}},
	"check": {examples: []string{
		"# against idem proxy --tenant-from authorization: each caller sends its credential",
		"idem check --header 'Authorization: Bearer sk_test' http://127.0.0.1:8080/v1/charges",
		`idem check --header 'Authorization: Bearer sk_test' --body '{"amount":100}' https://api.example.com/v1/charges`,
	}, exit: `  0  every required check passed (WARN and SKIP do not fail)
  1  a required check failed, or the command failed
  2  the command line is wrong (usage error)`},
	"bench": {examples: []string{
		"idem bench --header 'Authorization: Bearer sk_test' http://127.0.0.1:8080/v1/charges",
		"idem bench --header 'Authorization: Bearer sk_test' --keys 100 --dups 10 --concurrency 64 --duration 30s --progress \\\n    http://127.0.0.1:8080/v1/charges",
		"idem bench --header 'Authorization: Bearer sk_test' --replay-only http://127.0.0.1:8080/v1/charges",
	}, exit: `  0  every request was answered below 500 and no key ran twice
  1  requests failed (no answer, or a 5xx), a key was answered as a new
     execution twice, the run was interrupted, or the command failed
  2  the command line is wrong (usage error)`},
	"demo": {examples: []string{
		"idem demo",
		"idem demo --keep --listen 127.0.0.1:8080",
	}},
	"version": {examples: []string{
		"idem version",
		"idem --version",
	}},
	"help": {examples: []string{
		"idem help",
		"idem help proxy",
		"idem help reconcile resolve",
	}},
}

// recorder is implemented by a writer that wants the flag sets of the
// commands that write to it: the help test reads every flag a command
// defines, whatever its help prints.
type recorder interface{ recordFlags(*flag.FlagSet) }

// newFlags returns the flag set of the command at path name ("reconcile
// list"). It reports errors instead of exiting; parse prints the help on
// -h and a short usage on errors.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// flag calls Usage before it returns an error or ErrHelp; parse and
	// usageErr print what fits instead.
	fs.Usage = func() {}
	w := weak.Make(fs)
	flagSetsMu.Lock()
	flagSets[w] = &flagSetInfo{synopsis: synopsis, origins: map[string]string{}}
	flagSetsMu.Unlock()
	runtime.AddCleanup(fs, func(w weak.Pointer[flag.FlagSet]) {
		flagSetsMu.Lock()
		delete(flagSets, w)
		flagSetsMu.Unlock()
	}, w)
	if r, ok := stderr.(recorder); ok {
		r.recordFlags(fs)
	}
	return fs
}

// flagSetInfo is what a flag.FlagSet has no room for: the synopsis given
// to newFlags, and where the flags not set on the command line took their
// value from (flag name -> "$IDEM_TTL", "config file idem.json").
type flagSetInfo struct {
	synopsis string
	origins  map[string]string
}

// flagSets holds the information of each live flag set: its Usage
// function cannot tell -h from an error.
var (
	flagSetsMu sync.Mutex
	flagSets   = map[weak.Pointer[flag.FlagSet]]*flagSetInfo{}
)

// synopsisOf returns the synopsis given to newFlags for fs.
func synopsisOf(fs *flag.FlagSet) (synopsis, description string) {
	flagSetsMu.Lock()
	var text string
	if info := flagSets[weak.Make(fs)]; info != nil {
		text = info.synopsis
	}
	flagSetsMu.Unlock()
	synopsis, description, _ = strings.Cut(text, "\n\n")
	return synopsis, strings.TrimSpace(description)
}

// printHelp prints the full help of the command of fs.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	synopsis, description := synopsisOf(fs)
	fmt.Fprintf(w, "Usage: idem %s %s\n", fs.Name(), synopsis)
	if description != "" {
		fmt.Fprintf(w, "\n%s\n", description)
	}
	fmt.Fprint(w, "\nFlags:\n")
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		def := f.DefValue
		if def == "" {
			def = "none"
		}
		fmt.Fprintf(w, "  --%s%s  ($%s)\n        %s (default: %s)\n", f.Name, name, envName(f.Name),
			strings.ReplaceAll(usage, "\n", "\n        "), def)
	})
	if n == 0 {
		fmt.Fprint(w, "  none\n")
	} else {
		fmt.Fprint(w, "\n  Every flag may also be given in the environment variable beside it\n"+
			"  (booleans as true or false); the command line wins over the environment.\n")
	}
	printDoc(w, fs.Name())
}

// printDoc prints the examples and the exit status of the command at path.
func printDoc(w io.Writer, path string) {
	doc := helpDocs[path]
	if len(doc.examples) > 0 {
		fmt.Fprint(w, "\nExamples:\n")
		for _, e := range doc.examples {
			fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(e, "\n", "\n  "))
		}
	}
	exit := doc.exit
	if exit == "" {
		exit = exitDefault
	}
	fmt.Fprintf(w, "\nExit status:\n%s\n", exit)
}

// printShortUsage prints the synopsis and where the full help is, after a
// usage error.
func printShortUsage(w io.Writer, fs *flag.FlagSet) {
	synopsis, _ := synopsisOf(fs)
	fmt.Fprintf(w, "Usage: idem %s %s\nRun 'idem help %s' for the flags, examples and exit status.\n", fs.Name(), synopsis, fs.Name())
}

// group is a command made of subcommands, such as idem reconcile.
type group struct {
	name        string
	description string
	subs        []command
}

// groups lists the commands that have subcommands, for help and its test.
var groups = map[string]*group{}

func registerGroup(g *group) *group {
	groups[g.name] = g
	return g
}

func (g *group) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: idem %s <subcommand> [flags]\n\n%s\n\nSubcommands:\n", g.name, g.description)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range g.subs {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun 'idem help %s <subcommand>' for its flags.\n", g.name)
	printDoc(w, g.name)
}

// run dispatches to the subcommand named by args[0].
func (g *group) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		g.usage(stderr)
		return ErrUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		g.usage(stderr)
		return flag.ErrHelp
	}
	for _, c := range g.subs {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "idem %s: unknown subcommand %q\n\n", g.name, args[0])
	g.usage(stderr)
	return ErrUsage
}

// runHelp is `idem help [command [subcommand]]`: the help goes to stdout.
func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch len(args) {
	case 0:
		usage(stdout)
		return nil
	case 1, 2:
	default:
		fmt.Fprintf(stderr, "idem help: want at most a command and a subcommand, got %q\n", args)
		return ErrUsage
	}
	if args[0] == "help" {
		helpHelp(stdout)
		return nil
	}
	c, ok := lookup(args[0])
	if !ok {
		fmt.Fprintf(stderr, "idem: unknown command %q\n\n", args[0])
		usage(stderr)
		return ErrUsage
	}
	if len(args) == 2 {
		g, ok := groups[c.name]
		if !ok {
			fmt.Fprintf(stderr, "idem help: %s has no subcommands\n", c.name)
			return ErrUsage
		}
		if !g.has(args[1]) {
			fmt.Fprintf(stderr, "idem %s: unknown subcommand %q\n\n", g.name, args[1])
			g.usage(stderr)
			return ErrUsage
		}
	}
	// Each command prints its own help on -h; here it goes to stdout.
	err := c.run(ctx, append(args[1:], "-h"), stdout, stdout)
	if err == nil || err == flag.ErrHelp {
		return nil
	}
	return err
}

func (g *group) has(name string) bool {
	for _, c := range g.subs {
		if c.name == name {
			return true
		}
	}
	return false
}

// helpHelp is the help of idem help itself.
func helpHelp(w io.Writer) {
	fmt.Fprint(w, `Usage: idem help [<command> [<subcommand>]]

Prints the list of commands, or the full help of one command or
subcommand: its synopsis, what it does, every flag with its default,
examples and exit status. 'idem <command> -h' prints the same on stderr.

Flags:
  none
`)
	printDoc(w, "help")
}

// commandPaths lists every command and subcommand path, sorted.
func commandPaths() []string {
	paths := []string{"help"}
	for _, c := range commands {
		paths = append(paths, c.name)
		if g, ok := groups[c.name]; ok {
			for _, s := range g.subs {
				paths = append(paths, c.name+" "+s.name)
			}
		}
	}
	sort.Strings(paths)
	return paths
}
