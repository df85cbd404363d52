package mysql

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/store"
)

// The test server (no replicas, innodb_flush_log_at_trx_commit 1) is safe.
func TestCheckDurability(t *testing.T) {
	t.Parallel()
	s := openStore(t, newDatabase(t), nil)
	d, err := s.CheckDurability(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.Settings["innodb_flush_log_at_trx_commit"] != "1" || d.Replicas > 0 {
		t.Skipf("the test server is not as assumed: %v", d)
	}
	if d.State != store.DurabilitySafe {
		t.Errorf("report %v %q, want safe", d, d.Warnings)
	}
	// MariaDB has semi-synchronous replication built in, off here.
	if d.Settings["semi_sync_enabled"] != "OFF" || d.Settings["semi_sync_status"] != "OFF" {
		t.Errorf("semi-sync read as enabled %q, status %q; want OFF and OFF", d.Settings["semi_sync_enabled"], d.Settings["semi_sync_status"])
	}
}

// The verdict for each setup; replication cannot be set up on the shared
// test server.
func TestMySQLDurabilityVerdicts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name              string
		flush, syncBinlog int
		logBin, readOnly  bool
		semi              semiSync
		replicas          int
		want              store.DurabilityState
		warning           string
	}{
		{"alone", 1, 1, true, false, semiSync{}, 0, store.DurabilitySafe, ""},
		{"flush 0", 0, 1, false, false, semiSync{}, 0, store.DurabilityAtRisk, "innodb_flush_log_at_trx_commit is 0"},
		{"flush 2", 2, 1, false, false, semiSync{}, 0, store.DurabilitySafe, "innodb_flush_log_at_trx_commit is 2"},
		{"async replica", 1, 1, true, false, semiSync{"OFF", "OFF", "AFTER_SYNC"}, 1, store.DurabilityAtRisk, "semi-synchronous replication is not active"},
		{"semi-sync", 1, 1, true, false, semiSync{"ON", "ON", "AFTER_SYNC"}, 2, store.DurabilitySafe, ""},
		{"semi-sync after commit", 1, 1, true, false, semiSync{"ON", "ON", "AFTER_COMMIT"}, 1, store.DurabilitySafe, "AFTER_COMMIT"},
		{"replica", 1, 1, true, true, semiSync{}, 0, store.DurabilityAtRisk, "read-only"},
		{"sync_binlog 0", 1, 0, true, false, semiSync{}, 0, store.DurabilitySafe, "sync_binlog is 0"},
		{"replicas invisible", 1, 1, true, false, semiSync{}, -1, store.DurabilitySafe, "cannot see the replicas"},
		{"semi-sync fell back, replica attached", 1, 1, true, false, semiSync{"ON", "OFF", "AFTER_SYNC"}, 1,
			store.DurabilityAtRisk, "enabled but not active"},
		{"semi-sync fell back, no replica connected", 1, 1, true, false, semiSync{"ON", "OFF", "AFTER_SYNC"}, 0,
			store.DurabilityAtRisk, "enabled but not active"},
	} {
		d := mysqlDurability(c.flush, c.syncBinlog, c.logBin, c.readOnly, c.semi, c.replicas)
		w := strings.Join(d.Warnings, " | ")
		if d.State != c.want || (c.warning == "") != (w == "") || !strings.Contains(w, c.warning) {
			t.Errorf("%s: %v %q, want %s with %q", c.name, d.State, w, c.want, c.warning)
		}
	}
}
