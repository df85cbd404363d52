// Package storeurl opens an idem store from the one-line DSN every command of
// the idem binary takes (--store). A DSN means the same store in every
// command:
//
//	sqlite:PATH                          embedded SQLite file (the default: sqlite:idem.db)
//	sqlite::memory:                      private in-memory SQLite (tests)
//	memory:                              process memory, gone at exit
//	postgres://user:pass@host:5432/db    PostgreSQL (also postgresql://; any libpq URL)
//	mysql://user:pass@host:3306/db       MySQL or MariaDB
//	redis://[user:pass@]host:6379/0      Redis (also rediss://, redis+cluster://h1:p1,h2:p2)
//
// Userinfo in a URL is percent-encoded as in any URL ("p%40ss" for "p@ss").
// Errors never repeat the DSN, which may hold a password.
//
// Options.Cache puts a Redis replay cache (package store/cache) in front of
// the store; its URL is read by ParseCache (--cache).
package storeurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/sqlite"
)

// Default is the store of every command when --store is not given.
const Default = "sqlite:idem.db"

// Kind names a store implementation.
type Kind string

// The store kinds a DSN can name.
const (
	SQLite   Kind = "sqlite"
	Memory   Kind = "memory"
	Postgres Kind = "postgres"
	MySQL    Kind = "mysql"
	Redis    Kind = "redis"
)

// Supported lists the DSN forms, for error messages and usage text.
const Supported = "sqlite:PATH, memory:, postgres://..., postgresql://..., mysql://user:pass@host:port/db, " +
	"redis://host:port/db (also rediss://, redis+cluster://)"

// DSN is a parsed store DSN.
type DSN struct {
	Kind Kind
	// Target is what the store's Open takes: a file path for SQLite, the
	// URL for PostgreSQL and Redis, a go-sql-driver DSN for MySQL, "" for
	// memory. It may hold a password: never log it.
	Target string
}

// Options adjust how Open opens a store.
type Options struct {
	// Migrate applies the store's pending migrations at open. The proxy
	// sets it (a fresh database just works); maintenance commands that
	// must not change the schema leave it false. Stores without
	// migrations (memory, Redis) ignore it.
	Migrate bool
	// Clock replaces the store's clock (tests). Nil keeps the store's own
	// clock: the database server's, or the process clock for the embedded
	// stores.
	Clock store.Clock
	// Cache, when set, is a Redis URL (see ParseCache): the store is
	// wrapped in the replay cache of package store/cache, and Delete and
	// Resolve through it drop the cache entry too.
	Cache string
	// Logger receives the cache's failures. Defaults to slog.Default().
	Logger *slog.Logger
	// Conns sizes the connection pool of a server store: PostgreSQL's
	// pool (postgres.Config.MaxConns; a pool_max_conns in the URL yields
	// to it) and MySQL's cap on open connections (mysql.Config.MaxConns).
	// Defaults to 0: the store's own sizing, 32 connections for
	// PostgreSQL (unless the URL says) and no cap for MySQL. Other stores
	// ignore it.
	Conns int
	// TenantCap makes a PostgreSQL store count each tenant's active
	// records (postgres.Config.TenantCap), for a cap on them; other stores
	// always count. Defaults to false.
	TenantCap bool
	// ReplayCache and ListenURL set a PostgreSQL store's memory of
	// completed records (postgres.Config.ReplayCache, ListenURL); other
	// stores ignore them.
	ReplayCache int64
	ListenURL   string
	// Partitions makes a PostgreSQL store keep its records in a table
	// partitioned by retention, one partition per this much time
	// (postgres.Config.Partitions); other stores ignore it. Defaults to 0:
	// the plain table (or, on a partitioned one, its own partitions').
	Partitions time.Duration
	// Batches is the number of group commits a PostgreSQL store may have
	// in flight (postgres.Config.MaxBatches): 0 keeps the store's default
	// (postgres.DefaultMaxBatches), -1 turns batching off. Other stores
	// ignore it.
	Batches int
}

// maxBatches bounds Options.Batches: each batch in flight holds a
// connection of the pool.
const maxBatches = 1024

