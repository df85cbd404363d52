// Command skipsummary says in one line which tests were skipped for want
// of a server or a tool, and how to enable them: go test prints "ok" for a
// package whose tests all skipped. The tests record each skip's reason in
// the file that IDEM_TEST_SKIPS names (testenv.Skip); .ci/run, make test
// and make race set it around the README's test command and then run
//
//	go run ./internal/tools/skipsummary FILE
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

func main() {
	if len(os.Args) != 2 || strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprintln(os.Stderr, "usage: go run ./internal/tools/skipsummary FILE (the file IDEM_TEST_SKIPS named)")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipsummary:", err)
		os.Exit(2)
	}
	defer f.Close()
	fmt.Println(summary(f))
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
		return "skipsummary: no test was skipped for want of a server or a tool"
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
	return "skipsummary: skipped for want of a server or a tool, " + strings.Join(parts, "; ") +
		" (.ci/run starts every service and sets every variable)"
}
