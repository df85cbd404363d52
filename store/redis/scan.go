package redis

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
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
// A NOSCRIPT call did not run, so running it again is safe. Calls that
// change records are never resent by the client (see noReplay); read-only
// ones (changes false) are.
//
// It returns every call's reply, nil for those that failed, and the first
// failure: in a cluster the calls go to several masters, and those that
// succeeded made their changes whatever became of the others.
func (s *Store) batch(ctx context.Context, calls []call, changes bool) ([]any, error) {
	pipe := s.client.Pipeline()
	var on, again goredis.Scripter = pipe, s.client
	if changes {
		on, again = once{pipe}, once{s.client}
	}
	cmds := make([]*goredis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = c.script.EvalSha(ctx, on, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	out := make([]any, len(calls))
	var first error
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = calls[i].script.Run(ctx, again, calls[i].keys, calls[i].args...).Result()
		}
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		out[i] = v
	}
	return out, first
}

// writes runs calls that change records, as batch does. With
// Config.WaitReplicas each runs on its own through eval instead, which
// waits for the replicas of its master: a pipeline over several masters
// has no one connection whose writes a WAIT would count.
func (s *Store) writes(ctx context.Context, calls []call) ([]any, error) {
	if s.cfg.WaitReplicas <= 0 {
		return s.batch(ctx, calls, true)
	}
	out := make([]any, len(calls))
	var first error
	for i, c := range calls {
		v, err := s.eval(ctx, c.script, c.keys, c.args...).Result()
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		out[i] = v
	}
	return out, first
}

// candidates runs phase 1 over the named indexes of every shard and returns
// the limit lowest-scored entries (score <= now when due), lowest first.
//
// Fetching limit entries from each of the 256 shards would move up to
// 256*limit entries to use limit of them, so the first round asks every
// shard for a small page. Only a page that came back full can hide lower
// entries than the ones kept; a second round asks those shards alone for
// what lies between their last entry and the limit-th lowest score found
// (or for up to limit more, when fewer than limit were found).
//
// due is "" for every entry, else the lag (microseconds, as a string) behind
// now that an entry's score must not pass: "0" for what is due now.
func (s *Store) candidates(ctx context.Context, due string, limit int, indexes ...int) ([]candidate, error) {
	return s.candidatesIn(ctx, due, limit, func(sh int) []string {
		all := s.indexKeys(sh)
		keys := make([]string, len(indexes))
		for i, ix := range indexes {
			keys[i] = all[ix]
		}
		return keys
	})
}

// candidatesIn is candidates over the index keys keysOf returns for each
// shard (the same number for every shard).
func (s *Store) candidatesIn(ctx context.Context, due string, limit int, keysOf func(shard int) []string) ([]candidate, error) {
	return s.candidatesFrom(ctx, due, "-inf", limit, keysOf)
}

