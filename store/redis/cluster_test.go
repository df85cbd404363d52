package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// TestCluster runs the conformance suite and the store's own tests against
// a real three-master Redis Cluster.
func TestCluster(t *testing.T) {
	cl := startCluster(t, 3)
	newDatabase := func(t *testing.T) storetest.Opener {
		prefix := freshPrefix(t, cl.client(t))
		return func(t *testing.T, clock store.Clock) store.Store {
			s, err := Open(context.Background(), cl.url(), Config{Clock: clock, Prefix: prefix})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
	}
	t.Run("Conformance", func(t *testing.T) {
		t.Parallel()
		// Durable as for a single node: a new client on the running cluster
		// sees every record; restarting the servers is not covered.
		storetest.Run(t, storetest.Harness{NewDatabase: newDatabase, Durable: true, Shared: true, NoTenantCap: true, NoActiveCount: true})
	})
	t.Run("Store", func(t *testing.T) {
		t.Parallel()
		runStoreTests(t, newDatabase)
	})
	t.Run("SameSlot", func(t *testing.T) {
		t.Parallel()
		testClusterSameSlot(t, cl)
	})
	t.Run("ConcurrentAcrossSlots", func(t *testing.T) {
		t.Parallel()
		testClusterConcurrent(t, cl, newDatabase)
	})
	t.Run("Durability", func(t *testing.T) {
		t.Parallel()
		testClusterDurability(t, cl)
	})
	t.Run("LostReply", func(t *testing.T) {
		t.Parallel()
		hook := &loseReply{}
		var d net.Dialer
		cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.addrs, Dialer: hook.DialHook(d.DialContext)})
		t.Cleanup(func() { _ = cc.Close() })
		testLostReply(t, cc, freshPrefix(t, cc), hook)
	})
}

// The durability check asks every master (the test cluster keeps nothing
// across a restart: at risk), and a write waiting for a replica is sent
// with its WAIT to the master of its keys (none has a replica here: the
// write fails, saying so).
func testClusterDurability(t *testing.T, cl *testCluster) {
	prefix := freshPrefix(t, cl.client(t))
	s, err := Open(context.Background(), cl.url(), Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := s.CheckDurability(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.DurabilityAtRisk || d.Replicas != 0 || len(d.Warnings) != 3 {
		t.Errorf("cluster of 3 masters without persistence: %v %q, want at risk with one warning per master", d, d.Warnings)
	}
	w, err := Open(context.Background(), cl.url(), Config{Prefix: prefix, WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 5 { // keys on several masters
		_, err := w.Reserve(ctx, store.ReserveParams{Scope: "s", Key: fmt.Sprint("wait-", i), Fingerprint: "f",
			Lease: time.Second, TTL: time.Minute, LeasePolicy: store.LeaseUnknown})
		if err == nil || !strings.Contains(err.Error(), "0 of 1 replica(s)") {
			t.Fatalf("Reserve waiting for a replica on a cluster without replicas: %v", err)
		}
	}
	// Sync writes its marker on every master, each waiting for a replica.
	if err := w.Sync(ctx); err == nil || !store.IsRetryable(err) || !strings.Contains(err.Error(), "0 of 1 replica(s)") {
		t.Fatalf("Sync on a cluster without replicas: %v, want a retryable error saying 0 of 1", err)
	}
	var masters atomic.Int64 // ForEachMaster calls it on every master at once
	err = cl.client(t).ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
		keys, err := m.Keys(ctx, prefix+"*sync").Result()
		if err == nil && len(keys) != 1 {
			err = fmt.Errorf("master %s holds markers %q, want one", m.Options().Addr, keys)
		}
		masters.Add(1)
		return err
	})
	if err != nil || masters.Load() != 3 {
		t.Fatalf("Sync's markers on %d masters: %v", masters.Load(), err)
	}
}

// The server's own hashing puts all keys of a record in one slot.
func testClusterSameSlot(t *testing.T, cl *testCluster) {
	cc := cl.client(t)
	s, err := New(cc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	slots := map[int64]bool{}
	for i := range 50 {
		keys := s.scriptKeys("tenant POST /x", fmt.Sprint("key{", i, "}"))
		first, err := cc.ClusterKeySlot(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys[1:] {
			if slot, err := cc.ClusterKeySlot(ctx, k).Result(); err != nil || slot != first {
				t.Fatalf("%q in slot %d, %q in slot %d (%v)", keys[0], first, k, slot, err)
			}
		}
		slots[first] = true
	}
	if len(slots) < 20 {
		t.Errorf("50 records used only %d slots", len(slots))
	}
}

// Many keys, many goroutines, each its own client (as separate processes):
// every key has exactly one winner, and the records landed on every master.
func testClusterConcurrent(t *testing.T, cl *testCluster, newDatabase func(*testing.T) storetest.Opener) {
	open := newDatabase(t)
	const keys, workers = 300, 12
	clock := storetest.NewClock()
	stores := make([]store.Store, workers)
	for i := range stores {
		stores[i] = open(t, clock.Now)
	}
	var created [keys]atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			order := rand.Perm(keys)
			for _, k := range order {
				p := reserveParams(fmt.Sprint("key-", k))
				res, err := stores[w].Reserve(ctx, p)
				if err != nil {
					t.Error(err)
					return
				}
				switch res.Outcome {
				case store.Created:
					created[k].Add(1)
					if err := stores[w].Complete(ctx, store.CompleteParams{FenceParams: fence(res.Record), Response: store.Response{Status: 201, Body: []byte(p.Key)}}); err != nil {
						t.Error(err)
					}
				case store.Existing:
					if st := res.Record.State; st != store.StateInProgress && st != store.StateCompleted {
						t.Errorf("%s: loser saw %s", p.Key, st)
					}
				default:
					t.Errorf("%s: outcome %v", p.Key, res.Outcome)
				}
			}
		})
	}
	wg.Wait()
	for k := range created {
		if n := created[k].Load(); n != 1 {
			t.Errorf("key-%d: %d winners", k, n)
		}
	}
	// Every replay now returns the stored response.
	for k := range keys {
		p := reserveParams(fmt.Sprint("key-", k))
		res, err := stores[k%workers].Reserve(ctx, p)
		if err != nil || res.Outcome != store.Existing || res.Record.Response == nil || string(res.Record.Response.Body) != p.Key {
			t.Fatalf("replay %s: %+v %v", p.Key, res, err)
		}
	}

	prefix := stores[0].(*Store).cfg.Prefix
	var mu sync.Mutex
	perMaster := map[string]int{}
	err := cl.client(t).ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
		n, err := countPrefix(ctx, c, prefix)
		mu.Lock()
		perMaster[c.Options().Addr] = n
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(perMaster) != 3 {
		t.Fatalf("masters: %v", perMaster)
	}
	for addr, n := range perMaster {
		if n == 0 {
			t.Errorf("no key landed on master %s (%v)", addr, perMaster)
		}
	}
	t.Logf("keys per master: %v", perMaster)

	// The background scans reach every master.
	clock.Advance(25 * time.Hour)
	res, err := stores[0].Reap(ctx, store.ReapParams{Limit: keys, Abandoned: store.Response{Status: 500}})
	if err != nil || res.Deleted != keys {
		t.Fatalf("reap: %+v %v", res, err)
	}
}
