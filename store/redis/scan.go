package redis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
)

// The background operations (sweep, reap, list) work in two phases because a
// script may touch one hash slot only and the indexes are sharded:
//
//  1. due.lua on every shard (one pipeline: one round trip per node) returns
//     up to Limit of the shard's lowest-scored index entries; the client
//     merges them and keeps the global Limit lowest.
//  2. one script per shard that holds a chosen entry (one pipeline again)
//     re-checks each record under the script's atomicity and changes it only
//     if it still qualifies.
//
// Phase 2 is the guard: two sweepers that picked the same candidates move
// each record once, and a record that changed since phase 1 is skipped.

type candidate struct {
	shard  int
	member string // the record key
	score  int64  // microseconds
}

type call struct {
	script *goredis.Script
	keys   []string
	args   []any
}

// batch runs the calls in one pipeline with EVALSHA, then reruns with EVAL
// (through Script.Run) any call that met a server without the script cached.
// A NOSCRIPT call did not run, so running it again is safe.
func (s *Store) batch(ctx context.Context, calls []call) ([]any, error) {
	pipe := s.client.Pipeline()
	cmds := make([]*goredis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	out := make([]any, len(calls))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = calls[i].script.Run(ctx, s.client, calls[i].keys, calls[i].args...).Result()
		}
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// candidates runs phase 1 over the named indexes of every shard and returns
// the limit lowest-scored entries (score <= now when due), lowest first.
func (s *Store) candidates(ctx context.Context, due bool, limit int, indexes ...int) ([]candidate, error) {
	calls := make([]call, shardCount)
	now := s.now()
	for sh := range shardCount {
		all := s.indexKeys(sh)
		keys := make([]string, len(indexes))
		for i, ix := range indexes {
			keys[i] = all[ix]
		}
		calls[sh] = call{scriptDue, keys, []any{now, flag(due), limit}}
	}
	replies, err := s.batch(ctx, calls)
	if err != nil {
		return nil, err
	}
	var out []candidate
	for sh, reply := range replies {
		lists, _ := reply.([]any)
		for _, l := range lists {
			entries, _ := l.([]any)
			for i := 0; i+1 < len(entries); i += 2 {
				member, _ := entries[i].(string)
				raw, _ := entries[i+1].(string)
				score, err := strconv.ParseFloat(raw, 64)
				if err != nil {
					return nil, fmt.Errorf("malformed index score %q: %w", raw, err)
				}
				out = append(out, candidate{shard: sh, member: member, score: int64(score)})
			}
		}
	}
	slices.SortFunc(out, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.score, b.score), cmp.Compare(a.member, b.member))
	})
	// One record can sit in two of the indexes read together (never in
	// practice: term and open are disjoint), so dedupe before cutting.
	out = slices.CompactFunc(out, func(a, b candidate) bool { return a.member == b.member })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// perShard builds one phase-2 call per shard holding candidates: KEYS are the
// shard's index keys followed by its records.
func (s *Store) perShard(cands []candidate, sc *goredis.Script, args []any) []call {
	byShard := map[int][]string{}
	var order []int
	for _, c := range cands {
		if _, ok := byShard[c.shard]; !ok {
			order = append(order, c.shard)
		}
		byShard[c.shard] = append(byShard[c.shard], c.member)
	}
	calls := make([]call, 0, len(order))
	for _, sh := range order {
		calls = append(calls, call{sc, append(s.indexKeys(sh), byShard[sh]...), args})
	}
	return calls
}

// SweepExpiredLeases implements store.Store. Only records under policy
// unknown are indexed for the sweeper, so records under retry or resume
// never fill its batch.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	if p.Limit <= 0 {
		return nil, invalid("sweep limit must be positive")
	}
	cands, err := s.candidates(ctx, true, p.Limit, idxLease)
	if err != nil {
		return nil, fmt.Errorf("idem/redis: sweep: %w", err)
	}
	replies, err := s.batch(ctx, s.perShard(cands, scriptSweep, []any{s.now(), s.graceMS()}))
	if err != nil {
		return nil, fmt.Errorf("idem/redis: sweep: %w", err)
	}
	var out []store.Record
	for _, reply := range replies {
		recs, _ := reply.([]any)
		for _, r := range recs {
			rec, err := decodeRecord(r)
			if err != nil {
				return nil, fmt.Errorf("idem/redis: sweep: %w", err)
			}
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b store.Record) int {
		return cmp.Or(a.LockedUntil.Compare(b.LockedUntil), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key))
	})
	return out, nil
}

// Reap implements store.Store.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	switch {
	case p.Limit <= 0:
		return store.ReapResult{}, invalid("reap limit must be positive")
	case p.Abandoned.Status == 0:
		return store.ReapResult{}, invalid("reap needs the abandoned response")
	case p.AbandonedTTL < 0:
		return store.ReapResult{}, invalid("negative abandoned ttl")
	}
	resp, err := responseArgs(&p.Abandoned)
	if err != nil {
		return store.ReapResult{}, err
	}
	cands, err := s.candidates(ctx, true, p.Limit, idxTerm, idxOpen)
	if err != nil {
		return store.ReapResult{}, fmt.Errorf("idem/redis: reap: %w", err)
	}
	args := append([]any{s.now(), s.graceMS(), flag(p.Soft), micros(p.AbandonedTTL)}, resp...)
	replies, err := s.batch(ctx, s.perShard(cands, scriptReap, args))
	if err != nil {
		return store.ReapResult{}, fmt.Errorf("idem/redis: reap: %w", err)
	}
	var res store.ReapResult
	for _, reply := range replies {
		counts, _ := reply.([]any)
		if len(counts) != 2 {
			return res, fmt.Errorf("idem/redis: reap: malformed reply %v", reply)
		}
		d, _ := counts[0].(int64)
		a, _ := counts[1].(int64)
		res.Deleted += int(d)
		res.Abandoned += int(a)
	}
	return res, nil
}

// ListUnknown implements store.Store. It reads without changing anything;
// a record whose state or schedule changed between the two phases is left
// out (the next call sees it as it is then).
func (s *Store) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	if p.Limit <= 0 {
		return nil, invalid("list limit must be positive")
	}
	cands, err := s.candidates(ctx, p.DueOnly, p.Limit, idxUnknown)
	if err != nil {
		return nil, fmt.Errorf("idem/redis: list unknown: %w", err)
	}
	pipe := s.client.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(cands))
	for i, c := range cands {
		cmds[i] = pipe.HGetAll(ctx, c.member)
	}
	if len(cands) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("idem/redis: list unknown: %w", err)
		}
	}
	out := make([]store.Record, 0, len(cands))
	for i, cmd := range cmds {
		rec, err := decodeRecord(pairs(cmd.Val()))
		if err == store.ErrNotFound {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("idem/redis: list unknown: %w", err)
		}
		if rec.State != store.StateUnknown || rec.ReconcileAfter.UnixMicro() != cands[i].score {
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// pairs turns a map back into the field/value list decodeRecord reads.
func pairs(m map[string]string) []any {
	out := make([]any, 0, 2*len(m))
	for k, v := range m {
		out = append(out, k, v)
	}
	return out
}