// candidatesFrom is candidatesIn over the entries scored from up (a
// ZRANGEBYSCORE bound: "-inf" or a number, included).
func (s *Store) candidatesFrom(ctx context.Context, due, from string, limit int, keysOf func(shard int) []string) ([]candidate, error) {
	now := s.now()
	page := min(limit, max(8, 2*((limit+shardCount-1)/shardCount)))
	nkeys := len(keysOf(0))
	indexes := make([]struct{}, nkeys)
	lists := make([]indexList, 0, shardCount*nkeys)
	calls := make([]call, shardCount)
	for sh := range shardCount {
		keys := keysOf(sh)
		args := []any{now, due, page, "+inf"}
		for _, k := range keys {
			args = append(args, from)
			lists = append(lists, indexList{shard: sh, key: k})
		}
		calls[sh] = call{scriptDue, keys, args}
	}
	replies, err := s.batch(ctx, calls, false)
	if err != nil {
		return nil, err
	}
	var found []candidate
	for sh, reply := range replies {
		parts, _ := reply.([]any)
		for i := range indexes {
			l := &lists[sh*len(indexes)+i]
			if i < len(parts) {
				if l.entries, err = parseEntries(sh, parts[i]); err != nil {
					return nil, err
				}
			}
			found = append(found, l.entries...)
		}
	}
	sortCandidates(found)

	bound := "+inf"
	if len(found) >= limit {
		bound = scoreArg(found[limit-1].score)
	}
	var again []call
	var againShards []int
	for _, l := range lists {
		if len(l.entries) < page {
			continue // the shard had nothing more
		}
		last := l.entries[len(l.entries)-1].score
		if len(found) >= limit && last > found[limit-1].score {
			continue // all it hides scores above what is kept
		}
		again = append(again, call{scriptDue, []string{l.key},
			[]any{now, due, limit, bound, scoreArg(last)}})
		againShards = append(againShards, l.shard)
	}
	if len(again) > 0 {
		replies, err := s.batch(ctx, again, false)
		if err != nil {
			return nil, err
		}
		for i, reply := range replies {
			parts, _ := reply.([]any)
			if len(parts) != 1 {
				return nil, fmt.Errorf("malformed index reply %v", reply)
			}
			entries, err := parseEntries(againShards[i], parts[0])
			if err != nil {
				return nil, err
			}
			found = append(found, entries...)
		}
		sortCandidates(found)
	}

	// The second round repeats entries that tie with a page's last score,
	// and a record can in principle change index between rounds: keep the
	// first (lowest) sighting of each record.
	seen := make(map[string]bool, len(found))
	out := found[:0]
	for _, c := range found {
		if !seen[c.member] {
			seen[c.member] = true
			out = append(out, c)
		}
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// indexList is what phase 1 read from one index of one shard.
type indexList struct {
	shard   int
	key     string
	entries []candidate
}

// parseEntries reads a ZRANGEBYSCORE WITHSCORES reply.
func parseEntries(shard int, reply any) ([]candidate, error) {
	flat, _ := reply.([]any)
	out := make([]candidate, 0, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		member, _ := flat[i].(string)
		raw, _ := flat[i+1].(string)
		// Scores are integral microseconds below 2^53, exact in a float64,
		// or +inf: a record dead-lettered by an earlier build, which kept
		// dead letters in the unknown index at that score (legacyDead).
		score, err := strconv.ParseFloat(raw, 64)
		if err != nil || math.IsInf(score, -1) || math.IsNaN(score) {
			return nil, fmt.Errorf("malformed index score %q", raw)
		}
		c := candidate{shard: shard, member: member, score: legacyDead}
		if !math.IsInf(score, 1) {
			c.score = int64(score)
		}
		out = append(out, c)
	}
	return out, nil
}

// legacyDead is the score of a record that an earlier build dead-lettered
// in the unknown index (+inf). The operator's listing shows it last; the
// next script that changes the record files it in the dead index.
const legacyDead = math.MaxInt64

// scoreArg is a score as a ZRANGEBYSCORE bound.
func scoreArg(score int64) string {
	if score == legacyDead {
		return "+inf"
	}
	return strconv.FormatInt(score, 10)
}

func sortCandidates(c []candidate) {
	slices.SortFunc(c, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.score, b.score), cmp.Compare(a.member, b.member))
	})
}

// shardCalls builds one phase-2 call per shard holding candidates: KEYS
// are the shard's index keys, then extra(shard), then its records.
func (s *Store) shardCalls(cands []candidate, sc *goredis.Script, extra func(shard int) []string, args func(shard int) []any) []call {
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
		keys := append(append(s.indexKeys(sh), extra(sh)...), byShard[sh]...)
		calls = append(calls, call{sc, keys, args(sh)})
	}
	return calls
}

// perShard builds one phase-2 call per shard holding candidates: KEYS are the
// shard's index keys followed by its records; every call takes args.
func (s *Store) perShard(cands []candidate, sc *goredis.Script, args []any) []call {
	return s.shardCalls(cands, sc, func(int) []string { return nil }, func(int) []any { return args })
}

// SweepExpiredLeases implements store.Store. Only records under policy
// unknown are indexed for the sweeper, so records under retry or resume
// never fill its batch.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	lag := strconv.FormatInt(storekit.Micros(p.Grace), 10)
	cands, err := s.candidates(ctx, lag, p.Limit, idxLease)
	if err != nil {
		return nil, wrap("sweep", err)
	}
	// The records of the calls that succeeded are moved, and returned
	// with the failure of the others.
	replies, err := s.writes(ctx, s.perShard(cands, scriptSweep, []any{s.now(), s.graceMS(), lag}))
	var out []store.Record
	for _, reply := range replies {
		recs, _ := reply.([]any)
		for _, r := range recs {
			rec, derr := decodeRecord(r)
			if derr != nil {
				return out, fmt.Errorf("idem/redis: sweep: %w", derr)
			}
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b store.Record) int {
		return cmp.Or(a.LockedUntil.Compare(b.LockedUntil), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key))
	})
	return out, wrap("sweep", err)
}

// reapRounds bounds the rounds of the two phases that one Reap call runs.
const reapRounds = 8

