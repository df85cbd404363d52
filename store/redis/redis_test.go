package redis

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// redisServer returns the options of a client of the test Redis server, in
// the database IDEM_TEST_REDIS_ADDR names (host:port/DB; 0 by default), and
// the same server and database as a store URL; or skips the test.
func redisServer(t testing.TB) (*goredis.Options, string) {
	t.Helper()
	return &goredis.Options{Addr: testenv.RedisAddr(t), DB: testenv.RedisDB(t)}, testenv.RedisURL(t)
}

// freshPrefix returns a random key prefix and deletes every key under it when
// hookedClient connects to the test server with hooks added (faults a
// test injects) and returns the client and a prefix no other test uses.
func hookedClient(t *testing.T, hooks ...goredis.Hook) (*goredis.Client, string) {
	t.Helper()
	opts, _ := redisServer(t)
	client := goredis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	prefix := freshPrefix(t, client)
	for _, h := range hooks {
		client.AddHook(h)
	}
	return client, prefix
}

// the test ends, on every master of client.
func freshPrefix(t testing.TB, client goredis.UniversalClient) string {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	prefix := "idemtest:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		if err := forEachMaster(ctx, client, func(ctx context.Context, c *goredis.Client) error {
			return deletePrefix(ctx, c, prefix)
		}); err != nil {
			t.Errorf("cleanup of %s: %v", prefix, err)
		}
	})
	return prefix
}