// ErrUnsupported is returned (wrapped) for a DSN whose scheme names no store.
var ErrUnsupported = errors.New("unsupported store DSN")

// Parse reads a DSN without opening anything.
func Parse(dsn string) (DSN, error) {
	scheme, rest, ok := strings.Cut(dsn, ":")
	if !ok || scheme == "" {
		return DSN{}, fmt.Errorf("%w: want one of %s", ErrUnsupported, Supported)
	}
	switch strings.ToLower(scheme) {
	case "sqlite", "sqlite3":
		// sqlite:///abs/path and sqlite://rel/path read as URLs would:
		// the "//" introduces an empty authority, not part of the path.
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return DSN{}, errors.New("sqlite DSN needs a file path (sqlite:PATH, e.g. sqlite:idem.db)")
		}
		return DSN{Kind: SQLite, Target: path}, nil
	case "memory", "mem":
		if rest != "" && rest != "//" {
			return DSN{}, errors.New(`storeurl: memory DSN takes no argument (write "memory:")`)
		}
		return DSN{Kind: Memory}, nil
	case "postgres", "postgresql":
		if !strings.HasPrefix(rest, "//") {
			return DSN{}, errors.New("postgres DSN must be a URL: postgres://user:pass@host:port/db")
		}
		return DSN{Kind: Postgres, Target: dsn}, nil
	case "mysql":
		target, err := mysqlDSN(dsn)
		if err != nil {
			return DSN{}, err
		}
		return DSN{Kind: MySQL, Target: target}, nil
	case "redis", "rediss", "redis+cluster", "rediss+cluster":
		if !strings.HasPrefix(rest, "//") {
			return DSN{}, errors.New("redis DSN must be a URL: redis://host:port/db")
		}
		// The Redis client's own error for a URL it cannot read repeats
		// the URL, password included.
		if _, err := parseURL(dsn); err != nil {
			return DSN{}, fmt.Errorf("invalid redis URL: %w", err)
		}
		if _, _, err := redisWait(dsn); err != nil {
			return DSN{}, err
		}
		return DSN{Kind: Redis, Target: dsn}, nil
	}
	return DSN{}, fmt.Errorf("%w: scheme %q; want one of %s", ErrUnsupported, scheme, Supported)
}

// mysqlDSN converts mysql://user:pass@host:port/db?params to the
// go-sql-driver form user:pass@tcp(host:port)/db?params. The driver's own
// Config formats the result, so a password holding '@', ':' or '/' survives.
func mysqlDSN(raw string) (string, error) {
	u, err := parseURL(raw)
	if err != nil {
		return "", fmt.Errorf("invalid mysql URL: %w", err)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return "", errors.New("mysql DSN must be a URL: mysql://user:pass@host:port/db")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return "", errors.New("mysql DSN needs a database name: mysql://user:pass@host:port/db")
	}
	cfg := mysqldrv.NewConfig()
	if u.RawQuery != "" {
		// Let the driver parse and validate its own parameters.
		if cfg, err = mysqldrv.ParseDSN("/?" + u.RawQuery); err != nil {
			return "", fmt.Errorf("mysql DSN parameters: %w", err)
		}
	}
	user := u.User.Username()
	if strings.Contains(user, ":") {
		return "", errors.New("a mysql user name cannot contain ':'")
	}
	cfg.User = user
	cfg.Passwd, _ = u.User.Password()
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	cfg.Net = "tcp"
	cfg.Addr = net.JoinHostPort(u.Hostname(), port)
	cfg.DBName = db
	return cfg.FormatDSN(), nil
}

// parseURL reads a store or cache URL. Its error never repeats the URL,
// which may hold a password. A malformed query is refused: the drivers
// would drop the parameters they cannot read, silently.
func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, redactURLError(err)
	}
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	return u, nil
}

