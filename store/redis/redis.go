package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var _ store.Store = (*Store)(nil)

// Config configures a Store.
type Config struct {
	// Clock, when set, replaces the Redis server's TIME in every decision
	// about time; each script then receives the time as an argument. Tests
	// use it to move time without sleeping. Nil (the default) uses the
	// server's TIME, read inside the script.
	Clock store.Clock

	// Prefix starts every key the store writes, so several stores (or
	// tests) can share one Redis database. It must not contain '{' or '}':
	// the store owns the hash tag that follows it. Defaults to "idem:".
	Prefix string

	// ExpiryGrace is how long a terminal record stays in Redis past its
	// ExpiresAt when no reaper deletes it: every terminal record carries a
	// Redis TTL of ExpiresAt + ExpiryGrace, so memory stays bounded even if
	// the reaper never runs. In-progress and unknown records never get a
	// TTL. Defaults to 1h.
	ExpiryGrace time.Duration

	// WaitReplicas, when positive, makes every write of a record wait
	// until this many replicas acknowledged it (Redis WAIT, sent in the
	// same round trip), so that a failover to a replica does not lose an
	// answer already acknowledged; a write fewer replicas acknowledged
	// within WaitTimeout fails (retryable). WAIT narrows the window but
	// Redis replication stays asynchronous: see docs/stores.md on Redis
	// durability notes. Defaults to 0: writes do not wait.
	WaitReplicas int

	// WaitTimeout bounds the wait of WaitReplicas. Defaults to 1s.
	WaitTimeout time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "idem:"
	}
	if c.ExpiryGrace == 0 {
		c.ExpiryGrace = time.Hour
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	return c
}

func (c Config) validate() error {
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("idem/redis: prefix %q must not contain '{' or '}'", c.Prefix)
	}
	if c.ExpiryGrace < time.Millisecond {
		return fmt.Errorf("idem/redis: expiry grace %v must be at least 1ms", c.ExpiryGrace)
	}
	if c.WaitReplicas < 0 || c.WaitTimeout < time.Millisecond {
		return fmt.Errorf("idem/redis: wait for %d replicas within %v: want a number of replicas not negative and a timeout of at least 1ms",
			c.WaitReplicas, c.WaitTimeout)
	}
	return nil
}

// Store is the Redis store. It is safe for concurrent use.
type Store struct {
	client    goredis.UniversalClient
	owned     bool
	cfg       Config
	closeOnce sync.Once
	closeErr  error
}

// Open connects to Redis and checks that it answers. The URL is one of
//
//	redis://[user:password@]host:port/db[?options]   a single node (also rediss://, unix://)
//	redis+cluster://[user:password@]h1:p1,h2:p2[?options]   a Redis Cluster (also rediss+cluster://)
//
// with the options of go-redis ParseURL and ParseClusterURL. The cluster
// addresses are seeds: the client discovers the other nodes. The Store owns
// the client and closes it in Close.
func Open(ctx context.Context, rawURL string, cfg Config) (*Store, error) {
	client, err := newClient(rawURL)
	if err != nil {
		return nil, err
	}
	s, err := New(client, cfg)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	s.owned = true
	if err := s.Ping(ctx); err != nil {
		_ = client.Close()
		return nil, err
	}
	return s, nil
}

// New returns a Store on an existing client: a *redis.Client, a
// *redis.ClusterClient or a failover client. The caller keeps ownership of
// the client: Close does not close it.
func New(client goredis.UniversalClient, cfg Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("idem/redis: nil client")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{client: client, cfg: cfg}, nil
}

func newClient(rawURL string) (goredis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, fmt.Errorf("idem/redis: %q is not a redis URL", rawURL)
	}
	switch scheme {
	case "redis", "rediss", "unix":
		opts, err := goredis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("idem/redis: %w", err)
		}
		return goredis.NewClient(opts), nil
	case "redis+cluster", "rediss+cluster":
		u, err := clusterURL(strings.TrimSuffix(scheme, "+cluster"), rest)
		if err != nil {
			return nil, err
		}
		opts, err := goredis.ParseClusterURL(u)
		if err != nil {
			return nil, fmt.Errorf("idem/redis: %w", err)
		}
		return goredis.NewClusterClient(opts), nil
	}
	return nil, fmt.Errorf("idem/redis: unsupported URL scheme %q", scheme)
}

