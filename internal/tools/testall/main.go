// Command testall runs every test of every module of the repository (go
// test over the directories go list -m names: the README's test command),
// then says in one line which tests were skipped for want of a server or a
// tool, and how to enable them: go test alone prints "ok" for a package
// whose tests all skipped.
//
//	go run ./internal/tools/testall [go test flags, e.g. -race]
//
// It exits with go test's status.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

func main() {
	// Every argument goes to go test (-race, -count=1, -run ...).
	for _, a := range os.Args[1:] {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprintln(os.Stderr, "usage: go run ./internal/tools/testall [go test flags, e.g. -race]")
			os.Exit(2)
		}
	}
	code, err := run(os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testall:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func run(testFlags []string, stdout, stderr io.Writer) (int, error) {
	dirs, err := exec.Command("go", "list", "-f", "{{.Dir}}/...", "-m").Output()
	if err != nil {
		return 0, fmt.Errorf("go list -m: %w", err)
	}
	skips, err := os.CreateTemp("", "idem-test-skips-")
	if err != nil {
		return 0, err
	}
	skips.Close()
	defer os.Remove(skips.Name())

	args := append(append([]string{"test"}, testFlags...), strings.Fields(string(dirs))...)
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Env = append(os.Environ(), testenv.SkipsEnv+"="+skips.Name())
	code := 0
	if err := cmd.Run(); err != nil {
		exit, ok := err.(*exec.ExitError)
		if !ok {
			return 0, err
		}
		code = exit.ExitCode()
	}
	f, err := os.Open(skips.Name())
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fmt.Fprintln(stdout, summary(f))
	return code, nil
}

// services names what a skip reason wants, by the variable or tool it
// names, and how to provide it.
var services = []struct{ mark, name string }{
	{testenv.PgbouncerEnv, `pgbouncer (eval "export $(.ci/pgbouncer)")`},
	{testenv.PostgresEnv, "PostgreSQL (set " + testenv.PostgresEnv + ")"},
	{testenv.MySQLEnv, "MariaDB (set " + testenv.MySQLEnv + ")"},
	{"IDEM_TEST_REDIS_CLUSTER", "a local Redis Cluster (set IDEM_TEST_REDIS_CLUSTER=1; needs redis-server and redis-cli)"},
	{testenv.RedisEnv, "Redis (set " + testenv.RedisEnv + ", host:port or host:port/DB)"},
}

// summary reads the skip reasons, one a line, and says in one line what
// was skipped and how to enable it.
func summary(r io.Reader) string {
	counts := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		why := strings.TrimSpace(sc.Text())
		if why == "" {
			continue
		}
		name, _, _ := strings.Cut(why, ": ")
		for _, s := range services {
			if strings.Contains(why, s.mark) {
				name = s.name
				break
			}
		}
		counts[name]++
	}
	if len(counts) == 0 {
		return "testall: no test was skipped for want of a server or a tool"
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		tests := "tests"
		if counts[n] == 1 {
			tests = "test"
		}
		parts[i] = fmt.Sprintf("%d %s: %s", counts[n], tests, n)
	}
	return "testall: skipped for want of a server or a tool, " + strings.Join(parts, "; ") +
		" (.ci/run starts every service and sets every variable)"
}