// Open opens the store dsn names. The caller closes it.
func Open(ctx context.Context, dsn string, opts Options) (store.Store, error) {
	d, err := Parse(dsn)
	if err != nil {
		return nil, err
	}
	if opts.Conns < 0 || opts.Conns > math.MaxInt32 {
		return nil, fmt.Errorf("%d store connections: want 0 (the store's default) or a positive number", opts.Conns)
	}
	if opts.Batches < -1 || opts.Batches > maxBatches {
		return nil, fmt.Errorf("%d store batches: want 0 (the store's default), -1 (no batching) or 1 to %d", opts.Batches, maxBatches)
	}
	var s store.Store
	switch d.Kind {
	case Memory:
		s = memory.New(memory.Config{Clock: opts.Clock})
	case SQLite:
		s, err = sqlite.Open(ctx, d.Target, sqlite.Config{Clock: opts.Clock, SkipMigrate: !opts.Migrate})
	case Postgres:
		s, err = postgres.Open(ctx, d.Target, postgres.Config{Clock: opts.Clock, SkipMigrate: !opts.Migrate,
			MaxConns: int32(opts.Conns), MaxBatches: opts.Batches, TenantCap: opts.TenantCap,
			ReplayCache: opts.ReplayCache, ListenURL: opts.ListenURL, Partitions: opts.Partitions})
	case MySQL:
		s, err = mysql.Open(ctx, d.Target, mysql.Config{Clock: opts.Clock, SkipMigrate: !opts.Migrate,
			MaxConns: opts.Conns})
	case Redis:
		target, rcfg, werr := redisWait(d.Target)
		if werr != nil {
			return nil, werr
		}
		rcfg.Clock = opts.Clock
		s, err = redis.Open(ctx, target, rcfg)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s store: %w", d.Kind, err)
	}
	if opts.Cache != "" {
		c, err := withCache(s, opts.Cache, opts)
		if err != nil {
			s.Close()
			return nil, err
		}
		s = c
	}
	return s, nil
}

// Migrator is implemented by stores with a schema (the SQL stores).
type Migrator interface {
	Migrate(ctx context.Context) error
}

// Migrate applies s's pending migrations. It reports false, doing nothing,
// for a store without a schema (memory, Redis).
func Migrate(ctx context.Context, s store.Store) (bool, error) {
	m, ok := s.(Migrator)
	if !ok {
		return false, nil
	}
	return true, m.Migrate(ctx)
}

// Environment variables that hold a DSN, so that a password stays out of
// the process list: every command reads them when neither the flag nor
// its -file form is given.
const (
	StoreEnv = "IDEM_STORE"
	CacheEnv = "IDEM_CACHE"
)

// ReadFile reads a DSN from a file (--store-file, --cache-file): its first
// line, trimmed of white space. Errors never repeat the file's content.
func ReadFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if line = strings.TrimSpace(line); line == "" {
		return "", fmt.Errorf("%s: the first line is empty, want a DSN", path)
	}
	return line, nil
}

// redisWait takes the store's own parameters out of a Redis URL, which
// go-redis would refuse: wait_replicas=N makes every write of a record wait
// for N replicas (redis.Config.WaitReplicas, Redis WAIT), wait_timeout=D
// bounds that wait (redis.Config.WaitTimeout). It returns the URL without
// them.
func redisWait(raw string) (string, redis.Config, error) {
	var cfg redis.Config
	base, query, ok := strings.Cut(raw, "?")
	if !ok || !strings.Contains(query, "wait_") {
		return raw, cfg, nil
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", cfg, errors.New("invalid redis URL parameters")
	}
	if v, ok := q["wait_replicas"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 0 || len(v) > 1 {
			return "", cfg, fmt.Errorf("redis wait_replicas %q: want one number of replicas, 0 or more", strings.Join(v, ","))
		}
		cfg.WaitReplicas = n
		q.Del("wait_replicas")
	}
	if v, ok := q["wait_timeout"]; ok {
		d, err := time.ParseDuration(v[0])
		if err != nil || d < time.Millisecond || len(v) > 1 {
			return "", cfg, fmt.Errorf("redis wait_timeout %q: want one duration of at least 1ms, e.g. 500ms", strings.Join(v, ","))
		}
		cfg.WaitTimeout = d
		q.Del("wait_timeout")
	}
	if len(q) > 0 {
		base += "?" + q.Encode()
	}
	return base, cfg, nil
}
