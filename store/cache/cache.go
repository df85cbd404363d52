// Package cache puts a Redis read-through cache for replays in front of
// another store (the middle ground of seeds 001 and 002): the backing store,
// typically PostgreSQL or MySQL, stays the source of truth for every
// reservation and transition; Redis only answers replays of completed
// records.
//
// What the cache may answer: a Reserve whose (scope, key) has a completed
// record in the cache with the same fingerprint, before that record's
// expiry. Everything else (new keys, other fingerprints, in-flight and
// unknown records) goes to the backing store. Entries are written when the
// backing store answers a replay, with a TTL that never exceeds the
// record's remaining retention (and Config.MaxTTL).
//
// Losing the cache (a flush, a restart, Redis down) changes no answer, only
// its speed: every cache error falls through to the backing store, and a
// Redis that does not answer costs a request at most Config.Timeout. An
// operator Delete or a Resolve through this store replaces the cache entry
// with a tombstone for MaxTTL, which entries are never written over: a
// replay that read the record before the change cannot write the old
// answer back (meanwhile that key's replays come from the backing store).
// A Delete whose tombstone cannot be written says so; a Resolve does not
// (see Store.Resolve). A Delete made directly on the backing store
// (bypassing this wrapper) leaves the entry answering replays for at most
// MaxTTL, so keep MaxTTL short when operators cache-bust, and pass the
// cache to `idem delete`.
package cache

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/idem-go/idem/store"
	goredis "github.com/redis/go-redis/v9"
)

var _ store.Store = (*Store)(nil)

// Config configures the cache.
type Config struct {
	// Prefix starts every cache key. Defaults to "idem:cache:".
	Prefix string
	// MaxTTL bounds how long an entry lives. Defaults to 5m.
	MaxTTL time.Duration
	// Clock is the time source for entry lifetimes; it should agree with
	// the backing store's. Defaults to time.Now.
	Clock store.Clock
	// Logger receives cache failures (which never fail a request).
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Timeout bounds each read of an entry, each write of one after a
	// replay, and the tombstone of a settlement, so that a Redis that
	// stops answering without refusing (hung, or cut off by a network that
	// drops packets) delays a request by at most that much per call before
	// the backing store answers it, instead of using up the request's
	// deadline. Within a connection's reads and writes it holds only when
	// the client respects contexts (go-redis's ContextTimeoutEnabled);
	// otherwise those wait for the client's ReadTimeout and WriteTimeout.
	// Defaults to 100ms.
	Timeout time.Duration
}

// Store is a store.Store: the backing store with replays served from Redis.
type Store struct {
	store.Store
	rdb goredis.UniversalClient
	cfg Config
}

// New returns backing behind a replay cache on rdb. The caller keeps
// ownership of rdb; Close closes the backing store only.
func New(backing store.Store, rdb goredis.UniversalClient, cfg Config) *Store {
	if cfg.Prefix == "" {
		cfg.Prefix = "idem:cache:"
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = 5 * time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 100 * time.Millisecond
	}
	return &Store{Store: backing, rdb: rdb, cfg: cfg}
}

// key names the entry of (scope, key); the hash tag keeps it in one slot.
func (s *Store) key(scope, key string) string {
	return s.cfg.Prefix + "{" + strconv.Itoa(len(scope)) + ":" + scope + key + "}"
}

// entry is what the cache keeps: the record and the end of the entry's
// own life (checked against the clock, not only Redis's TTL).
type entry struct {
	Record store.Record `json:"r"`
	Until  time.Time    `json:"u"`
}

// Reserve answers replays from the cache and everything else from the
// backing store.
func (s *Store) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	now := s.cfg.Clock()
	if rec, ok := s.lookup(ctx, p.Scope, p.Key, now); ok && rec.Fingerprint == p.Fingerprint {
		return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
	}
	res, err := s.Store.Reserve(ctx, p)
	if err == nil && res.Outcome == store.Existing && res.Record.State == store.StateCompleted {
		s.fill(ctx, res.Record, now)
	}
	return res, err
}

