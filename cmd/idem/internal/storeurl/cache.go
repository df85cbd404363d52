package storeurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
)

// CacheSupported lists the cache DSN forms, for usage text.
const CacheSupported = "redis://[user:pass@]host:6379/db (also rediss://); options prefix=P, max_ttl=5m and go-redis's"

// CacheDSN is a parsed cache DSN (--cache): a single Redis node, with the
// cache's own options taken out of the query.
type CacheDSN struct {
	// Options are the go-redis client options. They may hold a password.
	Options *goredis.Options
	// Prefix starts every cache key (query option prefix); empty takes the
	// cache's default. Deployments that share one Redis database give each
	// its own prefix.
	Prefix string
	// MaxTTL bounds an entry's life (query option max_ttl); zero takes
	// the cache's default.
	MaxTTL time.Duration
}

// ParseCache reads a cache DSN without connecting.
func ParseCache(dsn string) (CacheDSN, error) {
	scheme, _, _ := strings.Cut(dsn, "://")
	if scheme != "redis" && scheme != "rediss" {
		return CacheDSN{}, fmt.Errorf("the cache must be a Redis URL: %s", CacheSupported)
	}
	u, err := parseURL(dsn)
	if err != nil {
		return CacheDSN{}, fmt.Errorf("invalid cache URL: %w", err)
	}
	var c CacheDSN
	q := u.Query()
	c.Prefix = q.Get("prefix")
	if v := q.Get("max_ttl"); v != "" {
		if c.MaxTTL, err = time.ParseDuration(v); err != nil || c.MaxTTL <= 0 {
			return CacheDSN{}, fmt.Errorf("cache option max_ttl=%q: want a positive duration such as 5m", v)
		}
	}
	// go-redis refuses options it does not know: hand it only its own.
	q.Del("prefix")
	q.Del("max_ttl")
	u.RawQuery = q.Encode()
	if c.Options, err = goredis.ParseURL(u.String()); err != nil {
		return CacheDSN{}, fmt.Errorf("cache URL: %w", redactURLError(err))
	}
	return c, nil
}

// redactURLError drops the URL from a url.Error, which repeats it whole,
// password included.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// cachePingTimeout bounds the reachability check of a cache at open.
const cachePingTimeout = time.Second

// withCache puts backing behind the Redis replay cache named by dsn. The
// returned store owns both: Close closes the client and the backing store.
//
// A cache that does not answer at open is only logged: losing the cache
// changes no answer (package cache), so a Redis outage must not keep the
// proxy from starting.
func withCache(backing store.Store, dsn string, opts Options) (store.Store, error) {
	c, err := ParseCache(dsn)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// The cache bounds each read and write by a deadline of its own
	// (cache.Config.Timeout): within a connection's reads and writes
	// go-redis keeps to it only when told to.
	c.Options.ContextTimeoutEnabled = true
	rdb := goredis.NewClient(c.Options)
	ctx, cancel := context.WithTimeout(context.Background(), cachePingTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		log.Warn("idem: the replay cache does not answer; replays come from the store until it does",
			"addr", c.Options.Addr, "err", err)
	}
	cs := cache.New(backing, rdb, cache.Config{Prefix: c.Prefix, MaxTTL: c.MaxTTL, Clock: opts.Clock, Logger: log})
	return &cachedStore{Store: cs, rdb: rdb}, nil
}

// cachedStore is a cache.Store that owns its Redis client.
type cachedStore struct {
	*cache.Store
	rdb *goredis.Client
}

func (s *cachedStore) Close() error {
	return errors.Join(s.Store.Close(), s.rdb.Close())
}
