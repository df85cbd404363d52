package store

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// DurabilityChecker is implemented by a store whose durability depends on
// how its database is configured (PostgreSQL, MySQL/MariaDB, Redis). An
// answer idem acknowledged is only as durable as the store's write of it:
// if a restart of the database, or a failover to a replica, loses that
// write, the key runs again on the next retry. The engine checks at start
// and periodically, logs what it finds, and can refuse to serve while the
// store says acknowledged writes are at risk (idem.Config.RequireDurable).
type DurabilityChecker interface {
	// CheckDurability reads the database's settings and replication
	// state. It returns an error only when it could not ask at all (the
	// database is unreachable); a database that refuses to tell (a
	// managed server with the commands disabled) gives DurabilityUnknown
	// with a warning saying so.
	CheckDurability(ctx context.Context) (Durability, error)
}

// Syncer is implemented by a store whose reads can see a write before it
// is as durable as the writes it acknowledges. PostgreSQL with a
// synchronous standby is one: a commit whose wait for the standby is
// cancelled (a driver's cancel request when a call's context ends,
// pg_cancel_backend, a backend terminated during the wait) becomes visible on the primary although the standby
// may not have it, and a failover then loses it. The engine calls Sync
// before it takes a read as proof that one of its own writes landed (a
// Complete whose answer was lost): an answer is acknowledged only once it
// survives what an acknowledged write survives.
type Syncer interface {
	// Sync returns nil once every write that the store's reads could see
	// when it was called is as durable as an acknowledged write, and an
	// error (retryable when it says nothing of the writes) when it cannot
	// tell: the standby did not confirm before ctx ended, say.
	Sync(ctx context.Context) error
}

// DurabilityState summarises a Durability.
type DurabilityState string

const (
	// DurabilitySafe: a write the store acknowledged survives a restart of
	// the database process and a failover to any replica it names (commits
	// wait for a standby, or there is none). Warnings may still name risks
	// of a machine crash (fsync settings).
	DurabilitySafe DurabilityState = "safe"
	// DurabilityAtRisk: an acknowledged write can be lost by a restart of
	// the database or a failover to a replica, and its key then runs again
	// on a retry. Warnings say why and how to fix it.
	DurabilityAtRisk DurabilityState = "at_risk"
	// DurabilityUnknown: the store could not find out (its commands are
	// disabled, or it was never reached).
	DurabilityUnknown DurabilityState = "unknown"
)

// Durability is a store's report on keeping acknowledged writes. It holds
// settings and counts only, never an address, user or password: it is fit
// for logs and metrics.
type Durability struct {
	State DurabilityState
	// Replicas is the number of replicas (standbys) seen attached to the
	// server; -1 when the store could not see them.
	Replicas int
	// Synchronous reports that writes wait for at least one replica before
	// they are acknowledged.
	Synchronous bool
	// Warnings are sentences for an operator: what can happen and how to
	// fix it. Empty when there is nothing to say.
	Warnings []string
	// Settings are the values the report was made from (setting name to
	// value), for the log.
	Settings map[string]string
}

// AtRisk reports whether acknowledged writes can be lost by a restart or a
// failover.
func (d Durability) AtRisk() bool { return d.State == DurabilityAtRisk }

// String is a one-line summary for logs: the state, the replicas and the
// settings, in a stable order.
func (d Durability) String() string {
	var b strings.Builder
	b.WriteString(string(d.State))
	b.WriteString(" replicas=")
	if d.Replicas < 0 {
		b.WriteString("unknown")
	} else {
		b.WriteString(strconv.Itoa(d.Replicas))
	}
	b.WriteString(" synchronous=")
	b.WriteString(strconv.FormatBool(d.Synchronous))
	for _, k := range slices.Sorted(maps.Keys(d.Settings)) {
		b.WriteString(" " + k + "=" + strconv.Quote(d.Settings[k]))
	}
	return b.String()
}

// Equal reports whether d and o say the same (for logging changes once).
func (d Durability) Equal(o Durability) bool {
	return d.String() == o.String() && strings.Join(d.Warnings, "\n") == strings.Join(o.Warnings, "\n")
}