func (s *Store) lookup(ctx context.Context, scope, key string, now time.Time) (store.Record, bool) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	b, err := s.rdb.Get(rctx, s.key(scope, key)).Bytes()
	if err != nil {
		if !errors.Is(err, goredis.Nil) && ctx.Err() == nil {
			s.cfg.Logger.Warn("idem/cache: read failed; answering from the store", "err", err)
		}
		return store.Record{}, false
	}
	if string(b) == Tombstone {
		return store.Record{}, false
	}
	var e entry
	if err := json.Unmarshal(b, &e); err != nil {
		s.cfg.Logger.Warn("idem/cache: unreadable entry ignored", "err", err)
		return store.Record{}, false
	}
	r := e.Record
	if r.State != store.StateCompleted || r.Scope != scope || r.Key != key ||
		!now.Before(e.Until) || !now.Add(expiryMargin).Before(r.ExpiresAt) {
		return store.Record{}, false
	}
	return r, true
}

// expiryMargin: a record is answered from the cache only until this long
// before its expiry, which the backing store judged by its own clock (a
// database's): a process clock a little behind it must not replay what
// the store calls expired.
const expiryMargin = time.Second

func (s *Store) fill(ctx context.Context, r store.Record, now time.Time) {
	ttl := min(r.ExpiresAt.Sub(now)-expiryMargin, s.cfg.MaxTTL)
	if ttl < time.Millisecond {
		return
	}
	b, err := json.Marshal(entry{Record: r, Until: now.Add(ttl)})
	if err == nil {
		// Only where nothing is: not over the tombstone of an
		// invalidation applied since this record was read.
		wctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		err = s.rdb.SetNX(wctx, s.key(r.Scope, r.Key), b, ttl).Err()
		cancel()
	}
	if err != nil && ctx.Err() == nil {
		s.cfg.Logger.Warn("idem/cache: write failed", "err", err)
	}
}

// Tombstone is the value an invalidation leaves under an entry's Redis
// key, for MaxTTL: a replay that read the record from the backing store
// before the change and writes its entry after the invalidation (entries
// are written only where nothing is) must not bring the old answer back.
// For that while the key's replays come from the backing store.
const Tombstone = "-"

// invalidate replaces the entry of a record whose answer changed with a
// tombstone. A failure is returned: leaving a stale entry behind must not
// pass silently.
func (s *Store) invalidate(ctx context.Context, scope, key string) error {
	if err := s.rdb.Set(ctx, s.key(scope, key), Tombstone, s.cfg.MaxTTL).Err(); err != nil {
		return errors.Join(errors.New("idem/cache: could not drop the cache entry"), err)
	}
	return nil
}

// Delete removes the record from the backing store (which checks
// p.Fence) and the cache.
func (s *Store) Delete(ctx context.Context, p store.DeleteParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	err := s.Store.Delete(ctx, p)
	if ierr := s.invalidate(ctx, p.Scope, p.Key); ierr != nil {
		return errors.Join(err, ierr)
	}
	return err
}

// Resolve settles a record in the backing store, then drops its entry.
// The answer is the backing store's: once it committed the settlement, a
// failure to drop the entry is logged, not returned. Returned, it would
// send the caller into retries of a settlement already made, which the
// backing store refuses (ErrStateConflict, as if another had settled it).
// And no entry answers for the execution settled: the cache keeps
// completed records only, and an unknown record was never completed under
// its fence; the tombstone only cuts short an entry of an older execution
// (left by a delete that bypassed this wrapper). For the same reason the
// drop waits at most Config.Timeout.
func (s *Store) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := s.Store.Resolve(ctx, p); err != nil {
		return err
	}
	ictx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	err := s.invalidate(ictx, p.Scope, p.Key)
	cancel()
	if err != nil && ctx.Err() == nil {
		s.cfg.Logger.Warn("idem/cache: settled in the store; the cache entry was not dropped", "scope", p.Scope, "key", p.Key, "err", err)
	}
	return nil
}
