package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

func TestSummary(t *testing.T) {
	in := strings.Join([]string{
		"IDEM_TEST_POSTGRES_URL is not set (e.g. IDEM_TEST_POSTGRES_URL=\"postgres://...\"): skipping the tests that need this server",
		"IDEM_TEST_POSTGRES_URL is not set: the multi-process test needs PostgreSQL",
		"IDEM_TEST_REDIS_ADDR is not set (e.g. 127.0.0.1:6379)",
		"IDEM_TEST_PGBOUNCER_URL is not set (e.g. IDEM_TEST_PGBOUNCER_URL=\"postgres://postgres@127.0.0.1:6432/idem_tx?sslmode=disable\"): skipping",
		"stripe-mock is not installed (go install github.com/stripe/stripe-mock@v0.203.0)",
	}, "\n") + "\n"
	got := summary(strings.NewReader(in))
	for _, want := range []string{
		"2 tests: PostgreSQL (set IDEM_TEST_POSTGRES_URL)",
		"1 test: Redis (set IDEM_TEST_REDIS_ADDR",
		`1 test: pgbouncer (eval "export $(.ci/pgbouncer)")`,
		"1 test: stripe-mock is not installed (go install github.com/stripe/stripe-mock@v0.203.0)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "\n") {
		t.Errorf("summary is more than one line:\n%s", got)
	}
	if got := summary(strings.NewReader("")); !strings.Contains(got, "no test was skipped") {
		t.Errorf("summary of none: %s", got)
	}
}

// testenv.Skip writes its reason where SkipsEnv says, for the summary.
func TestSkipIsRecorded(t *testing.T) {
	t.Setenv("CI", "") // under CI=true Skip fails the test instead
	path := filepath.Join(t.TempDir(), "skips")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(testenv.SkipsEnv, path)
	t.Setenv(testenv.RedisEnv, "")
	t.Run("skipped", func(t *testing.T) { testenv.RedisAddr(t) })
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(strings.NewReader(string(b))); !strings.Contains(got, "1 test: Redis (set IDEM_TEST_REDIS_ADDR") {
		t.Errorf("recorded %q, summary %q", b, got)
	}
}