func forEachMaster(ctx context.Context, client goredis.UniversalClient, fn func(context.Context, *goredis.Client) error) error {
	switch c := client.(type) {
	case *goredis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *goredis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("unexpected client %T", client)
}

// deletePrefix deletes with one DEL per key (a cluster node refuses a DEL
// of keys in several slots), pipelined per SCAN page.
func deletePrefix(ctx context.Context, c *goredis.Client, prefix string) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			pipe := c.Pipeline()
			for _, k := range keys {
				pipe.Del(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

func countPrefix(ctx context.Context, c *goredis.Client, prefix string) (int, error) {
	n := 0
	iter := c.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n, iter.Err()
}

// singleNode returns an opener for a fresh prefix on the test server's
// database.
func singleNode(t *testing.T) storetest.Opener {
	opts, url := redisServer(t)
	admin := goredis.NewClient(opts)
	t.Cleanup(func() { _ = admin.Close() })
	prefix := freshPrefix(t, admin)
	return func(t *testing.T, clock store.Clock) store.Store {
		s, err := Open(context.Background(), url, Config{Clock: clock, Prefix: prefix})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	redisServer(t)
	storetest.Run(t, storetest.Harness{
		NewDatabase: singleNode,
		// Durable means: records survive closing a client and opening a new
		// one on the same running server (an application restart). A
		// restart of the Redis server itself is not covered: the test
		// server runs without persistence, and so loses everything.
		Durable:       true,
		Shared:        true,
		NoTenantCap:   true,
		NoActiveCount: true,
	})
}

// newTestStore opens a store on a fresh prefix with a manual clock.
func newTestStore(t *testing.T, open storetest.Opener) (*Store, *storetest.Clock) {
	t.Helper()
	clock := storetest.NewClock()
	return open(t, clock.Now).(*Store), clock
}

// storeTests are the store-specific tests; they run on a single node and on
// the cluster.
var storeTests = []struct {
	name string
	fn   func(*testing.T, storetest.Opener)
}{
	{"ReserveBranches", testReserveBranches},
	{"TakeOver", testTakeOver},
	{"ResponseEncoding", testResponseEncoding},
	{"RedisTTL", testRedisTTL},
	{"EvictedIndexEntryTrimmed", testEvictedIndexEntryTrimmed},
	{"LegacyDeadLetterListed", testLegacyDeadLetterListed},
	{"OwnerField", testOwnerField},
	{"SweepReapList", testSweepReapList},
	{"SoftReap", testSoftReap},
	{"ServerClock", testServerClock},
	{"ScriptCacheFlushed", testScriptCacheFlushed},
	{"InvalidParams", testInvalidParams},
	{"CandidatePages", testCandidatePages},
	{"LiveLeasesDoNotFillReapBatch", testLiveLeasesDoNotFillReapBatch},
	{"ReapStepsOverSparedRecordsUpToABound", testReapSparedBound},
}

func runStoreTests(t *testing.T, newDatabase func(*testing.T) storetest.Opener) {
	for _, tt := range storeTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newDatabase(t))
		})
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	redisServer(t)
	runStoreTests(t, singleNode)
}

var ctx = context.Background()

func reserveParams(key string) store.ReserveParams {
	return store.ReserveParams{
		Scope: "tenant POST /pay", Key: key, Fingerprint: "fp-1",
		Lease: 30 * time.Second, TTL: 24 * time.Hour, LeasePolicy: store.LeaseUnknown,
	}
}

func mustReserve(t *testing.T, s store.Store, p store.ReserveParams, want store.ReserveOutcome) store.Record {
	t.Helper()
	res, err := s.Reserve(ctx, p)
	if err != nil {
		t.Fatalf("reserve %s: %v", p.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("reserve %s: outcome %v, want %v (record %+v)", p.Key, res.Outcome, want, res.Record)
	}
	return res.Record
}

func fence(r store.Record) store.FenceParams {
	return store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence}
}

func testReserveBranches(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	t0 := clock.Now()

	p := reserveParams("k1")
	rec := mustReserve(t, s, p, store.Created)
	if rec.State != store.StateInProgress || rec.Fence != t0.UnixMicro() || rec.Attempts != 1 ||
		!rec.CreatedAt.Equal(t0) || !rec.LockedUntil.Equal(t0.Add(p.Lease)) || !rec.ExpiresAt.Equal(t0.Add(p.TTL)) ||
		rec.CreatedAt.Location() != time.UTC {
		t.Fatalf("created record: %+v", rec)
	}

	// Live in_progress: the record as it is.
	if got := mustReserve(t, s, p, store.Existing); got.State != store.StateInProgress || got.Fence != rec.Fence {
		t.Fatalf("in flight: %+v", got)
	}

	// A different fingerprint gets the record untouched, whatever its state.
	other := p
	other.Fingerprint = "fp-2"
	if got := mustReserve(t, s, other, store.Existing); got.Fingerprint != "fp-1" || !got.UpdatedAt.Equal(t0) {
		t.Fatalf("mismatch: %+v", got)
	}

	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte("{\"id\":1}\x00\xff")}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: resp}); err != nil {
		t.Fatal(err)
	}
	got := mustReserve(t, s, p, store.Existing)
	if got.State != store.StateCompleted || got.Response == nil || got.Response.Status != 201 ||
		!bytes.Equal(got.Response.Body, resp.Body) || got.Response.Header.Get("Content-Type") != "application/json" ||
		!got.CompletedAt.Equal(t0) {
		t.Fatalf("replay: %+v", got)
	}
	// A stale or repeated Complete changes nothing.
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: resp}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second complete: %v", err)
	}

	// Terminal past expires_at: a new record over the old one, a fence
	// from the clock.
	clock.Advance(p.TTL)
	got = mustReserve(t, s, other, store.Created)
	if got.Fence != clock.Now().UnixMicro() || got.Fingerprint != "fp-2" || got.Response != nil || got.Attempts != 1 || !got.CompletedAt.IsZero() {
		t.Fatalf("over expired: %+v", got)
	}

	// failed_retryable with the same fingerprint: reclaimed, a new fence, attempts+1.
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence(got), Error: "upstream 503"}); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Get(ctx, got.Scope, got.Key); r.State != store.StateFailedRetryable || r.LastError != "upstream 503" {
		t.Fatalf("released: %+v", r)
	}
	if r := mustReserve(t, s, p, store.Existing); r.State != store.StateFailedRetryable {
		t.Fatalf("failed record with another fingerprint: %+v", r)
	}
	clock.Advance(time.Minute)
	recl := mustReserve(t, s, other, store.Reclaimed)
	if recl.Fence != clock.Now().UnixMicro() || recl.Attempts != 2 || recl.State != store.StateInProgress || recl.LastError != "" ||
		!recl.ExpiresAt.Equal(clock.Now().Add(p.TTL)) {
		t.Fatalf("reclaimed: %+v", recl)
	}

	// Expired lease under policy unknown: unknown, due now, lease_expired.
	clock.Advance(p.Lease)
	unk := mustReserve(t, s, other, store.Existing)
	if unk.State != store.StateUnknown || unk.LastError != "lease_expired" || !unk.ReconcileAfter.Equal(clock.Now()) || unk.Fence != recl.Fence {
		t.Fatalf("lease expired under unknown: %+v", unk)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(recl), Response: resp}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("complete after the lease went unknown: %v", err)
	}
	// unknown is never handed out again.
	if r := mustReserve(t, s, other, store.Existing); r.State != store.StateUnknown {
		t.Fatalf("unknown: %+v", r)
	}
	checkIndexes(t, s)
	// Dead-lettered: from the unknown index to the dead one.
	if err := s.Defer(ctx, store.DeferParams{FenceParams: fence(unk), DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	checkIndexes(t, s)
}

func testTakeOver(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	for _, pol := range []store.LeasePolicy{store.LeaseRetry, store.LeaseResume} {
		p := reserveParams("k-" + string(pol))
		p.LeasePolicy = pol
		rec := mustReserve(t, s, p, store.Created)
		if err := s.Checkpoint(ctx, store.CheckpointParams{FenceParams: fence(rec), RecoveryPoint: "charged"}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(p.Lease)
		// The sweeper leaves records under retry/resume alone.
		if swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10}); err != nil || len(swept) != 0 {
			t.Fatalf("sweep: %v %v", swept, err)
		}
		got := mustReserve(t, s, p, store.TakenOver)
		if got.Fence != clock.Now().UnixMicro() || got.Attempts != 2 || got.RecoveryPoint != "charged" || !got.LockedUntil.Equal(clock.Now().Add(p.Lease)) {
			t.Fatalf("taken over: %+v", got)
		}
		// Fencing: the dead holder can no longer touch the record.
		for name, err := range map[string]error{
			"complete":   s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: store.Response{Status: 200}}),
			"release":    s.Release(ctx, store.ReleaseParams{FenceParams: fence(rec)}),
			"unknown":    s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fence(rec)}),
			"checkpoint": s.Checkpoint(ctx, store.CheckpointParams{FenceParams: fence(rec), RecoveryPoint: "x"}),
			"extend":     s.Extend(ctx, store.ExtendParams{FenceParams: fence(rec), Lease: time.Minute}),
		} {
			if !errors.Is(err, store.ErrLeaseLost) {
				t.Errorf("%s with the old fence: %v", name, err)
			}
		}
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(got), Response: store.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
	}
	checkIndexes(t, s)
}

