package postgres

import (
	"time"

	"github.com/idem-go/idem/internal/listsql"
	"github.com/idem-go/idem/store"
)

// ReserveReruns counts Reserve statements run again after a race (snapshot
// gap or lost transition), for tests that provoke those races.
func (s *Store) ReserveReruns() int64 { return s.reserveRe.Load() }

// Exported so the ceiling benchmark can run the store's own statements
// with no store code around them.
var (
	SQLReserve  = sqlReserve
	SQLComplete = sqlComplete
)

// The replay cache's lock and channel, for a test that plays another
// invalidation by hand.
var (
	SQLCacheLock    = sqlCacheLock
	SQLCacheChannel = sqlCacheChannel
)

// Filled is a statement of queries.go with its placeholders filled for the
// plain table of schema ("": the search_path's), without the tenant cap.
func Filled(sql, schema string) string { return placeholders(schema, false, false).Replace(sql) }

// BatchStats reports the calls that rode in pipelines of two or more and
// the pipelines a statement error rolled back.
func (s *Store) BatchStats() (batched, rolledBack int64) {
	return s.batch.group.Batched(), s.batch.rolledBack.Load()
}

// BatchQueue reports the free batch slots and the calls waiting for one.
func (s *Store) BatchQueue() (free, pending int) {
	return s.batch.group.Queue()
}

// BatchMany reports the multi-row statements (Reserve or Complete) sent.
func (s *Store) BatchMany() int64 { return s.batch.many.Load() }

// The multi-row statements, for the benchmark that compares them with the
// single ones.
var (
	SQLReserveMany  = sqlReserveMany
	SQLCompleteMany = sqlCompleteMany
)

// BatchStalls reports the extra batch slots opened for a queue that did
// not move.
func (s *Store) BatchStalls() int64 { return s.batch.group.Stalls() }

// HoldQueue turns the extra slots off, for tests that hold the only slot
// on purpose and queue calls behind it.
func (s *Store) HoldQueue() { s.batch.group.Unstall(0, 0) }

// Statements returns every statement of the store, by name, with its
// schema and Config.TenantCap filled in, for the tests of their plans.
func (s *Store) Statements() map[string]string {
	q, pq := s.q, s.pq()
	m := map[string]string{
		"reserve": q.reserve, "complete": q.complete, "release": q.release,
		"markUnknown": q.markUnknown, "checkpoint": q.checkpoint, "extend": q.extend,
		"get": q.get, "delete": q.delete, "sweep": q.sweep, "sweepLock": q.sweepLock,
		"reapDelete": q.reapDelete, "reapSoft": q.reapSoft, "reapAbandon": q.reapAbandon,
		"listUnknown": q.listUnknown, "resolve": q.resolve, "defer": q.deferQ,
		"deadLetter": q.deadLetter, "reserveMany": q.reserveMany, "completeMany": q.completeMany,
		"reserveCapped": q.reserveCapped, "active": q.active,
		"pendingInsert": pq.insert, "pendingPeek": pq.peek, "pendingLock": pq.lock,
		"pendingSet": pq.set, "pendingToUnknown": pq.toUnknown, "claim": pq.claim,
		"expirePending": pq.expire,
	}
	if s.partitioned() {
		m["keyLock"], m["keyLocks"] = q.keyLock, q.keyLocks
		m["reapDefault"], m["abandonDefault"] = q.reapDefault, q.abandonDefault
		m["reapAbandonIn"] = onPartition(q.reapAbandonIn, s.qualified("idem_records_default"))
	}
	return m
}

// ListSQL is the statement List runs for p, unqualified.
func ListSQL(p store.ListParams) string {
	q, _ := listsql.Build(listDialect, "idem_records", recordColumns, p)
	return q
}

// CacheNode names the store's replay cache in idem_cache_nodes and in its
// connection's application_name.
func (s *Store) CacheNode() string { return s.cache.node }

// SlowInvalidations makes the store's replay cache apply each
// invalidation d late.
func (s *Store) SlowInvalidations(d time.Duration) { s.cache.slow.Store(int64(d)) }

// The statements that open the pipelines run with sequential scans off,
// for the test that runs those statements after them.
var (
	SQLNoSeqScan        = sqlNoSeqScan
	SQLBatchLockTimeout = sqlBatchLockTimeout
)
