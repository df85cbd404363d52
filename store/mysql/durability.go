package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem/store"
)

var _ store.DurabilityChecker = (*Store)(nil)

// The durability check's statements. Semi-synchronous replication is
// spelled master (MariaDB, MySQL before 8.0.26) or source (later MySQL);
// both rows are absent when its plugin is not loaded. The replicas are the
// binary log dump threads, which a user without the PROCESS privilege does
// not see.
const (
	durabilityVarsSQL = `SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, @@read_only`
	semiSyncSQL       = `SHOW GLOBAL STATUS WHERE Variable_name IN ('Rpl_semi_sync_master_status', 'Rpl_semi_sync_source_status')`
	waitPointSQL      = `SHOW GLOBAL VARIABLES WHERE Variable_name IN ('rpl_semi_sync_master_wait_point', 'rpl_semi_sync_source_wait_point')`
	semiEnabledSQL    = `SHOW GLOBAL VARIABLES WHERE Variable_name IN ('rpl_semi_sync_master_enabled', 'rpl_semi_sync_source_enabled')`
	replicasSQL       = `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'`
)

// CheckDurability reports whether a commit the store acknowledged survives
// a crash of the server and a failover to a replica:
//
//   - at risk with innodb_flush_log_at_trx_commit 0: a crash of the server
//     can lose the last second of commits;
//   - at risk when replicas are attached and semi-synchronous replication
//     is not active: a failover to a replica can lose acknowledged commits;
//   - at risk when semi-synchronous replication is enabled but not active,
//     whether replicas are attached or not: no replica acknowledged within
//     rpl_semi_sync_master_timeout (or none is connected), and the server
//     commits without one until one catches up;
//   - at risk when the server is read-only (a replica);
//   - safe otherwise, with warnings for innodb_flush_log_at_trx_commit 2
//     and sync_binlog other than 1 (an operating-system crash can lose
//     commits), and for semi-synchronous replication waiting after the
//     commit (AFTER_COMMIT: other sessions may read a commit no replica
//     has).
func (s *Store) CheckDurability(ctx context.Context) (store.Durability, error) {
	var flush, syncBinlog, logBin, readOnly int
	if err := s.q.QueryRowContext(ctx, durabilityVarsSQL).Scan(&flush, &syncBinlog, &logBin, &readOnly); err != nil {
		return store.Durability{}, wrap("check durability", err)
	}
	semi, err := s.showValue(ctx, semiSyncSQL)
	if err != nil {
		return store.Durability{}, wrap("check durability", err)
	}
	waitPoint, err := s.showValue(ctx, waitPointSQL)
	if err != nil {
		return store.Durability{}, wrap("check durability", err)
	}
	enabled, err := s.showValue(ctx, semiEnabledSQL)
	if err != nil {
		return store.Durability{}, wrap("check durability", err)
	}
	replicas := -1
	if err := s.q.QueryRowContext(ctx, replicasSQL).Scan(&replicas); err != nil {
		replicas = -1 // not visible to this user: the verdict cannot count them
	}
	return mysqlDurability(flush, syncBinlog, logBin == 1, readOnly == 1, semiSync{enabled, semi, waitPoint}, replicas), nil
}

// showValue returns the Value of the first row of a SHOW ... WHERE
// statement, "" when there is none.
func (s *Store) showValue(ctx context.Context, query string) (string, error) {
	var name, value string
	err := s.q.QueryRowContext(ctx, query).Scan(&name, &value)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return value, err
}

// semiSync is what the server says of semi-synchronous replication: the
// variable that enables it, its status, its wait point ("" when the
// plugin is not loaded).
type semiSync struct{ enabled, status, waitPoint string }

// mysqlDurability is the verdict of CheckDurability on the values it read.
func mysqlDurability(flush, syncBinlog int, logBin, readOnly bool, semi semiSync, replicas int) store.Durability {
	semiOn := strings.EqualFold(semi.status, "ON")
	d := store.Durability{State: store.DurabilitySafe, Replicas: replicas, Synchronous: semiOn, Settings: map[string]string{
		"innodb_flush_log_at_trx_commit": fmt.Sprint(flush), "sync_binlog": fmt.Sprint(syncBinlog),
		"log_bin": fmt.Sprint(logBin), "read_only": fmt.Sprint(readOnly), "semi_sync_status": semi.status,
	}}
	if semi.waitPoint != "" {
		d.Settings["semi_sync_wait_point"] = semi.waitPoint
	}
	if semi.enabled != "" {
		d.Settings["semi_sync_enabled"] = semi.enabled
	}
	atRisk := func(w string) {
		d.State = store.DurabilityAtRisk
		d.Warnings = append(d.Warnings, w)
	}
	if readOnly {
		atRisk("the server is read-only (a replica): point the store at the primary")
	}
	switch flush {
	case 0:
		atRisk("innodb_flush_log_at_trx_commit is 0: a crash of the server can lose about a second of commits it acknowledged, " +
			"and those keys run again on a retry; set it to 1")
	case 2:
		d.Warnings = append(d.Warnings, "innodb_flush_log_at_trx_commit is 2: an operating-system crash or power loss can lose "+
			"about a second of acknowledged commits; set it to 1")
	}
	if logBin && syncBinlog != 1 {
		d.Warnings = append(d.Warnings, fmt.Sprintf("sync_binlog is %d: an operating-system crash can lose binary log events of "+
			"acknowledged commits, which replicas then never receive; set it to 1", syncBinlog))
	}
	switch {
	case strings.EqualFold(semi.enabled, "ON") && !semiOn:
		atRisk("semi-synchronous replication is enabled but not active: no replica acknowledged a commit within " +
			"rpl_semi_sync_master_timeout (rpl_semi_sync_source_timeout), or none is connected, and the server now " +
			"commits without one: a failover to a replica can lose answers already acknowledged; bring a replica back " +
			"(and raise the timeout if commits should rather wait than go on alone)")
	case replicas > 0 && !semiOn:
		atRisk(fmt.Sprintf("%d replica(s) attached but commits do not wait for them (semi-synchronous replication is not active): "+
			"a failover to a replica can lose answers already acknowledged, and their keys run again on a retry; enable "+
			"rpl_semi_sync_master_enabled (rpl_semi_sync_source_enabled) with wait point AFTER_SYNC", replicas))
	case replicas < 0 && logBin && !semiOn:
		d.Warnings = append(d.Warnings, "the store's user cannot see the replicas (no PROCESS privilege) and semi-synchronous "+
			"replication is not active: if replicas attach, a failover to one can lose acknowledged commits")
	}
	if semiOn && strings.EqualFold(semi.waitPoint, "AFTER_COMMIT") {
		d.Warnings = append(d.Warnings, "semi-synchronous replication waits AFTER_COMMIT: other sessions can read a commit no "+
			"replica has yet, so a replay can serve an answer a failover then loses; use AFTER_SYNC")
	}
	return d
}
