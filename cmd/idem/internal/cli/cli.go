// Package cli holds the commands of the idem binary. cmd/idem only wires
// them to the process (arguments, signals, exit codes), so every command runs
// in tests exactly as it runs in production.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
)

// ErrUsage reports a malformed command line. The usage has already been
// printed; main exits with status 2.
var ErrUsage = errors.New("usage error")

// command is one subcommand of the binary.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the table of subcommands; a new command adds a line here.
var commands = []command{
	{"proxy", "put the idempotency engine in front of an HTTP API", runProxy},
	{"migrate", "apply the store's pending schema migrations", runMigrate},
	{"inspect", "print the record of one key and its stored answer (text or --json)", runInspect},
	{"delete", "delete the record of one key (operator cache-bust)", runDelete},
	{"keys", "list records by route, tenant, state or key, newest first (keys list)", runKeys},
	{"sweep", "move in-progress records whose lease expired to unknown, once", runSweep},
	{"reap", "delete expired records and close abandoned ones, once", runReap},
	{"reconcile", "list and settle records whose outcome is unknown (list, resolve, run)", runReconcile},
	{"outbox", "list dead-lettered outbox messages, show one, deliver one anew (dead, show, redeliver)", runOutbox},
	{"check", "run the idempotency checklist against any HTTP API (exit 1 on a failed check)", runCheck},
	{"bench", "load an API with duplicate keys; latency of executions, replays and 409s", runBench},
	{"demo", "show idem at work: a fake API, the proxy in front, a scripted tour", runDemo},
	{"version", "print the version, VCS commit and Go version of this binary", runVersion},
}

// helpSummary is the line of idem help in the list of commands; help is
// not in commands, which it reads.
const helpSummary = "print this list, or a command's full help (idem help reconcile resolve)"

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// Run runs the command named by args[0] with the rest of args (the program
// name is not part of args). It returns nil on success, an error wrapping
// ErrUsage for a malformed command line, or the command's failure. ctx ends
// the command: the proxy shuts down gracefully when it is cancelled.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return ErrUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		return runHelp(ctx, args[1:], stdout, stderr)
	case "-version", "--version":
		return runVersion(ctx, args[1:], stdout, stderr)
	}
	c, ok := lookup(args[0])
	if !ok {
		fmt.Fprintf(stderr, "idem: unknown command %q\n\n", args[0])
		usage(stderr)
		return ErrUsage
	}
	err := c.run(ctx, args[1:], stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// Main runs the binary: it runs args as Run does, prints a failure on
// stderr as "idem <command>: reason" (a usage error has been printed
// already, with the command's usage) and returns the exit status: 0 on
// success, 2 for a usage error (a malformed command line or configuration),
// 1 for any other failure.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := Run(ctx, args, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	}
	name := ""
	if len(args) > 0 {
		if _, ok := lookup(args[0]); ok {
			name = args[0]
		}
	}
	fmt.Fprintf(stderr, "%s%s\n", prefix(name), reason(name, err))
	return 1
}

// prefix is the start of every error line of the command name: "idem
// proxy: ", or "idem: " before a command is known.
func prefix(name string) string {
	if name == "" {
		return "idem: "
	}
	return "idem " + name + ": "
}

// reason is the text of err after the prefix of the command name: without
// the ErrUsage marker, and without the command's name when the error already
// starts with it (the prefix says it).
func reason(name string, err error) string {
	msg := strings.TrimPrefix(err.Error(), ErrUsage.Error()+": ")
	if name != "" {
		msg = strings.TrimPrefix(msg, name+": ")
	}
	return msg
}

