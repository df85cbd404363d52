package redis

import (
	"cmp"
	"context"
	"fmt"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var _ store.Queue = (*Store)(nil)

// Asynchronous acceptance: the pending record is the queue. Each shard
// keeps two more indexes of its pending records, in the record's slot so
// that every script stays on one slot:
//
//	<prefix>{<shard>}i:pq:<queue>   pending records of a queue, by created_at (claims)
//	<prefix>{<shard>}i:pd           pending records, by claim deadline (expiry)
//
// ReservePending is one script, like Reserve. Claim and ExpirePending work
// in the two phases of the sweeper: a read of every shard's lowest entries,
// then one script per shard that re-checks each chosen record and moves it
// only if it still qualifies, so of two workers that picked one record,
// exactly one claims it.

var (
	scriptPendingReserve = loadScript("pending_reserve")
	scriptClaim          = loadScript("claim")
	scriptExpirePending  = loadScript("expire_pending")
)

func (s *Store) queueKey(shard int, queue string) string { return s.tag(shard) + "i:pq:" + queue }
func (s *Store) deadlineKey(shard int) string            { return s.tag(shard) + "i:pd" }

// decodePending decodes an HGETALL reply with the request it keeps.
func decodePending(v any) (store.Record, error) {
	r, err := decodeRecord(v)
	if err != nil {
		return r, err
	}
	pairs, _ := v.([]any)
	var queue, request string
	var has bool
	for i := 0; i+1 < len(pairs); i += 2 {
		switch k, _ := pairs[i].(string); k {
		case "q":
			queue, has = pairs[i+1].(string)
		case "rq":
			request, _ = pairs[i+1].(string)
		}
	}
	if has {
		r.Request, err = storekit.DecodeRequest(queue, []byte(request))
	}
	return r, err
}

// ReservePending implements store.Queue in one script. A positive
// MaxActive is refused with store.ErrCapUnsupported, as by Reserve.
func (s *Store) ReservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, fmt.Errorf("idem/redis: reserve pending: %w", err)
	}
	if err := s.refuseCap(&p.ReserveParams, "reserve pending"); err != nil {
		return store.ReserveResult{}, err
	}
	req, err := storekit.EncodeRequest(&p.Request)
	if err != nil {
		return store.ReserveResult{}, err
	}
	sh := shardOf(p.Scope, p.Key)
	keys := append(s.scriptKeys(p.Scope, p.Key), s.queueKey(sh, p.Request.Queue), s.deadlineKey(sh))
	v, err := s.eval(ctx, scriptPendingReserve, keys,
		s.now(), p.Scope, p.Key, p.Fingerprint, storekit.Micros(p.Lease), storekit.Micros(p.TTL),
		string(p.LeasePolicy), s.graceMS(), p.Request.Queue, req).Result()
	if err != nil {
		return store.ReserveResult{}, wrap("reserve pending", err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) != 2 {
		return store.ReserveResult{}, fmt.Errorf("idem/redis: reserve pending: malformed reply %v", v)
	}
	outcome, _ := reply[0].(int64)
	rec, err := decodePending(reply[1])
	if err != nil {
		return store.ReserveResult{}, fmt.Errorf("idem/redis: reserve pending: %w", err)
	}
	return store.ReserveResult{Outcome: store.ReserveOutcome(outcome), Record: rec}, nil
}

// decodeBatch decodes the records returned by the phase-2 scripts.
func decodeBatch(op string, replies []any) ([]store.Record, error) {
	var out []store.Record
	for _, reply := range replies {
		recs, _ := reply.([]any)
		for _, r := range recs {
			rec, err := decodePending(r)
			if err != nil {
				return nil, fmt.Errorf("idem/redis: %s: %w", op, err)
			}
			out = append(out, rec)
		}
	}
	return out, nil
}

// Claim implements store.Queue. A batch may claim fewer than Limit when
// another worker took some of its candidates, or when some passed their
// deadline (ExpirePending ends those).
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("idem/redis: claim: %w", err)
	}
	cands, err := s.candidatesIn(ctx, "", p.Limit, func(sh int) []string { return []string{s.queueKey(sh, p.Queue)} })
	if err != nil {
		return nil, wrap("claim", err)
	}
	args := []any{s.now(), s.graceMS(), storekit.Micros(p.Lease), p.Queue}
	// In a cluster the shards' calls go to several masters: the records
	// claimed by those that succeeded are returned with the failure of the
	// others (they are the caller's to run).
	replies, err := s.writes(ctx, s.shardCalls(cands, scriptClaim,
		func(sh int) []string { return []string{s.queueKey(sh, p.Queue), s.deadlineKey(sh)} },
		func(int) []any { return args }))
	out, derr := decodeBatch("claim", replies)
	storekit.SortRecords(out, storekit.ByCreated)
	return out, cmp.Or(derr, wrap("claim", err))
}

// ExpirePending implements store.Queue.
func (s *Store) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("idem/redis: expire pending: %w", err)
	}
	resp, err := responseArgs(&p.Response)
	if err != nil {
		return nil, err
	}
	cands, err := s.candidatesIn(ctx, "0", p.Limit, func(sh int) []string { return []string{s.deadlineKey(sh)} })
	if err != nil {
		return nil, wrap("expire pending", err)
	}
	now := s.now()
	replies, err := s.writes(ctx, s.shardCalls(cands, scriptExpirePending,
		func(sh int) []string { return []string{s.deadlineKey(sh)} },
		func(sh int) []any {
			return append([]any{now, s.graceMS(), storekit.Micros(p.TTL), s.tag(sh)}, resp...)
		}))
	out, derr := decodeBatch("expire pending", replies)
	storekit.SortRecords(out, storekit.ByDeadline)
	return out, cmp.Or(derr, wrap("expire pending", err))
}