// The body's nil-ness and an omitted body survive the round trip.
func testResponseEncoding(t *testing.T, open storetest.Opener) {
	s, _ := newTestStore(t, open)
	for i, resp := range []store.Response{
		{Status: 204},
		{Status: 200, Body: []byte{}, Header: http.Header{}},
		{Status: 200, Header: http.Header{"X-A": {"1", "2"}}, BodyOmitted: true},
	} {
		rec := mustReserve(t, s, reserveParams(fmt.Sprint("r", i)), store.Created)
		in := resp
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: in}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, rec.Scope, rec.Key)
		if err != nil {
			t.Fatal(err)
		}
		r := got.Response
		if r.Status != resp.Status || r.BodyOmitted != resp.BodyOmitted || (r.Body == nil) != (resp.Body == nil) ||
			(r.Header == nil) != (resp.Header == nil) || len(r.Header["X-A"]) != len(resp.Header["X-A"]) {
			t.Errorf("response %d: got %+v want %+v", i, r, resp)
		}
	}
}

// Terminal records carry a Redis TTL of expires_at + grace; open ones none.
func testRedisTTL(t *testing.T, open storetest.Opener) {
	s, _ := newTestStore(t, open)
	p := reserveParams("ttl")
	rec := mustReserve(t, s, p, store.Created)
	rk := s.recordKey(p.Scope, p.Key)
	ttl := func() time.Duration {
		d, err := s.client.PTTL(ctx, rk).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := ttl(); d != -1 {
		t.Fatalf("in_progress record has TTL %v", d)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: store.Response{Status: 200}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if d, want := ttl(), time.Hour+s.cfg.ExpiryGrace; d <= 0 || d > want || d < want-time.Minute {
		t.Fatalf("completed record TTL %v, want about %v", d, want)
	}
	rec2 := mustReserve(t, s, reserveParams("ttl2"), store.Created)
	if err := s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fence(rec2), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.client.PTTL(ctx, s.recordKey(rec2.Scope, rec2.Key)).Result(); d != -1 {
		t.Fatalf("unknown record has TTL %v", d)
	}
}

// checkIndexes verifies that the indexes of every shard hold exactly
// the records that belong in them, with the right scores.
func checkIndexes(t *testing.T, s *Store) {
	t.Helper()
	want := map[string]float64{}
	var mu sync.Mutex
	for sh := range shardCount {
		keys := s.indexKeys(sh)
		var recordKeys []string
		err := forEachMaster(ctx, s.client, func(ctx context.Context, c *goredis.Client) error {
			keys, err := c.Keys(ctx, s.tag(sh)+"r:*").Result()
			mu.Lock()
			recordKeys = append(recordKeys, keys...)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, rk := range recordKeys {
			m, err := s.client.HGetAll(ctx, rk).Result()
			if err != nil {
				t.Fatal(err)
			}
			rec, err := decodeRecord(pairs(m))
			if err != nil {
				t.Fatal(err)
			}
			us := func(tm time.Time) float64 { return float64(tm.UnixMicro()) }
			if rec.State == store.StateInProgress && rec.LeasePolicy == store.LeaseUnknown {
				want[keys[idxLease]+" "+rk] = us(rec.LockedUntil)
			}
			if rec.State == store.StateUnknown && !rec.DeadLettered() {
				want[keys[idxUnknown]+" "+rk] = us(rec.ReconcileAfter)
			}
			if rec.State == store.StateUnknown && rec.DeadLettered() {
				want[keys[idxDead]+" "+rk] = us(rec.ReconcileAfter)
			}
			if rec.State.Terminal() {
				want[keys[idxTerm]+" "+rk] = us(rec.ExpiresAt)
			}
			if rec.State == store.StateUnknown {
				want[keys[idxOpen]+" "+rk] = us(rec.ExpiresAt)
			}
			if rec.State == store.StateInProgress {
				want[keys[idxOpen]+" "+rk] = max(us(rec.ExpiresAt), us(rec.LockedUntil))
			}
		}
	}
	got := map[string]float64{}
	for sh := range shardCount {
		for _, k := range s.indexKeys(sh) {
			zs, err := s.client.ZRangeWithScores(ctx, k, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, z := range zs {
				got[k+" "+z.Member.(string)] = z.Score
			}
		}
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("index entry %q: got %v (present %v), want %v", k, g, ok, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("stray index entry %q", k)
		}
	}
}

// keyInShard finds a key whose record lands in the given shard.
func keyInShard(scope string, shard int, not string) string {
	for i := 0; ; i++ {
		k := fmt.Sprint("probe-", i)
		if k != not && shardOf(scope, k) == shard {
			return k
		}
	}
}

// An earlier build kept a dead-lettered record in the unknown index at the
// score +inf. The operator's listing still shows it (last), the due
// listing never does, and the next change to the record files it in the
// dead index.
func testLegacyDeadLetterListed(t *testing.T, open storetest.Opener) {
	s, _ := newTestStore(t, open)
	p := reserveParams("legacy")
	rec := mustReserve(t, s, p, store.Created)
	if err := s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fence(rec), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	dead := store.DeferParams{FenceParams: fence(rec), Error: "gave up", DeadLetter: true}
	if err := s.Defer(ctx, dead); err != nil {
		t.Fatal(err)
	}
	keys, rk := s.indexKeys(shardOf(p.Scope, p.Key)), s.recordKey(p.Scope, p.Key)
	if err := s.client.ZRem(ctx, keys[idxDead], rk).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.client.ZAdd(ctx, keys[idxUnknown], goredis.Z{Score: math.Inf(1), Member: rk}).Err(); err != nil {
		t.Fatal(err)
	}
	listed, err := s.ListUnknown(ctx, store.ListUnknownParams{Limit: 10})
	if err != nil || len(listed) != 1 || !listed[0].DeadLettered() {
		t.Fatalf("operator's listing: %v, %v; want the dead-lettered record", listed, err)
	}
	if due, err := s.ListUnknown(ctx, store.ListUnknownParams{DueOnly: true, Limit: 10}); err != nil || len(due) != 0 {
		t.Fatalf("due listing: %v, %v; want nothing", due, err)
	}
	again := store.DeferParams{FenceParams: fence(rec), Attempts: 1, Delay: time.Minute, Error: "again"}
	if err := s.Defer(ctx, again); err != nil {
		t.Fatal(err)
	}
	if n, err := s.client.ZScore(ctx, keys[idxUnknown], rk).Result(); err != goredis.Nil {
		t.Errorf("still in the unknown index at %v (%v)", n, err)
	}
	if _, err := s.client.ZScore(ctx, keys[idxDead], rk).Result(); err != nil {
		t.Errorf("not in the dead index: %v", err)
	}
}

// The owner field ('o') is where the hash keeps Record.Owner: a record
// written before it existed reads as Owner 0, and a terminal record drops
// it. (That a pending record and its claim have none is the conformance
// suite's PendingHasNoOwner.)
func testOwnerField(t *testing.T, open storetest.Opener) {
	s, _ := newTestStore(t, open)
	owned := func(key string, owner int64) store.ReserveParams {
		p := reserveParams(key)
		p.Owner = owner
		return p
	}
	old := mustReserve(t, s, owned("old", 5), store.Created)
	if err := s.client.HDel(ctx, s.recordKey(old.Scope, old.Key), "o").Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, old.Scope, old.Key); err != nil || got.Owner != 0 {
		t.Fatalf("a record without the field: Owner %d (%v), want 0", got.Owner, err)
	}
	done := mustReserve(t, s, owned("done", 6), store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(done), Response: store.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.client.HExists(ctx, s.recordKey(done.Scope, done.Key), "o").Result(); err != nil || n {
		t.Fatalf("a completed record keeps its owner field: %v %v", n, err)
	}
}

// A record that Redis evicted by TTL leaves a terminal-index entry; creating
// a record in the same shard removes it, so the index stays bounded without
// a reaper.
func testEvictedIndexEntryTrimmed(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	p := reserveParams("evicted")
	rec := mustReserve(t, s, p, store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: store.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	shard := shardOf(p.Scope, p.Key)
	term := s.indexKeys(shard)[idxTerm]
	// What the TTL does once expires_at + grace is past.
	if err := s.client.Del(ctx, s.recordKey(p.Scope, p.Key)).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(p.TTL + s.cfg.ExpiryGrace)
	if n, _ := s.client.ZCard(ctx, term).Result(); n != 1 {
		t.Fatalf("terminal index holds %d entries before, want 1", n)
	}
	mustReserve(t, s, reserveParams(keyInShard(p.Scope, shard, p.Key)), store.Created)
	if n, _ := s.client.ZCard(ctx, term).Result(); n != 0 {
		t.Fatalf("terminal index holds %d entries after, want 0", n)
	}
}

func testSweepReapList(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	const n = 20
	recs := make([]store.Record, n)
	for i := range recs {
		recs[i] = mustReserve(t, s, reserveParams(fmt.Sprint("k", i)), store.Created)
	}
	clock.Advance(30 * time.Second)

	// Several sweepers at once: each record moved exactly once, in batches.
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 3})
				if err != nil {
					t.Error(err)
					return
				}
				if len(swept) > 3 {
					t.Errorf("sweep returned %d records over limit 3", len(swept))
				}
				if len(swept) == 0 {
					return
				}
				mu.Lock()
				for _, r := range swept {
					seen[r.Key]++
					if r.State != store.StateUnknown || r.LastError != "lease_expired" {
						t.Errorf("swept record %+v", r)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("swept %d records, want %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Errorf("%s swept %d times", k, c)
		}
	}

	// Defer half of them: DueOnly lists the others, oldest first.
	for i := range n / 2 {
		p := store.DeferParams{FenceParams: store.FenceParams{Scope: recs[i].Scope, Key: recs[i].Key, Fence: recs[i].Fence},
			Attempts: recs[i].ReconcileAttempts, Delay: time.Hour, Error: "provider busy"}
		if err := s.Defer(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	due, err := s.ListUnknown(ctx, store.ListUnknownParams{DueOnly: true, Limit: 100})
	if err != nil || len(due) != n/2 {
		t.Fatalf("due: %d %v", len(due), err)
	}
	all, err := s.ListUnknown(ctx, store.ListUnknownParams{Limit: 100})
	if err != nil || len(all) != n {
		t.Fatalf("all: %d %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].ReconcileAfter.Before(all[i-1].ReconcileAfter) {
			t.Fatalf("ListUnknown not ordered by ReconcileAfter")
		}
	}
	if got, _ := s.ListUnknown(ctx, store.ListUnknownParams{Limit: 4}); len(got) != 4 {
		t.Fatalf("limit 4 listed %d", len(got))
	}
	// Resolve: a quarter completed, a quarter failed.
	for i := range n / 2 {
		p := store.ResolveParams{FenceParams: store.FenceParams{Scope: recs[i].Scope, Key: recs[i].Key, Fence: recs[i].Fence}, To: store.StateFailedRetryable}
		if i%2 == 0 {
			p.To, p.Response = store.StateCompleted, &store.Response{Status: 200, Body: []byte("ok")}
		}
		if err := s.Resolve(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := s.Resolve(ctx, p); !errors.Is(err, store.ErrStateConflict) {
			t.Fatalf("second resolve: %v", err)
		}
	}
	if err := s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: "x", Key: "absent", Fence: 1}, To: store.StateFailedRetryable}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("resolve absent: %v", err)
	}

	// Past expires_at: terminal ones are deleted, open ones abandoned, in
	// bounded batches.
	clock.Advance(25 * time.Hour)
	abandoned := store.Response{Status: 500, Body: []byte("abandoned")}
	var total store.ReapResult
	for {
		res, err := s.Reap(ctx, store.ReapParams{Limit: 7, Abandoned: abandoned, AbandonedTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if res.Deleted+res.Abandoned > 7 {
			t.Fatalf("reap changed %+v over limit 7", res)
		}
		if res.Deleted+res.Abandoned == 0 {
			break
		}
		total.Deleted += res.Deleted
		total.Abandoned += res.Abandoned
	}
	if total.Deleted != n/2 || total.Abandoned != n/2 {
		t.Fatalf("reaped %+v", total)
	}
	for i, r := range recs {
		got, err := s.Get(ctx, r.Scope, r.Key)
		if i < n/2 {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s: %v %+v", r.Key, err, got)
			}
			continue
		}
		if err != nil || got.State != store.StateCompleted || got.LastError != "abandoned" || string(got.Response.Body) != "abandoned" {
			t.Errorf("%s: %v %+v", r.Key, err, got)
		}
	}
	checkIndexes(t, s)
}

func testSoftReap(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	p := reserveParams("soft")
	rec := mustReserve(t, s, p, store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: store.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(p.TTL)
	res, err := s.Reap(ctx, store.ReapParams{Limit: 10, Soft: true, Abandoned: store.Response{Status: 500}})
	if err != nil || res.Deleted != 1 {
		t.Fatalf("soft reap: %+v %v", res, err)
	}
	if got, _ := s.Get(ctx, p.Scope, p.Key); got.State != store.StateExpired {
		t.Fatalf("soft reaped: %+v", got)
	}
	if res, _ := s.Reap(ctx, store.ReapParams{Limit: 10, Soft: true, Abandoned: store.Response{Status: 500}}); res.Deleted != 0 {
		t.Fatalf("expired record reaped twice: %+v", res)
	}
	if got := mustReserve(t, s, p, store.Created); got.Fence != clock.Now().UnixMicro() {
		t.Fatalf("over soft-expired: %+v", got)
	}
	checkIndexes(t, s)
}

// Without Config.Clock the store uses the Redis server's TIME.
func testServerClock(t *testing.T, open storetest.Opener) {
	s := open(t, nil).(*Store)
	before := time.Now()
	rec := mustReserve(t, s, reserveParams("server-clock"), store.Created)
	if d := rec.CreatedAt.Sub(before); d < -5*time.Second || d > 5*time.Second {
		t.Fatalf("created_at %v is far from local time %v", rec.CreatedAt, before)
	}
	if !rec.LockedUntil.Equal(rec.CreatedAt.Add(30*time.Second)) || rec.CreatedAt.Location() != time.UTC {
		t.Fatalf("record %+v", rec)
	}
	if err := s.Extend(ctx, store.ExtendParams{FenceParams: fence(rec), Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10}); err != nil || len(swept) != 0 {
		t.Fatalf("sweep of a live lease: %v %v", swept, err)
	}
}

// After the server's script cache is flushed, single calls and pipelined
// batches fall back to EVAL.
func testScriptCacheFlushed(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	rec := mustReserve(t, s, reserveParams("flush"), store.Created)
	if err := s.client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10})
	if err != nil || len(swept) != 1 || swept[0].Key != rec.Key {
		t.Fatalf("sweep after flush: %v %v", swept, err)
	}
	if err := s.client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, reserveParams("flush2"), store.Created)
}

func testInvalidParams(t *testing.T, open storetest.Opener) {
	s, _ := newTestStore(t, open)
	for name, err := range map[string]error{
		"reserve":  func() error { _, err := s.Reserve(ctx, store.ReserveParams{Scope: "s"}); return err }(),
		"complete": s.Complete(ctx, store.CompleteParams{}),
		"sweep":    func() error { _, err := s.SweepExpiredLeases(ctx, store.SweepParams{}); return err }(),
		"reap":     func() error { _, err := s.Reap(ctx, store.ReapParams{Limit: 1}); return err }(),
		"list":     func() error { _, err := s.ListUnknown(ctx, store.ListUnknownParams{}); return err }(),
		"get":      func() error { _, err := s.Get(ctx, "", "k"); return err }(),
		"resolve":  s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: 1}, To: store.StateCompleted}),
	} {
		if !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := s.Get(ctx, "s", "absent"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get absent: %v", err)
	}
	if err := s.Delete(ctx, store.DeleteParams{Scope: "s", Key: "absent"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("delete absent: %v", err)
	}
	if _, err := New(s.client, Config{Prefix: "a{b"}); err == nil {
		t.Error("prefix with a brace accepted")
	}
}

// Every key of one record shares the record's hash tag; different records
// spread over the shards.
func TestKeyLayout(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{})
	defer client.Close()
	s, err := New(client, Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys := s.scriptKeys("scope}{", "key{}")
	tag := keys[4][strings.Index(keys[4], "{") : strings.Index(keys[4], "}")+1]
	for _, k := range keys {
		if !strings.HasPrefix(k, "idem:"+tag) {
			t.Errorf("%q does not start with the tag %q", k, tag)
		}
	}
	if s.recordKey("a", "bc") == s.recordKey("ab", "c") {
		t.Error("(a, bc) and (ab, c) share a key")
	}
	shards := map[int]bool{}
	for i := range 10000 {
		shards[shardOf("scope", fmt.Sprint(i))] = true
	}
	if len(shards) != shardCount {
		t.Errorf("10000 keys used %d of %d shards", len(shards), shardCount)
	}
}

func TestClusterURL(t *testing.T) {
	for in, want := range map[string]string{
		"h1:7000":                              "redis://h1:7000",
		"h1:7000,h2:7001,h3:7002":              "redis://h1:7000/?addr=h2%3A7001&addr=h3%3A7002",
		"u:p@h1:7000,h2:7001/?dial_timeout=3s": "redis://u:p@h1:7000/?addr=h2%3A7001&dial_timeout=3s",
	} {
		got, err := clusterURL("redis", in)
		if err != nil || got != want {
			t.Errorf("clusterURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "h1:7000/1", "h1:7000,,h2:7001"} {
		if _, err := clusterURL("redis", bad); err == nil {
			t.Errorf("clusterURL(%q) accepted", bad)
		}
	}
	opts, err := goredis.ParseClusterURL("redis://u:p@h1:7000/?addr=h2%3A7001&dial_timeout=3s")
	if err != nil || len(opts.Addrs) != 2 || opts.Password != "p" || opts.DialTimeout != 3*time.Second {
		t.Errorf("parsed %+v %v", opts, err)
	}
}

// Background scans return the globally oldest entries even when one shard
// holds more of them than the first round's page.
func testCandidatePages(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	const scope = "tenant POST /pay"
	crowded := shardOf(scope, "seed")
	var order []string // keys, oldest lease first
	used := map[string]bool{}
	for i := range 60 {
		var key string
		if i%4 == 3 {
			key = fmt.Sprint("spread-", i) // most likely another shard
		} else {
			for j := 0; ; j++ {
				key = fmt.Sprint("crowded-", j)
				if !used[key] && shardOf(scope, key) == crowded {
					break
				}
			}
		}
		used[key] = true
		p := reserveParams(key)
		p.Lease = time.Minute
		mustReserve(t, s, p, store.Created)
		order = append(order, key)
		clock.Advance(time.Second)
	}
	clock.Advance(time.Hour)
	for _, limit := range []int{1, 25, 30} {
		swept, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(swept) != limit {
			t.Fatalf("limit %d swept %d", limit, len(swept))
		}
		for i, r := range swept {
			if r.Key != order[i] {
				t.Fatalf("limit %d: swept[%d] = %s, want %s", limit, i, r.Key, order[i])
			}
		}
		order = order[limit:]
	}
	if swept, _ := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 100}); len(swept) != len(order) {
		t.Fatalf("last sweep moved %d, want %d", len(swept), len(order))
	}
	all, err := s.ListUnknown(ctx, store.ListUnknownParams{Limit: 45})
	if err != nil || len(all) != 45 {
		t.Fatalf("list: %d %v", len(all), err)
	}
	checkIndexes(t, s)
}

// In-progress records past expires_at whose holders still renew are not
// reap candidates at all, so they cannot fill a batch and starve the
// records the reaper must close.
func testLiveLeasesDoNotFillReapBatch(t *testing.T, open storetest.Opener) {
	s, clock := newTestStore(t, open)
	var live []store.Record
	for i := range 5 {
		live = append(live, mustReserve(t, s, reserveParams(fmt.Sprint("live-", i)), store.Created))
	}
	for i := range 5 {
		r := mustReserve(t, s, reserveParams(fmt.Sprint("dead-", i)), store.Created)
		if err := s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fence(r), Error: "timeout"}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(24*time.Hour - time.Second)
	for _, r := range live {
		if err := s.Extend(ctx, store.ExtendParams{FenceParams: fence(r), Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Minute)
	p := store.ReapParams{Limit: 5, Abandoned: store.Response{Status: 500}, AbandonedTTL: time.Hour}
	if res, err := s.Reap(ctx, p); err != nil || res.Abandoned != 5 {
		t.Fatalf("reap: %+v %v", res, err)
	}
	if res, err := s.Reap(ctx, p); err != nil || res != (store.ReapResult{}) {
		t.Fatalf("reap of live holders: %+v %v", res, err)
	}
	clock.Advance(time.Hour)
	if res, err := s.Reap(ctx, p); err != nil || res.Abandoned != 5 {
		t.Fatalf("reap once the holders died: %+v %v", res, err)
	}
	checkIndexes(t, s)
}

// A Reap call steps over up to (reapRounds-1)*Limit records its grace
// spares: with that many first in the indexes, it still reaps the record
// after them; with one more, it comes back short, and reaps it at the next
// call once the grace has passed. The cases share one database, and one
// that fails leaves records the next would reap: it ends the test.
func testReapSparedBound(t *testing.T, open storetest.Opener) {
	for _, spared := range []int{reapRounds - 1, reapRounds} {
		ok := t.Run(fmt.Sprint(spared, " spared"), func(t *testing.T) {
			s, clock := newTestStore(t, open)
			var held []store.Record
			for i := range spared {
				held = append(held, mustReserve(t, s, reserveParams(fmt.Sprint(spared, "-held-", i)), store.Created))
			}
			clock.Advance(time.Minute)
			done := mustReserve(t, s, reserveParams(fmt.Sprint(spared, "-done")), store.Created)
			if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(done), Response: store.Response{Status: 201}}); err != nil {
				t.Fatal(err)
			}
			// The holders' leases end past their expiry, before done
			// expires.
			clock.Advance(24*time.Hour - 2*time.Minute)
			for _, r := range held {
				if err := s.Extend(ctx, store.ExtendParams{FenceParams: fence(r), Lease: time.Minute + time.Second}); err != nil {
					t.Fatal(err)
				}
			}
			clock.Advance(2 * time.Minute)
			p := store.ReapParams{Limit: 1, Grace: time.Hour, Abandoned: store.Response{Status: 504}, AbandonedTTL: time.Hour}
			want := store.ReapResult{Deleted: 1}
			if spared > reapRounds-1 {
				want = store.ReapResult{}
			}
			if res, err := s.Reap(ctx, p); err != nil || res != want {
				t.Fatalf("Reap(Limit 1) behind %d spared records: %+v %v, want %+v", spared, res, err, want)
			}
			for _, r := range held {
				if got, err := s.Get(ctx, r.Scope, r.Key); err != nil || got.State != store.StateInProgress {
					t.Fatalf("spared %s: %s %v", r.Key, got.State, err)
				}
			}
			clock.Advance(time.Hour)
			p.Limit = spared + 1
			want = store.ReapResult{Deleted: 1 - want.Deleted, Abandoned: spared}
			if res, err := s.Reap(ctx, p); err != nil || res != want {
				t.Fatalf("Reap once the grace passed: %+v %v, want %+v", res, err, want)
			}
			checkIndexes(t, s)
		})
		if !ok {
			return
		}
	}
}

// IDEM_TEST_REDIS_ADDR may name a database (host:port/DB): the tests then
// keep their keys in it, off a server's database 0.
func TestTestServerDatabase(t *testing.T) {
	opts, _ := redisServer(t) // skips without a server
	t.Setenv(testenv.RedisEnv, opts.Addr+"/5")
	opener := singleNode(t)
	s := opener(t, nil)
	p := store.ReserveParams{Scope: "s", Key: "db-5", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown}
	if _, err := s.Reserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	count := func(db int) int {
		c := goredis.NewClient(&goredis.Options{Addr: opts.Addr, DB: db})
		defer c.Close()
		n := 0
		iter := c.Scan(ctx, 0, s.(*Store).cfg.Prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			n++
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if in5, in0 := count(5), count(0); in5 == 0 || in0 != 0 {
		t.Errorf("the record's keys: %d in database 5, %d in database 0; want them all in 5", in5, in0)
	}
}
