package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// On the test server (no standby): safe with the defaults, at risk when
// the store's sessions do not flush their commits (synchronous_commit off
// as a role or database setting would make it; here through the URL).
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		syncCommit string
		want       store.DurabilityState
		warning    string
	}{
		{"", store.DurabilitySafe, ""},
		{"local", store.DurabilitySafe, ""},
		{"off", store.DurabilityAtRisk, "synchronous_commit is off"},
	} {
		url := testURL(t)
		if c.syncCommit != "" {
			url = testenv.WithParam(t, url, "synchronous_commit", c.syncCommit)
		}
		s, err := postgres.Open(ctx, url, postgres.Config{SkipMigrate: true, MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		d, err := s.CheckDurability(ctx)
		s.Close()
		if err != nil {
			t.Fatalf("synchronous_commit=%q: %v", c.syncCommit, err)
		}
		if d.Replicas != 0 {
			t.Skipf("the test server has %d standbys attached: the verdicts below assume none", d.Replicas)
		}
		if d.State != c.want || !strings.Contains(strings.Join(d.Warnings, " "), c.warning) {
			t.Errorf("synchronous_commit=%q: %v %q, want %s with %q", c.syncCommit, d, d.Warnings, c.want, c.warning)
		}
	}
}
