package idem_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A service that uses only the engine and the PostgreSQL store gets
// neither gRPC, River, Prometheus, go-redis, the MySQL driver nor SQLite
// in its module graph, and keeps its go directive after go mod tidy. The
// test builds such a service as a module of its own next to the
// repository's modules and asks the go command.
func TestPostgresUserModuleGraph(t *testing.T) {
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
	dir := t.TempDir()
	const pseudo = "v0.0.0-00010101000000-000000000000"
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", `module example.com/payments

go 1.25.0

require (
	github.com/idem-go/idem `+pseudo+`
	github.com/idem-go/idem/store/postgres `+pseudo+`
)

replace (
	github.com/idem-go/idem => `+root+`
	github.com/idem-go/idem/store/postgres => `+filepath.Join(root, "store/postgres")+`
	github.com/idem-go/idem/internal/pgmigrate => `+filepath.Join(root, "internal/pgmigrate")+`
	github.com/idem-go/idem/internal/testdb => `+filepath.Join(root, "internal/testdb")+`
)
`)
	write("main.go", `package main

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
`)
	run := func(args ...string) string {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "tidy")
	all := run("list", "-m", "all")
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
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if v := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod); v == nil || string(v[1]) != "1.25.0" {
		t.Errorf("go mod tidy changed the go directive:\n%s", mod)
	}
	run("build", "./...")
}
