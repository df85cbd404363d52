package postgres

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/idem-go/idem/store"
)

// The replay cache (Config.ReplayCache): completed records in memory, so
// that a replay costs no round trip.
//
// A completed record changes only when an operator deletes it, a
// settlement rewrites it, or it expires. Expiry is checked at every answer
// (with cacheExpiryMargin, for the distance between this process's clock
// and the database's). Deletes and settlements go through Delete and
// Resolve of any store on the schema, which notify every cache and wait
// until each one still alive has applied the notification (invalidate);
// a cache answers only while it knows it receives them (serving).
//
// Each cache holds a connection of its own that LISTENs, and registers in
// idem_cache_nodes: alive_until is renewed every cacheRenew while that
// connection works, and the cache answers from memory only until the
// instant its last renewal was sent plus cacheLease minus cacheMargin:
// before the database's alive_until, after which invalidate stops waiting
// for it. A cache that lost its connection, or whose renewals stalled past
// that instant, therefore stops answering before anyone stops waiting for
// it, and empties itself before it answers again.
const (
	cacheLease  = 3 * time.Second
	cacheRenew  = time.Second
	cacheMargin = 500 * time.Millisecond
	// cacheExpiryMargin: a cached record is answered only until this
	// long before its expiry, so that a process clock a little ahead of
	// the database's never replays what the database calls expired.
	cacheExpiryMargin = time.Second
)

// replayCache is the memory and its listener.
type replayCache struct {
	s      *Store
	node   string
	budget int64
	log    *slog.Logger

	mu    sync.Mutex
	byKey map[cacheID]*list.Element
	lru   list.List // front: most recently used
	bytes int64
	// epoch counts the invalidations applied: a record read from the
	// database before one was applied may be the old one, and is not kept.
	epoch uint64

	validUntil atomic.Int64 // UnixNano (monotonic base below); 0: not serving
	// skew is how far the database's clock may be ahead of this
	// process's, at the last renewal (ns; see measureSkew).
	skew atomic.Int64
	// slow delays each invalidation before it is applied (tests: a
	// process that is slow to apply must still be waited for).
	slow atomic.Int64
	hits atomic.Int64
	stop context.CancelFunc
	done chan struct{}
}

type cacheEntry struct {
	rec  store.Record
	size int64
}

// base anchors validUntil to the monotonic clock.
var base = time.Now()

func monoNow() int64 { return int64(time.Since(base)) }

// cacheID names a record in the cache: a pair, so that a lookup builds no
// string.
type cacheID struct{ scope, key string }

// recordSize estimates the memory a record holds in the cache: its bytes,
// and the structures around them, which outweigh the bytes of a usual
// answer (a header or two, a short body): the entry with its list element
// and map slot, the response, and the header's map with its slots.
func recordSize(r *store.Record) int64 {
	n := int64(len(r.Scope)+len(r.Key)+len(r.Fingerprint)+len(r.Response.Body)+len(r.LastError)+len(r.RecoveryPoint)) + 600
	if r.Response.Header != nil {
		n += 400 // the map and its first group of slots
	}
	for k, vs := range r.Response.Header {
		n += int64(len(k)) + 48
		for _, v := range vs {
			n += int64(len(v)) + 24
		}
	}
	return n
}

// lookup returns the record cached for a Reserve of p, when the cache may
// answer it: serving, completed, same fingerprint, not about to expire.
// On a miss, epoch is the one to pass to keep with the record the caller
// then reads from the database (read under the same lock, so that a miss
// costs one acquisition).
func (c *replayCache) lookup(p *store.ReserveParams, now time.Time) (_ store.Record, epoch uint64, ok bool) {
	serving := monoNow() < c.validUntil.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !serving {
		return store.Record{}, c.epoch, false
	}
	el, ok := c.byKey[cacheID{p.Scope, p.Key}]
	if !ok {
		return store.Record{}, c.epoch, false
	}
	e := el.Value.(*cacheEntry)
	now = now.Add(time.Duration(c.skew.Load()))
	if e.rec.Fingerprint != p.Fingerprint || !now.Add(cacheExpiryMargin).Before(e.rec.ExpiresAt) {
		return store.Record{}, c.epoch, false
	}
	c.lru.MoveToFront(el)
	c.hits.Add(1)
	return e.rec, c.epoch, true
}

// keep caches rec, read from the database when the cache's epoch was
// epoch, unless an invalidation was applied since (it may be the old
// record) or rec is not a completed answer.
func (c *replayCache) keep(rec *store.Record, epoch uint64) {
	if rec.State != store.StateCompleted || rec.Request != nil {
		return
	}
	e := &cacheEntry{rec: *rec, size: recordSize(rec)}
	id := cacheID{rec.Scope, rec.Key}
	if e.size > c.budget {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch != epoch {
		return
	}
	if old, ok := c.byKey[id]; ok {
		c.remove(old)
	}
	c.byKey[id] = c.lru.PushFront(e)
	c.bytes += e.size
	for c.bytes > c.budget {
		c.remove(c.lru.Back())
	}
}

// remove drops an entry; c.mu is held.
func (c *replayCache) remove(el *list.Element) {
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.byKey, cacheID{e.rec.Scope, e.rec.Key})
	c.bytes -= e.size
}

