package maintenance

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// ExpirePendingOnce ends the asynchronous requests that no worker claimed
// before their deadline (the engine's AsyncWait): each becomes completed
// with idem.PendingTimeout (408), replayed to the client's retries and
// status reads for TTL, batch after batch. It returns how many it ended
// (counted as the event pending_expired). A store that keeps no pending
// requests (store.AsQueue) has none: 0.
func (m *Maintainer) ExpirePendingOnce(ctx context.Context) (int, error) {
	q, _ := store.AsQueue(m.store)
	if q == nil {
		return 0, nil
	}
	total := 0
	err := m.pass(ctx, func(ctx context.Context) (bool, error) {
		var recs []store.Record
		err := m.call(ctx, opExpirePending, func(ctx context.Context) (err error) {
			recs, err = q.ExpirePending(ctx, store.ExpirePendingParams{
				Limit: m.cfg.BatchSize, Response: idem.PendingTimeout(), TTL: m.cfg.TTL,
			})
			return err
		})
		// Records ended before a failure come with it (store.Queue).
		for _, r := range recs {
			m.cfg.Logger.Warn("idem: asynchronous request not claimed in time; ended with a timeout answer",
				"scope", r.Scope, "key", r.Key, "deadline", r.LockedUntil)
		}
		total += len(recs)
		m.obs.count(ctx, "pending_expired", len(recs))
		return err == nil && len(recs) == m.cfg.BatchSize, err
	})
	return total, err
}