// clusterURL rewrites "user@h1:p1,h2:p2/?x=y" into the form ParseClusterURL
// reads: "scheme://user@h1:p1/?x=y&addr=h2:p2".
func clusterURL(scheme, rest string) (string, error) {
	hostEnd := strings.IndexAny(rest, "/?")
	if hostEnd < 0 {
		hostEnd = len(rest)
	}
	authority, tail := rest[:hostEnd], rest[hostEnd:]
	user := ""
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		user, authority = authority[:at+1], authority[at+1:]
	}
	hosts := strings.Split(authority, ",")
	if hosts[0] == "" {
		return "", errors.New("idem/redis: cluster URL without addresses")
	}
	path, rawQuery, _ := strings.Cut(tail, "?")
	if path != "" && path != "/" {
		return "", errors.New("idem/redis: a cluster URL has no database number (Redis Cluster only has db 0)")
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", fmt.Errorf("idem/redis: cluster URL options: %w", err)
	}
	for _, h := range hosts[1:] {
		if h == "" {
			return "", errors.New("idem/redis: empty address in cluster URL")
		}
		q.Add("addr", h)
	}
	u := scheme + "://" + user + hosts[0]
	if len(q) > 0 {
		u += "/?" + q.Encode()
	}
	return u, nil
}

// Client returns the underlying client.
func (s *Store) Client() goredis.UniversalClient { return s.client }

// Ping checks that Redis answers; on a cluster, that every master does.
func (s *Store) Ping(ctx context.Context) error {
	var err error
	if c, ok := s.client.(*goredis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
			return m.Ping(ctx).Err()
		})
	} else {
		err = s.client.Ping(ctx).Err()
	}
	if err != nil {
		return wrap("ping", err)
	}
	return nil
}

// Close closes the client when the Store opened it. It is safe to call more
// than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.owned {
			s.closeErr = s.client.Close()
		}
	})
	return s.closeErr
}

// now is the clock argument of every script: "" for the server's TIME.
func (s *Store) now() string {
	if s.cfg.Clock == nil {
		return ""
	}
	return strconv.FormatInt(s.cfg.Clock().UnixMicro(), 10)
}

func (s *Store) graceMS() int64 { return s.cfg.ExpiryGrace.Milliseconds() }

// wrap prefixes an error with the operation and marks the transient ones
// retryable (store.IsRetryable).
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if retryable(err) {
		err = store.Retryable(err)
	}
	return fmt.Errorf("idem/redis: %s: %w", op, err)
}

// retryable reports failures that say nothing about the record: the
// connection was refused, broke or timed out, or the server (or cluster)
// cannot serve now: loading its data set, failing over, resharding a slot,
// a script still running, too few replicas connected for a write
// (min-replicas-to-write). A script either ran whole or not at all, so a
// retry never applies half of one.
func retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, goredis.ErrClosed) {
		return false
	}
	for _, prefix := range []string{"LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "BUSY", "MOVED", "ASK", "NOREPLICAS"} {
		if goredis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, goredis.ErrPoolTimeout)
}

// TenantCapUnsupported implements store.CapRefuser: records are spread
// over hash slots by their identity, and a script runs in one slot, so no
// script can count a tenant's records atomically with a reservation.
func (s *Store) TenantCapUnsupported() string {
	return "a tenant's records are spread over hash slots, and a Redis script cannot count them atomically with a reservation"
}

// refuseCap refuses a positive MaxActive with store.ErrCapUnsupported.
func (s *Store) refuseCap(p *store.ReserveParams, op string) error {
	if p.MaxActive > 0 {
		return fmt.Errorf("idem/redis: %s: %w: %s", op, store.ErrCapUnsupported, s.TenantCapUnsupported())
	}
	return nil
}

// Reserve implements store.Store; the whole decision is reserve.lua. A
// positive MaxActive is refused with store.ErrCapUnsupported (see
// TenantCapUnsupported).
func (s *Store) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, fmt.Errorf("idem/redis: reserve: %w", err)
	}
	if err := s.refuseCap(&p, "reserve"); err != nil {
		return store.ReserveResult{}, err
	}
	v, err := s.eval(ctx, scriptReserve, s.scriptKeys(p.Scope, p.Key),
		s.now(), p.Scope, p.Key, p.Fingerprint, storekit.Micros(p.Lease), storekit.Micros(p.TTL),
		string(p.LeasePolicy), s.graceMS(), p.Owner).Result()
	if err != nil {
		return store.ReserveResult{}, wrap("reserve", err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) != 2 {
		return store.ReserveResult{}, fmt.Errorf("idem/redis: reserve: malformed reply %v", v)
	}
	outcome, _ := reply[0].(int64)
	rec, err := decodeRecord(reply[1])
	if err != nil {
		return store.ReserveResult{}, fmt.Errorf("idem/redis: reserve: %w", err)
	}
	return store.ReserveResult{Outcome: store.ReserveOutcome(outcome), Record: rec}, nil
}