func usage(w io.Writer) {
	fmt.Fprint(w, `idem puts idempotency keys in front of HTTP APIs. New here? Run: idem demo

Usage:
  idem <command> [flags] [arguments]
  idem help <command> [<subcommand>]   full help: flags, defaults, examples, exit status
  idem --version

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	fmt.Fprintf(tw, "  %s\t%s\n", "help", helpSummary)
	tw.Flush()
	fmt.Fprintf(w, `
Store DSNs (--store, the same meaning in every command; default %s):
  sqlite:PATH  memory:  postgres://user:pass@host:5432/db
  mysql://user:pass@host:3306/db  redis://host:6379/0
Keep passwords off the command line: --store-file PATH (its first line) or
$%s; likewise --cache-file and $%s for --cache.

Every flag may also be set in the environment: IDEM_ and its name in upper
case, - written _ (--max-body is IDEM_MAX_BODY); the command line wins.
`, storeurl.Default, storeurl.StoreEnv, storeurl.CacheEnv)
	fmt.Fprint(w, `
A request whose outcome is unknown (the proxy or the upstream died while
it ran) is never run again by a retry: retries get 409 until the record is
settled, by the proxy's reconciler (--resolve-url) or by an operator
(idem reconcile list, then idem reconcile resolve).
`)
}

// parse parses args with flags and positional arguments in any order
// ("inspect KEY --store X" as well as "inspect --store X KEY"); "--" ends
// the flags. A flag not on the command line then takes the value of its
// environment variable (envName), if set.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if err := applyEnv(fs); err != nil {
		return nil, usageErr(fs, "%v", err)
	}
	return pos, nil
}

// parseFlags is parse for a command that takes flags only: a positional
// argument is a usage error. It then settles dsns (dsnFlag.resolve).
func parseFlags(fs *flag.FlagSet, args []string, dsns ...*dsnFlag) error {
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr(fs, "unexpected argument %q", pos[0])
	}
	for _, d := range dsns {
		if err := d.resolve(fs); err != nil {
			return err
		}
	}
	return nil
}

func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	// flag prints its own errors to the output; flagError says them in
	// the words of every other error instead.
	out := fs.Output()
	defer fs.SetOutput(out)
	for {
		fs.SetOutput(io.Discard)
		err := fs.Parse(args)
		fs.SetOutput(out)
		if err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printHelp(fs.Output(), fs)
				return nil, err
			}
			return nil, usageErr(fs, "%s", flagError(fs, err))
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at a positional argument, which it leaves in rest, or
		// at "--", which it drops: everything after "--" is positional.
		if stop := len(args) - len(rest); stop > 0 && args[stop-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// refusedUsage prints why a command refused its configuration when err is
// an ErrUsage no flag parser printed (a check made once the flags were
// read), so exit status 2 never comes without a reason; err is returned.
func refusedUsage(w io.Writer, err error) error {
	if errors.Is(err, ErrUsage) {
		fmt.Fprintf(w, "%s%s\n", prefix("proxy"), reason("proxy", err))
	}
	return err
}

// configErr is an error of a configuration the command refuses once its
// flags are read (flags that exclude each other, a value out of range): a
// usage error, exit status 2, like a malformed command line.
func configErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUsage}, a...)...)
}

// usageErr prints msg and the command's usage and returns ErrUsage.
func usageErr(fs *flag.FlagSet, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintf(fs.Output(), "%s%s\n", prefix(fs.Name()), msg)
	printShortUsage(fs.Output(), fs)
	return fmt.Errorf("%w: %s", ErrUsage, msg)
}

// newLogger builds the process logger on stderr.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// byteSize is a flag holding a size in bytes: 1048576, 512KiB, 1MiB, 2MB.
type byteSize int64

// sizeOrOff is a byteSize that also takes 0: the feature off.
type sizeOrOff byteSize

func (z *sizeOrOff) String() string { return (*byteSize)(z).String() }

func (z *sizeOrOff) Set(s string) error {
	if strings.TrimSpace(s) == "0" {
		*z = 0
		return nil
	}
	return (*byteSize)(z).Set(s)
}

// String writes a size as a person writes it (1MiB, 64KiB), so help shows
// defaults that way; Set reads it back.
func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return errors.New("want a positive size in bytes, e.g. 1048576 or 1MiB")
	}
	*b = byteSize(n * mult)
	return nil
}

// listFlag is a comma-separated list flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	if len(*l) == 0 {
		return errors.New("empty list")
	}
	return nil
}

// optionalBool is a boolean flag that may be left to a default decided
// elsewhere (the profile): v is nil until it is set; "profile" unsets it.
type optionalBool struct{ v *bool }

func (b *optionalBool) String() string {
	if b == nil || b.v == nil {
		return "profile"
	}
	return strconv.FormatBool(*b.v)
}

func (b *optionalBool) Set(s string) error {
	if s == "profile" {
		b.v = nil
		return nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true, false or profile")
	}
	b.v = &v
	return nil
}

// IsBoolFlag lets the flag stand alone: --key-required means true.
func (b *optionalBool) IsBoolFlag() bool { return true }

// statusFlag is an HTTP status flag that check accepts; with zero set, 0
// (written as zero) leaves the status to a default decided elsewhere.
type statusFlag struct {
	n     int
	zero  string
	check func(int) error
}

func (f *statusFlag) String() string {
	if f == nil {
		return ""
	}
	if f.n == 0 && f.zero != "" {
		return f.zero
	}
	return strconv.Itoa(f.n)
}

func (f *statusFlag) Set(s string) error {
	if f.zero != "" && s == f.zero {
		f.n = 0
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("want an HTTP status such as 409")
	}
	if err := f.check(n); err != nil {
		return err
	}
	f.n = n
	return nil
}

// choiceFlag is a string flag that valid accepts (want says what is).
type choiceFlag struct {
	value string
	valid func(string) bool
	want  string
}

func (f *choiceFlag) String() string {
	if f == nil {
		return ""
	}
	return f.value
}

func (f *choiceFlag) Set(s string) error {
	if !f.valid(s) {
		return errors.New("want " + f.want)
	}
	f.value = s
	return nil
}

// sqliteMissing reports whether dsn names a plain SQLite file that does not
// exist, so that operator commands do not create an empty database by a typo.
func sqliteMissing(dsn string) (string, bool) {
	d, err := storeurl.Parse(dsn)
	if err != nil || d.Kind != storeurl.SQLite || d.Target == ":memory:" || strings.HasPrefix(d.Target, "file:") {
		return "", false
	}
	_, err = os.Stat(d.Target)
	return d.Target, errors.Is(err, os.ErrNotExist)
}

// sortedKeys returns the keys of m in order, for stable output.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
