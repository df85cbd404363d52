package postgres

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/store"
)

// The verdict for each replication setup (what a primary with standbys
// reports cannot be set up on the shared test server; the fault test runs
// the real topologies).
func TestPGDurabilityVerdicts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                     string
		syncCommit, names, fsync string
		recovery                 bool
		replicas                 int
		want                     store.DurabilityState
		synchronous              bool
		warning                  string
	}{
		{"alone", "on", "", "on", false, 0, store.DurabilitySafe, false, ""},
		{"async standby", "on", "", "on", false, 1, store.DurabilityAtRisk, false, "commits do not wait"},
		{"sync standby", "on", "ANY 1 (*)", "on", false, 2, store.DurabilitySafe, true, ""},
		{"remote_apply", "remote_apply", "s1", "on", false, 1, store.DurabilitySafe, true, ""},
		{"local commits", "local", "s1", "on", false, 1, store.DurabilityAtRisk, false, "synchronous_commit is local"},
		{"off", "off", "s1", "on", false, 1, store.DurabilityAtRisk, false, "synchronous_commit is off"},
		{"sync named, none attached", "on", "s1", "on", false, 0, store.DurabilitySafe, true, "no standby is attached"},
		{"standby", "on", "", "on", true, 0, store.DurabilityAtRisk, false, "read replica"},
		{"fsync off", "on", "", "off", false, 0, store.DurabilitySafe, false, "fsync is off"},
	} {
		d := pgDurability(c.syncCommit, c.names, c.fsync, c.recovery, c.replicas)
		w := strings.Join(d.Warnings, " | ")
		if d.State != c.want || d.Synchronous != c.synchronous || (c.warning == "") != (w == "") || !strings.Contains(w, c.warning) {
			t.Errorf("%s: %v synchronous=%v %q, want %s synchronous=%v warning %q", c.name, d.State, d.Synchronous, w, c.want, c.synchronous, c.warning)
		}
	}
}
