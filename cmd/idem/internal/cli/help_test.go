package cli

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// flagRecorder is an output that keeps the flag sets of the commands that
// write to it.
type flagRecorder struct {
	bytes.Buffer
	mu   sync.Mutex
	sets []*flag.FlagSet
}

func (r *flagRecorder) recordFlags(fs *flag.FlagSet) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, fs)
}

// TestHelpIsComplete walks every command and subcommand and checks its
// full help: a synopsis, a description, every flag the command defines
// (read from its flag set, not from the help), examples and exit status.
func TestHelpIsComplete(t *testing.T) {
	t.Parallel()
	paths := commandPaths()
	for _, want := range []string{"help", "version", "reconcile resolve", "inspect", "bench"} {
		if !slices.Contains(paths, want) {
			t.Errorf("commandPaths lacks %q: %q", want, paths)
		}
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			var out flagRecorder
			var errOut bytes.Buffer
			args := append([]string{"help"}, strings.Fields(path)...)
			if err := Run(context.Background(), args, &out, &errOut); err != nil {
				t.Fatalf("idem %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
			}
			text := out.String()
			if errOut.Len() > 0 {
				t.Errorf("help went to stderr: %s", errOut.String())
			}
			if !strings.HasPrefix(text, "Usage: idem "+path) {
				t.Errorf("no synopsis line:\n%s", text)
			}
			// The description: a paragraph between the synopsis and the
			// flags (or subcommands).
			m := regexp.MustCompile(`(?s)^Usage: [^\n]*\n(?:\s+[^\n]*\n)*\n(.+?)\n\n(Flags|Subcommands):`).FindStringSubmatch(text)
			if m == nil || len(strings.Fields(m[1])) < 8 {
				t.Errorf("no description of what the command does:\n%s", text)
			}
			if !strings.Contains(text, "\nExamples:\n  idem ") && !strings.Contains(text, "\nExamples:\n  # ") {
				t.Errorf("no examples:\n%s", text)
			}
			for _, line := range regexp.MustCompile(`(?m)^  idem [^\n]*`).FindAllString(text, -1) {
				if !strings.HasPrefix(line, "  idem "+path) && !(path == "help" || groups[path] != nil || path == "version") {
					t.Errorf("example %q does not run idem %s", line, path)
				}
			}
			if !strings.Contains(text, "\nExit status:\n  0  ") {
				t.Errorf("no exit status:\n%s", text)
			}
			if g := groups[path]; g != nil {
				for _, s := range g.subs {
					if !strings.Contains(text, "  "+s.name+" ") {
						t.Errorf("subcommand %s not listed:\n%s", s.name, text)
					}
				}
				return
			}
			out.mu.Lock()
			sets := out.sets
			out.mu.Unlock()
			if len(sets) != 1 && path != "help" {
				t.Fatalf("%d flag sets recorded, want 1", len(sets))
			}
			_, flagsPart, _ := strings.Cut(text, "\nFlags:\n")
			flagsPart, _, _ = strings.Cut(flagsPart, "\nExamples:\n")
			for _, fs := range sets {
				fs.VisitAll(func(f *flag.Flag) {
					if f.Usage == "" {
						t.Errorf("--%s has no usage text", f.Name)
					}
					entry := regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(f.Name) + `( [^\n]*)?\n\s+(.+)$`).FindStringSubmatch(flagsPart)
					if entry == nil {
						t.Errorf("help does not describe --%s:\n%s", f.Name, text)
						return
					}
					if !strings.Contains(entry[2], "(default: ") {
						t.Errorf("--%s: no default in %q", f.Name, entry[2])
					}
				})
			}
		})
	}
}

func TestHelpErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"help", "frobnicate"},
		{"help", "reconcile", "frobnicate"},
		{"help", "sweep", "list"},
		{"help", "reconcile", "list", "extra"},
	} {
		_, errOut, err := run(args...)
		if err != ErrUsage || errOut == "" {
			t.Errorf("%q: %v\n%s", args, err, errOut)
		}
	}
	// -h and a usage error print to stderr: the full help, and a pointer
	// to it.
	_, errOut, err := run("sweep", "-h")
	if err != nil || !strings.Contains(errOut, "Examples:") || !strings.Contains(errOut, "--batch") {
		t.Errorf("sweep -h: %v\n%s", err, errOut)
	}
	_, errOut, err = run("sweep", "--bogus")
	if err == nil || !strings.Contains(errOut, "idem sweep: unknown flag --bogus\n") || !strings.Contains(errOut, "Usage: idem sweep") ||
		!strings.Contains(errOut, "idem help sweep") {
		t.Errorf("sweep --bogus: %v\n%s", err, errOut)
	}
	out, _, err := run("--help")
	if err != nil || !strings.Contains(out, "idem help <command> [<subcommand>]") || !strings.Contains(out, "  version ") {
		t.Errorf("--help: %v\n%s", err, out)
	}
}

// TestReadmeListsEveryCommand keeps the command table of the proxy's page
// in step with the commands, and the README's install line in place.
func TestReadmeListsEveryCommand(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../../../docs/proxy.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range commands {
		if !strings.Contains(string(page), "| `idem "+c.name) {
			t.Errorf("docs/proxy.md's command table lacks idem %s", c.name)
		}
	}
	readme, err := os.ReadFile("../../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "go install github.com/idem-go/idem/cmd/idem@latest") {
		t.Error("README lacks the install line")
	}
}

// Sizes in help read as people write them, and read back as the same size.
func TestHelpSizesAsWritten(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if err := Run(context.Background(), []string{"help", "proxy"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(default: 1MiB)", "(default: 64MiB)", "(default: 64KiB)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("idem help proxy lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "1048576)") {
		t.Error("idem help proxy still prints a size in bytes")
	}
	for n, want := range map[int64]string{1 << 20: "1MiB", 3 << 10: "3KiB", 2 << 30: "2GiB", 1000: "1000", 1536: "1536", 1: "1"} {
		b := byteSize(n)
		if got := b.String(); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
		var back byteSize
		if err := back.Set(b.String()); err != nil || back != b {
			t.Errorf("Set(%q) = %d, %v; want %d", b.String(), back, err, n)
		}
	}
}

// Every --flag the docs name is a flag of some idem command (or of curl or
// git, which the docs' examples also use), so a renamed or removed flag
// cannot live on in the docs.
func TestDocsNameRealFlags(t *testing.T) {
	t.Parallel()
	known := map[string]bool{"version": true, "help": true}
	for _, path := range commandPaths() {
		var out flagRecorder
		if err := Run(context.Background(), append([]string{"help"}, strings.Fields(path)...), &out, &out); err != nil {
			t.Fatal(err)
		}
		for _, fs := range out.sets {
			fs.VisitAll(func(f *flag.Flag) { known[f.Name] = true })
		}
	}
	for _, other := range []string{"data-binary", "tags"} { // curl --data-binary, git push --tags
		known[other] = true
	}
	pages, err := filepath.Glob("../../../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	flagRef := regexp.MustCompile("(?:^|[\\s`(\\[])--([a-z][a-z0-9-]*[a-z0-9])")
	for _, page := range append(pages, "../../../../README.md") {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagRef.FindAllStringSubmatch(string(text), -1) {
			if !known[m[1]] {
				t.Errorf("%s names --%s, which no idem command has", filepath.Base(page), m[1])
			}
		}
	}
}
