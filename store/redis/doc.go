// Package redis is the idem store on Redis, single node or Redis Cluster,
// built on go-redis's UniversalClient so both share every line of code.
//
//	s, err := redis.Open(ctx, "redis://127.0.0.1:6379/0", redis.Config{})
//	s, err := redis.Open(ctx, "redis+cluster://10.0.0.1:6379,10.0.0.2:6379", redis.Config{})
//	s, err := redis.New(existingUniversalClient, redis.Config{Prefix: "payments:"})
//
// # Transitions
//
// Every state transition is one Lua script (lua/*.lua, run with EVALSHA and
// cached by the server), so each operation is atomic and costs one round
// trip: a new request is one Reserve and one Complete, a replay is one
// Reserve. Reserve decides every branch of store.Store.Reserve inside the
// script and returns the record.
//
// A transition is sent once, whatever the client's MaxRetries: when its
// connection breaks before the reply (or the server refuses it: loading,
// failing over, too few replicas), the caller gets a retryable failure and
// finds out whether it landed, as the engine does with a Get. A second run
// would meet the first one's result and answer for it (a Complete that
// landed reported as store.ErrLeaseLost). Reads are retried by the client
// as usual.
//
// # Time
//
// Without Config.Clock, scripts read the Redis server's clock
// (redis.call('TIME')); Redis 7 replicates scripts by their effects, so the
// time is read once, on the master, and replicas receive the resulting
// writes. In a cluster, each record's expiry is decided by the clock of the
// master that owns its slot: keep the nodes' clocks synchronised (NTP). With
// Config.Clock, the time is passed to every script as an argument.
//
// # Key layout
//
// The records are spread over 256 index shards by a hash of (scope, key).
// The shard number is the Redis hash tag, so a record and the indexes of its
// shard live in one hash slot:
//
//	<prefix>{<shard>}r:<len(scope)>:<scope><key>   the record (a hash)
//	<prefix>{<shard>}i:lease     in_progress under policy unknown, by locked_until (sweeper)
//	<prefix>{<shard>}i:unknown   unknown but not dead-lettered, by reconcile_after (reconciler)
//	<prefix>{<shard>}i:term      completed and failed_retryable, by expires_at (reaper: delete)
//	<prefix>{<shard>}i:open      unknown by expires_at, in_progress by the later of
//	                             expires_at and locked_until (reaper: abandon)
//	<prefix>{<shard>}i:dead      dead-lettered unknown, by reconcile_after (operators,
//	                             listed with i:unknown)
//
// Because a record and its index entries share a slot, the script that
// changes a record also updates its index entries, atomically: the indexes
// are never stale, in a cluster as on one node. The full (scope, key) follows
// the tag, so two records never share a key, and 256 slots spread the
// records over up to 256 masters (a slot is the unit Redis Cluster moves).
// The shard count is part of the layout: changing it would move every key.
//
// The background operations cannot run in one script, since the shards
// live in different slots. SweepExpiredLeases, Reap and ListUnknown work in
// two phases: a read-only script on every shard returns a small page of its
// lowest entries due (one pipeline, so one round trip per node; a second
// pipeline only to the shards whose page was full and might hide lower
// entries), the client keeps the Limit lowest overall, then one script per
// shard re-checks each chosen record and changes it only if it still
// qualifies. That re-check is the guard that
// lets several sweepers and reapers run at once: each record is moved once,
// and a record that changed in between is left alone. A sweep may do less
// than Limit when another instance took some of its candidates. Reap runs
// the two phases again past the candidates it left alone (taken by another
// instance, or in progress and spared by ReapParams.Grace), within a bound
// of rounds: see Store.Reap.
//
// # Memory
//
// Terminal records (completed, failed_retryable, soft-expired) carry a Redis
// TTL that ends Config.ExpiryGrace after their ExpiresAt, so their memory is
// freed even when no reaper runs. In-progress and unknown records never get
// a TTL: their outcome is still open and they must not vanish. When the TTL
// removes a record before a reaper does, its entry in the term index is left
// behind; Reap removes such entries, and so does every Reserve that creates a
// record (up to two entries of its shard per call), so the indexes stay
// bounded too. Run Redis with maxmemory-policy noeviction (or a volatile-*
// policy): an allkeys-* policy could evict an in-progress record and let a
// request execute twice.
//
// # Durability
//
// Redis acknowledges a write once it is in the master's memory. What that
// guarantees depends on the server's configuration, not on this package:
//
//   - Records survive the application: closing a client and opening a new
//     one (a process restart) sees every acknowledged record.
//   - A restart of the Redis server loses every record unless persistence is
//     on; only AOF with appendfsync always loses no acknowledged write
//     (appendfsync everysec can lose about a second of them; RDB snapshots
//     lose everything since the last snapshot). A lost in-progress or
//     completed record lets a retry execute the request again.
//   - Replication is asynchronous: a failover can lose writes the old master
//     acknowledged, in a cluster as with Sentinel. Config.WaitReplicas sends
//     WAIT behind every write of a record, in the same round trip, and fails
//     the write (retryable) when fewer replicas acknowledged it in time. That
//     narrows the window but does not close it: a write whose WAIT fell
//     short is still on the master, where every reader sees it, and a
//     failover may promote a replica that missed it. Store.Sync (see
//     store.Syncer) confirms such a write before the engine takes a read of
//     it as its own answer stored.
//
// Where a lost record would mean a double charge, prefer a SQL store, or
// Redis with AOF appendfsync always and no failover.
package redis
