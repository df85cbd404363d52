package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/idem-go/idem/store"
)

var _ store.DurabilityChecker = (*Store)(nil)

// durabilitySQL reads what decides whether a commit survives a failover:
// the session's synchronous_commit (the one the store's transactions run
// under), synchronous_standby_names, fsync, whether this server is a
// standby, and the standbys attached. Every role may read these; without
// pg_read_all_stats, pg_stat_replication shows a row per standby but hides
// its sync_state, so the verdict does not depend on that column.
const durabilitySQL = `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
	current_setting('fsync'), pg_is_in_recovery(), (SELECT count(*) FROM pg_stat_replication)`

// CheckDurability reports whether a commit the store acknowledged survives
// a crash of the server and a failover to one of its standbys:
//
//   - at risk when standbys are attached but commits do not wait for any
//     (synchronous_standby_names empty, or synchronous_commit local): a
//     failover to one of them can lose answers already acknowledged;
//   - at risk with synchronous_commit off: a crash of the server alone can
//     lose the last commits;
//   - at risk when the server is a standby (never point the store at a
//     read replica);
//   - safe otherwise, with warnings for fsync off (an operating-system
//     crash can lose commits), for synchronous standbys named while none
//     is attached (commits then wait until one connects), and while the
//     store's check says the standby stopped confirming commits (see
//     standbyWatch: replays wait for it).
func (s *Store) CheckDurability(ctx context.Context) (store.Durability, error) {
	var syncCommit, standbyNames, fsync string
	var inRecovery bool
	var replicas int
	if err := s.pool.QueryRow(ctx, durabilitySQL).Scan(&syncCommit, &standbyNames, &fsync, &inRecovery, &replicas); err != nil {
		return store.Durability{}, wrap(ctx, "check durability", err)
	}
	d := pgDurability(syncCommit, standbyNames, fsync, inRecovery, replicas)
	if d.Synchronous && !inRecovery {
		s.standby.start(s) // see standbyWatch; off with Config.StandbyCheck < 0
	}
	if s.standby.degraded() {
		d.Warnings = append(d.Warnings, "a synchronous standby has stopped confirming commits: "+
			"nothing commits, and completed records are not replayed, until it does (or synchronous_standby_names changes)")
	}
	return d, nil
}

// pgDurability is the verdict of CheckDurability on the values it read.
func pgDurability(syncCommit, standbyNames, fsync string, inRecovery bool, replicas int) store.Durability {
	d := store.Durability{State: store.DurabilitySafe, Replicas: replicas, Settings: map[string]string{
		"synchronous_commit": syncCommit, "synchronous_standby_names": standbyNames, "fsync": fsync,
	}}
	named := strings.TrimSpace(standbyNames) != ""
	waits := named && syncCommit != "off" && syncCommit != "local"
	d.Synchronous = waits
	if inRecovery {
		d.State = store.DurabilityAtRisk
		d.Warnings = append(d.Warnings, "the store is connected to a standby (a read replica): it cannot write, and what it reads lags the primary; "+
			"point idem at the primary, or list every host with target_session_attrs=read-write")
	}
	switch {
	case syncCommit == "off":
		d.State = store.DurabilityAtRisk
		d.Warnings = append(d.Warnings, "synchronous_commit is off: a crash of the PostgreSQL server can lose commits it already acknowledged, "+
			"so an answer a client received can be lost and its key run again; set synchronous_commit = on for idem's role or database")
	case replicas > 0 && !waits:
		d.State = store.DurabilityAtRisk
		why := "synchronous_standby_names is empty"
		if named {
			why = "synchronous_commit is " + syncCommit
		}
		d.Warnings = append(d.Warnings, fmt.Sprintf("%d standby(s) attached but commits do not wait for them (%s): "+
			"a failover to a standby can lose answers already acknowledged, and their keys run again on a retry; "+
			"set synchronous_standby_names (e.g. 'ANY 1 (*)') and synchronous_commit = on or remote_apply", replicas, why))
	case named && replicas == 0 && waits:
		d.Warnings = append(d.Warnings, "synchronous_standby_names is set but no standby is attached: every commit waits until one connects")
	}
	if fsync == "off" {
		d.Warnings = append(d.Warnings, "fsync is off: an operating-system crash or power loss can lose commits already acknowledged, or corrupt the database")
	}
	return d
}
