package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

// listScanCount is the COUNT hint of each SCAN step.
const listScanCount = 1000

// List implements store.Store by scanning the record keys: there is no
// index in creation order, so every call, each page included, costs a SCAN
// of the whole keyspace (of every master in a cluster) and an HMGET of four
// small fields per record, pipelined per SCAN step. It is meant for
// operators paging through records now and then, not for a request path:
// keeping a creation-order index instead would cost every Reserve a write
// to a sorted set, and a global one would break the one-slot-per-script
// rule of a cluster.
//
// The page is chosen from the four fields, then read whole; a record that
// changed in between so that it no longer matches is left out of the page.
func (s *Store) List(ctx context.Context, p store.ListParams) ([]store.Record, *store.Cursor, error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	var (
		mu    sync.Mutex
		cands []listCand
	)
	keep := func(c []listCand) {
		mu.Lock()
		defer mu.Unlock()
		cands = append(cands, c...)
		// Only the first Limit+1 in list order can be on the page.
		if len(cands) > 4*(p.Limit+1) {
			cands = sortCands(cands)
			cands = cands[:min(len(cands), p.Limit+1)]
		}
	}
	scan := func(ctx context.Context, c goredis.UniversalClient) error {
		return s.scanRecords(ctx, c, &p, keep)
	}
	var err error
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.client)
	}
	if err != nil {
		return nil, nil, wrap("list", err)
	}
	cands = sortCands(cands)
	cands = cands[:min(len(cands), p.Limit+1)]

	pipe := s.client.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(cands))
	for i, c := range cands {
		cmds[i] = pipe.HGetAll(ctx, c.member)
	}
	if len(cands) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, nil, wrap("list", err)
		}
	}
	out := make([]store.Record, 0, len(cands))
	for _, cmd := range cmds {
		rec, err := decodeRecord(pairs(cmd.Val()))
		if err == store.ErrNotFound {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("idem/redis: list: %w", err)
		}
		if storekit.Takes(&p, &rec) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b store.Record) int { return storekit.CompareList(store.CursorOf(&a), store.CursorOf(&b)) })
	// A record re-created between two SCAN steps was a candidate twice,
	// at two positions: it is read twice, alike.
	out = slices.CompactFunc(out, func(a, b store.Record) bool { return a.Scope == b.Scope && a.Key == b.Key })
	out, next := storekit.Page(out, p.Limit)
	return out, next, nil
}

type listCand struct {
	pos    store.Cursor
	member string
}

// sortCands puts c in list order and drops repeats: SCAN may return a key
// more than once (when the keyspace's table shrinks during the scan), and
// a repeat has the same position as its first.
func sortCands(c []listCand) []listCand {
	slices.SortFunc(c, func(a, b listCand) int { return storekit.CompareList(a.pos, b.pos) })
	return slices.CompactFunc(c, func(a, b listCand) bool { return a.member == b.member })
}

// scanRecords walks the record keys of one node and hands keep the ones
// that match p and lie after its cursor.
func (s *Store) scanRecords(ctx context.Context, c goredis.UniversalClient, p *store.ListParams, keep func([]listCand)) error {
	match := globEscape(s.cfg.Prefix) + "{*}r:*"
	var cursor uint64
	for {
		keys, nextCursor, err := c.ScanType(ctx, cursor, match, listScanCount, "hash").Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			pipe := c.Pipeline()
			cmds := make([]*goredis.SliceCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.HMGet(ctx, k, "s", "k", "st", "ca")
			}
			if _, err := pipe.Exec(ctx); err != nil && err != goredis.Nil {
				return err
			}
			var found []listCand
			for i, cmd := range cmds {
				v := cmd.Val()
				scope, _ := v[0].(string)
				key, _ := v[1].(string)
				st, _ := v[2].(string)
				ca, _ := v[3].(string)
				us, perr := strconv.ParseInt(ca, 10, 64)
				// A key of another prefix that the glob let through, or a
				// record gone since SCAN saw it, fails one of these.
				if st == "" || perr != nil || keys[i] != s.recordKey(scope, key) {
					continue
				}
				r := store.Record{Scope: scope, Key: key, State: store.State(st), CreatedAt: time.UnixMicro(us).UTC()}
				if storekit.Takes(p, &r) {
					found = append(found, listCand{pos: store.CursorOf(&r), member: keys[i]})
				}
			}
			keep(found)
		}
		if nextCursor == 0 {
			return nil
		}
		cursor = nextCursor
	}
}

// globEscape quotes the characters SCAN's MATCH pattern treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