// Reap implements store.Store. Some candidates are left as they are by the
// second phase: an in_progress record past its expiry whose lease ended
// within p.Grace is due in the open index but spared, and another reaper
// may have changed a record first. They take no place in the batch: while
// the call has changed fewer than p.Limit records and the indexes hold due
// entries it has not considered, it runs the two phases again, for what is
// left of p.Limit, over the entries from the last one it considered on.
// It runs at most reapRounds rounds, so one call steps over up to
// (reapRounds-1)*p.Limit spared records before it comes back short, and
// reads a bounded part of the indexes however many of them are due. Spared
// records are few (requests running past their expiry whose lease ended
// within the grace), and they are reapable once the grace has passed.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReapResult{}, err
	}
	resp, err := responseArgs(&p.Abandoned)
	if err != nil {
		return store.ReapResult{}, err
	}
	keysOf := func(sh int) []string {
		all := s.indexKeys(sh)
		return []string{all[idxTerm], all[idxOpen]}
	}
	var res store.ReapResult
	// The candidates considered by this call, with their scores then: a
	// record is changed at most once per call, so a record abandoned with
	// a short AbandonedTTL, due again in the term index, is not deleted by
	// the call that abandoned it.
	seen := make(map[string]int64)
	from, ties := "-inf", 0
	for range reapRounds {
		want := p.Limit - res.Deleted - res.Abandoned
		// The entries this call considered at the score the round starts
		// from are read again, and a record it abandoned may be due again
		// in the term index: ask for that many more, so that want of the
		// entries read are new when the indexes hold that many.
		ask := want + ties + res.Abandoned
		cands, err := s.candidatesFrom(ctx, "0", from, ask, keysOf)
		if err != nil {
			return res, wrap("reap", err)
		}
		fresh := make([]candidate, 0, want)
		for _, c := range cands {
			if _, ok := seen[c.member]; !ok && len(fresh) < want {
				fresh = append(fresh, c)
			}
		}
		if len(fresh) == 0 {
			break
		}
		for _, c := range fresh {
			seen[c.member] = c.score
		}
		if err := s.reapRecords(ctx, fresh, &p, resp, &res); err != nil {
			return res, err
		}
		if res.Deleted+res.Abandoned >= p.Limit || len(cands) < ask {
			break // the batch is full, or no due entry is left after these
		}
		last := fresh[len(fresh)-1].score
		from, ties = scoreArg(last), 0
		for _, score := range seen {
			if score == last {
				ties++
			}
		}
	}
	return res, nil
}

// reapRecords runs the second phase of Reap over cands and adds what it
// changed to res. The records of the calls that succeeded are changed, and
// counted with the failure of the others.
func (s *Store) reapRecords(ctx context.Context, cands []candidate, p *store.ReapParams, resp []any, res *store.ReapResult) error {
	args := append([]any{s.now(), s.graceMS(), flag(p.Soft), storekit.Micros(p.AbandonedTTL), storekit.Micros(p.Grace)}, resp...)
	replies, err := s.writes(ctx, s.perShard(cands, scriptReap, args))
	for _, reply := range replies {
		if reply == nil {
			continue // its call failed (err)
		}
		counts, _ := reply.([]any)
		if len(counts) != 2 {
			return fmt.Errorf("idem/redis: reap: malformed reply %v", reply)
		}
		d, _ := counts[0].(int64)
		a, _ := counts[1].(int64)
		res.Deleted += int(d)
		res.Abandoned += int(a)
	}
	return wrap("reap", err)
}

// ListUnknown implements store.Store. It reads without changing anything;
// a record whose state or schedule changed between the two phases is left
// out (the next call sees it as it is then). Dead-lettered records have an
// index of their own, which only the listing of every unknown record reads,
// merged with the others by reconcile_after.
func (s *Store) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	due, indexes := "", []int{idxUnknown, idxDead}
	if p.DueOnly {
		due, indexes = "0", indexes[:1]
	}
	cands, err := s.candidates(ctx, due, p.Limit, indexes...)
	if err != nil {
		return nil, wrap("list unknown", err)
	}
	pipe := s.client.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(cands))
	for i, c := range cands {
		cmds[i] = pipe.HGetAll(ctx, c.member)
	}
	if len(cands) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, wrap("list unknown", err)
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
		indexed := rec.ReconcileAfter.UnixMicro() == cands[i].score || cands[i].score == legacyDead && rec.DeadLettered()
		if rec.State != store.StateUnknown || !indexed || (p.DueOnly && rec.DeadLettered()) {
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