// evict applies one invalidation: the record of id, or everything when
// all is set.
func (c *replayCache) evict(id cacheID, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	if all {
		c.byKey = map[cacheID]*list.Element{}
		c.lru.Init()
		c.bytes = 0
		return
	}
	if el, ok := c.byKey[id]; ok {
		c.remove(el)
	}
}

// newNodeID names this cache in idem_cache_nodes.
func newNodeID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// startCache starts the listener of a store with Config.ReplayCache and
// waits for its first registration, so that the store answers from memory
// only once invalidations reach it.
func (s *Store) startCache(ctx context.Context) error {
	cfg := s.pool.Config().ConnConfig.Copy()
	if s.cfg.ListenURL != "" {
		lc, err := pgx.ParseConfig(s.cfg.ListenURL)
		if err != nil {
			return fmt.Errorf("idem/postgres: ListenURL: %w", err)
		}
		cfg = lc
	}
	if s.cfg.Schema == "" {
		// The statements name the tables through the search_path, which
		// the pool's connections may set for themselves (AfterConnect, a
		// role's setting): the listening connection, which has none of
		// those, uses the schema the pool resolves.
		var schema *string
		if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
			return wrap(ctx, "replay cache", err)
		}
		if schema != nil {
			cfg.RuntimeParams["search_path"] = pgx.Identifier{*schema}.Sanitize()
		}
	}
	c := &replayCache{s: s, node: newNodeID(), budget: s.cfg.ReplayCache, log: slog.Default(),
		byKey: map[cacheID]*list.Element{}, done: make(chan struct{})}
	// pgx's default reaction to a context's end, whatever the pool's: the
	// wait for notifications ends by its context every cacheRenew, with a
	// server that has nothing to stop. A pool given to New with
	// pgconn.CancelRequestContextWatcherHandler would make each of those
	// waits send a cancel request and last its DeadlineDelay longer, and
	// renewals that late let the registration lapse.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	// Named, so that an operator tells it from the pool's connections.
	cfg.RuntimeParams["application_name"] = "idem replay cache " + c.node
	conn, err := c.connect(ctx, cfg)
	if err != nil {
		return err
	}
	lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	s.cache = c
	go c.listen(lctx, cfg, conn)
	return nil
}

// errListenPooler: LISTEN needs a session of its own, which a pooler in
// transaction mode does not give.
var errListenPooler = errors.New("idem/postgres: ReplayCache: the listening connection reaches PostgreSQL " +
	"through a pooler, where LISTEN does not hold; set Config.ListenURL to a direct connection " +
	"(or leave ReplayCache at 0)")

// connect opens the listening connection, LISTENs on the schema's channel
// and registers the cache (which then serves).
func (c *replayCache) connect(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, wrap(ctx, "replay cache", err)
	}
	if err := c.register(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

func (c *replayCache) register(ctx context.Context, conn *pgx.Conn) error {
	pooled, err := behindPooler(ctx, conn)
	switch {
	case err != nil:
		return wrap(ctx, "replay cache", err)
	case pooled:
		return errListenPooler
	}
	var channel string
	if err := conn.QueryRow(ctx, sqlCacheChannel, c.s.cfg.Schema).Scan(&channel); err != nil {
		return wrap(ctx, "replay cache", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return wrap(ctx, "replay cache", err)
	}
	// Registered after LISTEN holds, under the lock that orders
	// invalidations: every one numbered up to seen has committed (its
	// change before it), and the cache is emptied after that, so a record
	// kept from now on was read after each of them. Those committed since
	// LISTEN also arrive, and evict again.
	sent, wall := monoNow(), time.Now()
	var dbNow time.Time
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, c.s.q.cacheLock); err != nil {
			return err
		}
		return tx.QueryRow(ctx, c.s.q.cacheRegister, c.node, cacheLease.Microseconds()).Scan(&dbNow)
	})
	if err != nil {
		return wrap(ctx, "replay cache", err)
	}
	c.measureSkew(wall, dbNow)
	c.evict(cacheID{}, true)
	c.validUntil.Store(sent + int64(cacheLease-cacheMargin))
	return nil
}

// errUnregistered: a renewal found no registration of this cache (removed
// by another node's registration after this one stalled for an hour):
// invalidations no longer wait for it, so it must not serve.
var errUnregistered = errors.New("the cache's registration is gone")

