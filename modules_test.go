package idem_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// pseudo is the version every module of the repository requires the others
// at; go.work (or a replace line) says where they are.
const pseudo = "v0.0.0-00010101000000-000000000000"

var moduleLine = regexp.MustCompile(`(?m)^module\s+(\S+)\s*$`)

// repoModule is a module of this repository: its path and directory.
type repoModule struct{ path, dir string }

// publicModules lists the modules a user requires: every go.mod of the
// repository outside internal/ and examples/, which are never tagged.
func publicModules(t *testing.T, root string) []repoModule {
	t.Helper()
	var out []repoModule
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != root || rel == "internal" || rel == "examples" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		m := moduleLine.FindSubmatch(b)
		if m == nil {
			return fmt.Errorf("%s names no module", p)
		}
		out = append(out, repoModule{path: string(m[1]), dir: filepath.Dir(p)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// consumer is a module outside the repository (its path is not under the
// repository's, so no internal package is within its reach) that resolves
// the repository's public modules from their directories and everything
// else from the local module cache, offline.
type consumer struct {
	t     *testing.T
	dir   string
	goBin string
}

// newConsumer writes go.mod (module example.com/consumer at goVersion,
// requiring the given public modules, with a replace line for every public
// module and none for any other), a go.sum gathered from the public
// modules' own, and files.
func newConsumer(t *testing.T, goVersion string, requires []string, files map[string]string) *consumer {
	t.Helper()
	if testing.Short() {
		t.Skip("runs go mod tidy")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	c := &consumer{t: t, dir: t.TempDir(), goBin: goBin}
	var mod strings.Builder
	mod.WriteString("module example.com/consumer\n\ngo " + goVersion + "\n\nrequire (\n")
	for _, r := range requires {
		mod.WriteString("\t" + r + " " + pseudo + "\n")
	}
	mod.WriteString(")\n\nreplace (\n")
	var sums []string
	for _, m := range publicModules(t, root) {
		mod.WriteString("\t" + m.path + " => " + m.dir + "\n")
		if b, err := os.ReadFile(filepath.Join(m.dir, "go.sum")); err == nil {
			sums = append(sums, strings.Split(strings.TrimSpace(string(b)), "\n")...)
		}
	}
	mod.WriteString(")\n")
	slices.Sort(sums)
	files["go.mod"] = mod.String()
	files["go.sum"] = strings.Join(slices.Compact(sums), "\n") + "\n"
	for name, text := range files {
		p := filepath.Join(c.dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// offlineMissing finds the modules the go command could not fetch with
// GOPROXY=off.
var offlineMissing = regexp.MustCompile(`(\S+?)@\S+: module lookup disabled by GOPROXY=off`)

// run runs the go command offline. A module of this repository that it
// cannot find fails the test (the consumer would need a replace line for
// a module that is never published); another module missing from the
// local module cache skips it, naming the module (under CI=true, fails it:
// the check was not made).
func (c *consumer) run(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(c.goBin, args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
	out, err := cmd.CombinedOutput()
	if err == nil {
		return string(out)
	}
	missing := offlineMissing.FindAllStringSubmatch(string(out), -1)
	for _, m := range missing {
		if !strings.HasPrefix(m[1], "github.com/idem-go/idem") {
			testenv.Skip(c.t, fmt.Sprintf("the local module cache lacks %s (fill it with `go mod download all` in the repository's modules): %s", m[1], out))
		}
	}
	// Loading the module graph, the go command names no module when the
	// cache lacks one's go.mod: that too is the cache, not the check.
	if len(missing) == 0 && strings.Contains(string(out), "module lookup disabled by GOPROXY=off") {
		testenv.Skip(c.t, fmt.Sprintf("the local module cache lacks a module the go command does not name (fill it with `go mod download all` in the repository's modules): %s", out))
	}
	c.t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	return ""
}

// A user of a published release needs no replace line: every store's
// module resolves, for a module of its own, from the public modules alone.
// The check replaces the public modules by their directories (what a
// release publishes) and nothing else, offline, and builds a service on
// the engine and the store; a requirement of a store on an internal
// module (a test helper, a migration runner) would fail the tidy.
func TestStoreConsumersResolve(t *testing.T) {
	for _, name := range []string{"sqlite", "postgres", "mysql", "redis", "cache"} {
		t.Run(name, func(t *testing.T) {
			pkg := "github.com/idem-go/idem/store/" + name
			c := newConsumer(t, "1.26.0", []string{"github.com/idem-go/idem", pkg}, map[string]string{
				"main.go": `package main

import (
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	impl "` + pkg + `"
)

var _ store.Store = (*impl.Store)(nil)

func main() { _, _ = idem.New(nil, idem.Config{}) }
`,
			})
			c.run("mod", "tidy")
			c.run("build", "./...")
			// The whole graph, test-only requirements of the store included:
			// go mod tidy and go build load only what the build imports.
			c.run("list", "-m", "all")
			mod, err := os.ReadFile(filepath.Join(c.dir, "go.mod"))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(mod), "github.com/idem-go/idem/internal") || strings.Contains(string(mod), "github.com/idem-go/idem/examples") {
				t.Errorf("the consumer of %s requires a module that is never published:\n%s", pkg, mod)
			}
		})
	}
}

// A service that uses only the engine and the PostgreSQL store gets
// neither gRPC, River, Prometheus, go-redis, the MySQL driver nor SQLite
// in its module graph, and keeps its go directive after go mod tidy.
func TestPostgresUserModuleGraph(t *testing.T) {
	c := newConsumer(t, "1.25.0", []string{"github.com/idem-go/idem", "github.com/idem-go/idem/store/postgres"}, map[string]string{
		"main.go": `package main

import (
	"context"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/postgres"
)

func main() {
	s, err := postgres.Open(context.Background(), "postgres://localhost/app", postgres.Config{})
	if err != nil {
		panic(err)
	}
	e, err := idem.New(s, idem.Config{})
	if err != nil {
		panic(err)
	}
	http.ListenAndServe(":8080", e.Middleware(http.NotFoundHandler()))
}
`,
	})
	c.run("mod", "tidy")
	all := c.run("list", "-m", "all")
	t.Logf("go list -m all:\n%s", all)
	for _, heavy := range []string{
		"google.golang.org/grpc", "github.com/riverqueue/", "github.com/prometheus/",
		"github.com/redis/go-redis", "github.com/go-sql-driver/mysql", "modernc.org/",
	} {
		if strings.Contains(all, heavy) {
			t.Errorf("the module graph of a PostgreSQL user holds %s:\n%s", heavy, all)
		}
	}
	if !strings.Contains(all, "github.com/jackc/pgx/v5 ") {
		t.Errorf("pgx missing from the graph: the check looks at the wrong thing:\n%s", all)
	}
	mod, err := os.ReadFile(filepath.Join(c.dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if v := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod); v == nil || string(v[1]) != "1.25.0" {
		t.Errorf("go mod tidy changed the go directive:\n%s", mod)
	}
	c.run("build", "./...")
}

// A store written outside this repository needs the contract (store) and
// the authors' kit (store/storekit) only, and the conformance suite to
// test it. The memory store is written that way: the check copies it into
// a module of its own, where no internal package of this repository is
// within reach, runs the conformance suite on it there, and asks the go
// command which of this repository's packages the store imports.
func TestStoreOutsideTheRepository(t *testing.T) {
	files := map[string]string{}
	srcs, err := filepath.Glob("store/memory/*.go")
	if err != nil || len(srcs) == 0 {
		t.Fatalf("the memory store's sources: %v", err)
	}
	for _, p := range srcs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = strings.ReplaceAll(string(b), `"github.com/idem-go/idem/store/memory"`, `"example.com/consumer"`)
	}
	c := newConsumer(t, "1.25.0", []string{"github.com/idem-go/idem"}, files)
	c.run("mod", "tidy")
	repo := func(format string) []string {
		var out []string
		for _, p := range strings.Fields(c.run("list", "-f", format, ".")) {
			if strings.HasPrefix(p, "github.com/idem-go/idem") && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
		slices.Sort(out)
		return out
	}
	if got, want := repo("{{join .Imports \" \"}}"), []string{"github.com/idem-go/idem/store", "github.com/idem-go/idem/store/storekit"}; !slices.Equal(got, want) {
		t.Errorf("the store imports %v of this repository, want %v", got, want)
	}
	if got, want := repo("{{join .TestImports \" \"}} {{join .XTestImports \" \"}}"), []string{"github.com/idem-go/idem/store", "github.com/idem-go/idem/store/storetest"}; !slices.Equal(got, want) {
		t.Errorf("the store's tests import %v of this repository, want %v", got, want)
	}
	out := c.run("test", "-count=1", "-run", "TestConformance", "-v", ".")
	if !strings.Contains(out, "--- PASS: TestConformance") {
		t.Errorf("the conformance suite did not pass on the store built outside:\n%s", out)
	}
}

// The test kits sit above the engine (internal/testkit imports it): product
// code importing one would point a store or the engine up into its own
// tests. Only tests, the kits themselves and the repository's test modules
// (internal/integration, internal/compat) import them.
func TestProductCodeImportsNoTestKit(t *testing.T) {
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (p == "internal" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && p != ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if strings.Contains(imp.Path.Value, "github.com/idem-go/idem/internal/testkit") {
				t.Errorf("%s imports %s", p, imp.Path.Value)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