// fenced runs a transition guarded by state in_progress and the fence.
// valid is the parameters' Validate.
func (s *Store) fenced(ctx context.Context, op string, valid error, sc *goredis.Script, fp store.FenceParams, args ...any) error {
	if valid != nil {
		return fmt.Errorf("idem/redis: %s: %w", op, valid)
	}
	code, err := s.eval(ctx, sc, s.scriptKeys(fp.Scope, fp.Key), args...).Int64()
	if err != nil {
		return wrap(op, err)
	}
	if code != codeDone {
		return fmt.Errorf("idem/redis: %s: %w", op, store.ErrLeaseLost)
	}
	return nil
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("idem/redis: complete: %w", err)
	}
	resp, err := responseArgs(&p.Response)
	if err != nil {
		return err
	}
	args := append([]any{s.now(), s.graceMS(), p.Fence, storekit.Micros(p.TTL)}, resp...)
	return s.fenced(ctx, "complete", nil, scriptComplete, p.FenceParams, args...)
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.fenced(ctx, "release", p.Validate(), scriptRelease, p.FenceParams,
		s.now(), s.graceMS(), p.Fence, string(store.StateFailedRetryable), p.Error)
}

// MarkUnknown implements store.Store.
func (s *Store) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	req, err := storekit.EncodeRequest(p.Request)
	if err != nil {
		return err
	}
	return s.fenced(ctx, "mark unknown", p.Validate(), scriptRelease, p.FenceParams,
		s.now(), s.graceMS(), p.Fence, string(store.StateUnknown), p.Error, req)
}

// Checkpoint implements store.Store.
func (s *Store) Checkpoint(ctx context.Context, p store.CheckpointParams) error {
	return s.fenced(ctx, "checkpoint", p.Validate(), scriptCheckpoint, p.FenceParams,
		s.now(), p.Fence, p.RecoveryPoint)
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	return s.fenced(ctx, "extend", p.Validate(), scriptExtend, p.FenceParams,
		s.now(), s.graceMS(), p.Fence, storekit.Micros(p.Lease))
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := store.CheckID(scope, key); err != nil {
		return store.Record{}, fmt.Errorf("idem/redis: get: %w", err)
	}
	m, err := s.client.HGetAll(ctx, s.recordKey(scope, key)).Result()
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	rec, err := decodeRecord(pairs(m))
	if rq, ok := m["rq"]; ok && err == nil && rec.State != store.StatePending && rec.State != store.StateInProgress {
		// An operator settles an unknown record from its request; a
		// terminal record keeps none, a worker's request stays unread.
		rec.Request, err = storekit.DecodeRequest(m["q"], []byte(rq))
	}
	if err != nil {
		return store.Record{}, fmt.Errorf("idem/redis: get: %w", err)
	}
	return rec, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, p store.DeleteParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("idem/redis: delete: %w", err)
	}
	return s.guarded(ctx, "delete", scriptDelete, p.Scope, p.Key, p.Fence)
}

// guarded runs a script guarded by the record's state and fence, and
// tells its result codes apart: Resolve and Defer, which need an unknown
// record, and Delete, which needs one not in progress.
func (s *Store) guarded(ctx context.Context, op string, sc *goredis.Script, scope, key string, args ...any) error {
	code, err := s.eval(ctx, sc, s.scriptKeys(scope, key), args...).Int64()
	if err != nil {
		return wrap(op, err)
	}
	switch code {
	case codeDone:
		return nil
	case codeAbsent:
		return fmt.Errorf("idem/redis: %s: %w", op, store.ErrNotFound)
	case codeFence:
		return fmt.Errorf("idem/redis: %s: the record's fence is not the caller's: %w", op, store.ErrLeaseLost)
	default:
		return fmt.Errorf("idem/redis: %s: %w", op, store.ErrStateConflict)
	}
}

// Resolve implements store.Store.
func (s *Store) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("idem/redis: resolve: %w", err)
	}
	resp := &store.Response{}
	if p.To == store.StateCompleted {
		resp = p.Response
	}
	rargs, err := responseArgs(resp)
	if err != nil {
		return err
	}
	args := append([]any{s.now(), s.graceMS(), string(p.To), storekit.Micros(p.TTL)}, rargs...)
	args = append(args, p.Fence)
	return s.guarded(ctx, "resolve", scriptResolve, p.Scope, p.Key, args...)
}

// Defer implements store.Store.
func (s *Store) Defer(ctx context.Context, p store.DeferParams) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("idem/redis: defer: %w", err)
	}
	return s.guarded(ctx, "defer", scriptDefer, p.Scope, p.Key,
		s.now(), s.graceMS(), storekit.Micros(p.Delay), p.Error, flag(p.DeadLetter), p.Fence, p.Attempts)
}