// listen applies invalidations and renews the registration until stopped;
// on a broken connection it stops serving, and connects again.
func (c *replayCache) listen(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn) {
	defer close(c.done)
	var seen int64
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = c.connect(ctx, cfg); err != nil {
				c.log.Warn("idem/postgres: replay cache: reconnecting", "err", err)
				sleepCtx(ctx, cacheRenew)
				continue
			}
		}
		wctx, cancel := context.WithTimeout(ctx, cacheRenew)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if d := c.slow.Load(); d > 0 {
				sleepCtx(ctx, time.Duration(d))
			}
			seen = max(seen, c.apply(n.Payload))
		case ctx.Err() != nil:
		case !errors.Is(err, context.DeadlineExceeded):
			conn = c.lost(conn, err)
			continue
		}
		if ctx.Err() != nil {
			break
		}
		sent, wall := monoNow(), time.Now()
		var dbNow time.Time
		err = conn.QueryRow(ctx, c.s.q.cacheRenew, c.node, seen, cacheLease.Microseconds()).Scan(&dbNow)
		if errors.Is(err, pgx.ErrNoRows) {
			err = errUnregistered
		}
		if err != nil {
			conn = c.lost(conn, err)
			continue
		}
		c.measureSkew(wall, dbNow)
		if monoNow() >= c.validUntil.Load() {
			// The registration may have lapsed before this renewal:
			// invalidations stopped waiting for this cache then, and
			// their notifications may still be queued on the
			// connection. As after a reconnection, it empties itself
			// before it answers again.
			c.evict(cacheID{}, true)
		}
		c.validUntil.Store(sent + int64(cacheLease-cacheMargin))
	}
	if conn != nil {
		dctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = conn.Exec(dctx, c.s.q.cacheLeave, c.node)
		conn.Close(dctx)
		cancel()
	}
}

// measureSkew notes how far the database's clock (dbNow, read by a
// statement sent at sent by this process's clock) may be ahead of this
// process's, so that a record is answered from memory only until the
// database's clock says it expires (less cacheExpiryMargin). The answer
// came back within the round trip: the database's clock is at most dbNow
// minus sent ahead. With Config.Clock both sides share one clock.
func (c *replayCache) measureSkew(sent, dbNow time.Time) {
	if c.s.cfg.Clock != nil {
		return
	}
	c.skew.Store(int64(max(dbNow.Sub(sent), 0)))
}

// lost stops serving after a failure of the listening connection.
func (c *replayCache) lost(conn *pgx.Conn, err error) *pgx.Conn {
	c.validUntil.Store(0)
	c.log.Warn("idem/postgres: replay cache: the listening connection failed; answering from the database", "err", err)
	conn.Close(context.Background())
	return nil
}

// apply evicts what one notification names and returns its number. The
// payload is "<number> <bytes of scope> <scope><key>"; anything else
// empties the cache.
func (c *replayCache) apply(payload string) int64 {
	num, rest, ok1 := strings.Cut(payload, " ")
	n, rest, ok2 := strings.Cut(rest, " ")
	seq, err1 := strconv.ParseInt(num, 10, 64)
	scopeLen, err2 := strconv.Atoi(n)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || scopeLen < 0 || scopeLen > len(rest) {
		c.evict(cacheID{}, true)
		return seq
	}
	c.evict(cacheID{rest[:scopeLen], rest[scopeLen:]}, false)
	return seq
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *replayCache) close() {
	c.validUntil.Store(0)
	c.stop()
	<-c.done
	c.validUntil.Store(0) // a renewal may have finished meanwhile
}

// invalidationOp names a failure of invalidate: the change itself has
// committed, only telling the caches failed, so that an operator who
// retries learns why the record is no longer what it was.
const invalidationOp = "the record changed, but telling the replay caches failed"

// invalidate tells every replay cache on the schema that the record of
// (scope, key) changed, after the change committed, and waits until each
// cache still registered has applied it: once it returns, no process
// answers the old record from memory. A cache that does not answer stops
// serving by itself before its registration lapses (at most cacheLease).
func (s *Store) invalidate(ctx context.Context, scope, key string) error {
	var seq int64
	var behind int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.q.cacheLock); err != nil {
			return err
		}
		return tx.QueryRow(ctx, s.q.cacheNotify, scope, key, s.cfg.Schema, len(scope)).Scan(&seq, &behind)
	})
	if err != nil {
		return wrap(ctx, invalidationOp, err)
	}
	if behind == 0 {
		return nil
	}
	wait := time.NewTicker(2 * time.Millisecond)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return wrap(ctx, invalidationOp, ctx.Err())
		case <-wait.C:
		}
		if err := s.pool.QueryRow(ctx, s.q.cacheBehind, seq).Scan(&behind); err != nil {
			return wrap(ctx, invalidationOp, err)
		}
		if behind == 0 {
			return nil
		}
	}
}

// CacheHits reports the replays the store answered from memory.
func (s *Store) CacheHits() int64 {
	if s.cache == nil {
		return 0
	}
	return s.cache.hits.Load()
}
