package memory

import (
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net/http"
	"reflect"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"
	"unsafe"

	"pgregory.net/rapid"

	"github.com/idem-go/idem/store"
)

// TestColdMatchesEntries runs random sequences of every call against two
// stores on one clock: one that keeps completed records cold, with every
// key hashing alike so that each lookup walks a chain, and one that keeps
// every record an entry. Every answer must be the same, and the cold
// records' structure sound after each step (check).
func TestColdMatchesEntries(t *testing.T) {
	madeCold := false
	rapid.Check(t, func(rt *rapid.T) {
		now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
		clock := func() time.Time { return now }
		cold, plain := New(Config{Clock: clock}), New(Config{Clock: clock})
		cold.cold.collide = true
		// Chunks of a few records, compacted whenever they are more than
		// twice (and a quarter) the records' size: records move between
		// chunks often.
		cold.cold.size, cold.cold.maxText, cold.cold.slack = 64, 64, 0
		cold.cold.maxHeaders = 1 // the other headers are kept in the records' text
		plain.cold.disabled = true
		ctx := context.Background()
		keys := []string{"a", "b", "c", "d"}
		scopes := []string{"s1", "s2"}
		fences := map[id]int64{}
		queue := "q"
		same := func(what string, a, b any) {
			if !reflect.DeepEqual(a, b) {
				rt.Fatalf("%s: cold store %#v, entries %#v", what, a, b)
			}
		}
		sameErr := func(what string, a, b error) {
			if (a == nil) != (b == nil) || (a != nil && a.Error() != b.Error()) {
				rt.Fatalf("%s: cold store %v, entries %v", what, a, b)
			}
		}
		// both runs f on each store: answers and errors must be the same.
		both := func(what string, f func(s *Store) (any, error)) any {
			a, errA := f(cold)
			b, errB := f(plain)
			sameErr(what, errA, errB)
			same(what, a, b)
			return a
		}
		fenced := func(k id) store.FenceParams { return store.FenceParams{Scope: k.scope, Key: k.key, Fence: fences[k]} }
		pick := func() id {
			return id{rapid.SampledFrom(scopes).Draw(rt, "scope"), rapid.SampledFrom(keys).Draw(rt, "key")}
		}
		// reserveBoth reserves k in both stores, and reports whether the
		// call acquired it (its fence noted for the calls that follow).
		reserveBoth := func(rt *rapid.T, k id) bool {
			p := reserve(rt, k, time.Minute)
			a := both("reserve", func(s *Store) (any, error) { return s.Reserve(ctx, p) }).(store.ReserveResult)
			if !a.Outcome.Acquired() {
				return false // refused (an error) or found
			}
			fences[k] = a.Record.Fence
			return true
		}
		completeBoth := func(rt *rapid.T, k id) {
			p := store.CompleteParams{FenceParams: fenced(k), Response: answer(rt), TTL: time.Duration(rapid.IntRange(0, 2).Draw(rt, "ttl")) * time.Hour}
			both("complete", func(s *Store) (any, error) { return nil, s.Complete(ctx, p) })
		}
		rt.Repeat(map[string]func(*rapid.T){
			"reserve": func(rt *rapid.T) { reserveBoth(rt, pick()) },
			"complete": func(rt *rapid.T) {
				k := pick()
				if r, err := plain.Get(ctx, k.scope, k.key); err == nil && rapid.Bool().Draw(rt, "current") {
					fences[k] = r.Fence // most completions are the holder's
				}
				completeBoth(rt, k)
			},
			"request": func(rt *rapid.T) {
				// A request as the engine makes it: reserved, then completed.
				k := pick()
				if reserveBoth(rt, k) {
					completeBoth(rt, k)
				}
			},
			"release": func(rt *rapid.T) {
				k := pick()
				p := store.ReleaseParams{FenceParams: fenced(k), Error: "e"}
				both("release", func(s *Store) (any, error) { return nil, s.Release(ctx, p) })
			},
			"checkpoint": func(rt *rapid.T) {
				k := pick()
				p := store.CheckpointParams{FenceParams: fenced(k), RecoveryPoint: "p"}
				both("checkpoint", func(s *Store) (any, error) { return nil, s.Checkpoint(ctx, p) })
			},
			"get": func(rt *rapid.T) {
				k := pick()
				both("get", func(s *Store) (any, error) { return s.Get(ctx, k.scope, k.key) })
			},
			"delete": func(rt *rapid.T) {
				k := pick()
				p := store.DeleteParams{Scope: k.scope, Key: k.key}
				if rapid.Bool().Draw(rt, "fenced") {
					p.Fence = fences[k] // an older fence once the key ran again
				}
				both("delete", func(s *Store) (any, error) { return nil, s.Delete(ctx, p) })
			},
			"list": func(rt *rapid.T) {
				p := store.ListParams{Limit: 100, ScopePrefix: rapid.SampledFrom([]string{"", "s1"}).Draw(rt, "prefix")}
				a := both("list", func(s *Store) (any, error) { r, _, err := s.List(ctx, p); return r, err }).([]store.Record)
				seen := map[*store.Response]bool{}
				for _, r := range a {
					if r.Response != nil && seen[r.Response] {
						rt.Fatalf("two listed records share one response: %+v", r)
					}
					seen[r.Response] = true
				}
			},
			"reap": func(rt *rapid.T) {
				p := store.ReapParams{Limit: rapid.IntRange(1, 3).Draw(rt, "limit"), Soft: rapid.Bool().Draw(rt, "soft"),
					Abandoned: store.Response{Status: 500}, AbandonedTTL: time.Hour}
				both("reap", func(s *Store) (any, error) { return s.Reap(ctx, p) })
			},
			"sweep": func(rt *rapid.T) {
				p := store.SweepParams{Limit: 10}
				both("sweep", func(s *Store) (any, error) { return s.SweepExpiredLeases(ctx, p) })
			},
			"count": func(rt *rapid.T) {
				both("count", func(s *Store) (any, error) { return s.CountActive(ctx, 100) })
			},
			"pending": func(rt *rapid.T) {
				k := pick()
				p := store.PendingParams{ReserveParams: reserve(rt, k, time.Duration(rapid.IntRange(1, 90).Draw(rt, "lease"))*time.Minute),
					Request: store.PendingRequest{Queue: queue, Method: "POST", Target: "/x", Body: []byte("req")}}
				both("pending", func(s *Store) (any, error) { return s.ReservePending(ctx, p) })
			},
			"claim": func(rt *rapid.T) {
				p := store.ClaimParams{Queue: queue, Limit: rapid.IntRange(1, 3).Draw(rt, "limit"), Lease: time.Minute}
				a, _ := both("claim", func(s *Store) (any, error) { return s.Claim(ctx, p) }).([]store.Record)
				for _, r := range a {
					fences[id{r.Scope, r.Key}] = r.Fence
				}
			},
			"expirePending": func(rt *rapid.T) {
				p := store.ExpirePendingParams{Limit: 3, Response: answer(rt), TTL: time.Duration(rapid.IntRange(0, 1).Draw(rt, "ttl")) * time.Hour}
				both("expirePending", func(s *Store) (any, error) { return s.ExpirePending(ctx, p) })
			},
			"markUnknown": func(rt *rapid.T) {
				k := pick()
				p := store.ReleaseParams{FenceParams: fenced(k), Error: "u"}
				both("markUnknown", func(s *Store) (any, error) { return nil, s.MarkUnknown(ctx, p) })
			},
			"extend": func(rt *rapid.T) {
				k := pick()
				p := store.ExtendParams{FenceParams: fenced(k), Lease: time.Hour}
				both("extend", func(s *Store) (any, error) { return nil, s.Extend(ctx, p) })
			},
			"resolve": func(rt *rapid.T) {
				k := pick()
				f := fences[k]
				if r, err := plain.Get(ctx, k.scope, k.key); err == nil && rapid.Bool().Draw(rt, "current") {
					f = r.Fence
				}
				if f == 0 {
					f = 1
				}
				p := store.ResolveParams{FenceParams: store.FenceParams{Scope: k.scope, Key: k.key, Fence: f},
					To:  rapid.SampledFrom([]store.State{store.StateCompleted, store.StateFailedRetryable}).Draw(rt, "to"),
					TTL: time.Duration(rapid.IntRange(0, 1).Draw(rt, "ttl")) * time.Hour}
				if p.To == store.StateCompleted {
					resp := answer(rt)
					p.Response = &resp
				}
				both("resolve", func(s *Store) (any, error) { return nil, s.Resolve(ctx, p) })
			},
			"defer": func(rt *rapid.T) {
				k := pick()
				f, attempts := fences[k], rapid.IntRange(0, 2).Draw(rt, "attempts")
				if r, err := plain.Get(ctx, k.scope, k.key); err == nil && rapid.Bool().Draw(rt, "current") {
					f, attempts = r.Fence, r.ReconcileAttempts
				}
				p := store.DeferParams{FenceParams: store.FenceParams{Scope: k.scope, Key: k.key, Fence: max(f, 1)}, Attempts: attempts,
					Delay: time.Minute, Error: "d", DeadLetter: rapid.Bool().Draw(rt, "dead")}
				both("defer", func(s *Store) (any, error) { return nil, s.Defer(ctx, p) })
			},
			"listUnknown": func(rt *rapid.T) {
				p := store.ListUnknownParams{Limit: 10, DueOnly: rapid.Bool().Draw(rt, "due")}
				both("listUnknown", func(s *Store) (any, error) { return s.ListUnknown(ctx, p) })
			},
			"getAll": func(rt *rapid.T) {
				for _, sc := range scopes {
					for _, key := range keys {
						both("getAll", func(s *Store) (any, error) { return s.Get(ctx, sc, key) })
					}
				}
			},
			"time": func(rt *rapid.T) {
				now = now.Add(time.Duration(rapid.IntRange(1, 240).Draw(rt, "minutes")) * time.Minute)
			},
			"": func(rt *rapid.T) {
				if n, m := cold.count(), plain.count(); n != m {
					rt.Fatalf("cold store counts %d records, entries %d", n, m)
				}
				if plain.cold.n != 0 {
					rt.Fatal("the store without cold records made one")
				}
				if cold.cold.n > 0 {
					madeCold = true
				}
				if err := cold.check(); err != nil {
					rt.Fatal(err)
				}
			},
		})
	})
	if !madeCold {
		t.Fatal("no run made a cold record")
	}
}

// answer draws a response: bodies none, empty, small, and too large to be
// cold; header maps of their own each time (as an engine's are), with
// empty and nil values among them.
func answer(rt *rapid.T) store.Response {
	headers := []http.Header{nil, {"Content-Type": {"application/json"}}, {"Content-Type": {"text/plain"}, "X-A": {"1", "2"}},
		{"X-Empty": {}}, {"X-Empty": nil}, {}}
	body := [][]byte{nil, {}, []byte("ab"), make([]byte, 15000)}[rapid.IntRange(0, 3).Draw(rt, "body")]
	return store.Response{Status: rapid.SampledFrom([]int{200, 201, 500}).Draw(rt, "status"),
		Header: headers[rapid.IntRange(0, len(headers)-1).Draw(rt, "header")], Body: body,
		BodyOmitted: body == nil && rapid.Bool().Draw(rt, "omitted")}
}

// reserve draws the parameters of a reservation of k with lease.
func reserve(rt *rapid.T, k id, lease time.Duration) store.ReserveParams {
	p := store.ReserveParams{Scope: k.scope, Key: k.key, Fingerprint: rapid.SampledFrom([]string{"f1", "f2"}).Draw(rt, "fp"),
		Lease: lease, TTL: time.Duration(rapid.IntRange(1, 3).Draw(rt, "ttl")) * time.Hour,
		LeasePolicy: rapid.SampledFrom([]store.LeasePolicy{store.LeaseUnknown, store.LeaseRetry}).Draw(rt, "policy"),
		Tenant:      rapid.SampledFrom([]string{"t1", "t2"}).Draw(rt, "tenant")}
	if rapid.Bool().Draw(rt, "capped") {
		p.MaxActive = 2
	}
	return p
}

// check checks the cold records' structure: every chain holds slots of
// its hash and the scope's count of them, every slot is in one chain or
// free, and the tenant index holds entries only.
func (s *Store) check() error {
	inChain := map[int32]bool{}
	for _, rs := range s.scopes {
		n := 0
		for h, head := range rs.cold {
			if head < 0 {
				return fmt.Errorf("scope %q: an empty chain for hash %x", rs.scope, h)
			}
			for i := head; i >= 0; i = s.cold.at(i).next {
				if sl := s.cold.at(i); sl.hash != h || s.cold.hash(s.cold.key(i)) != h {
					return fmt.Errorf("scope %q: slot %d of hash %x in the chain of %x", rs.scope, i, sl.hash, h)
				}
				if _, hot := rs.byKey[s.cold.key(i)]; hot {
					return fmt.Errorf("scope %q: key %q both cold and an entry", rs.scope, s.cold.key(i))
				}
				inChain[i] = true
				n++
			}
		}
		if n != rs.frozen {
			return fmt.Errorf("scope %q: %d cold records in its chains, %d counted", rs.scope, n, rs.frozen)
		}
	}
	live, held := 0, 0
	perChunk := map[int32]int{}
	for i := range inChain {
		sl := s.cold.at(i)
		live += int(sl.size())
		perChunk[sl.chunk] += int(sl.size())
	}
	for i, ch := range s.cold.chunks {
		held += cap(ch.b)
		if ch.live != perChunk[int32(i)] {
			return fmt.Errorf("chunk %d counts %d live bytes, its records hold %d", i, ch.live, perChunk[int32(i)])
		}
		if ch.b == nil && ch.live != 0 {
			return fmt.Errorf("chunk %d dropped with %d live bytes", i, ch.live)
		}
	}
	if live != s.cold.live || held != s.cold.held {
		return fmt.Errorf("live %d and held %d bytes counted, %d and %d found", s.cold.live, s.cold.held, live, held)
	}
	if held > 2*live+max(s.cold.slack, live/4)+s.cold.size {
		return fmt.Errorf("chunks of %d bytes for records of %d: not compacted", held, live)
	}
	if len(inChain)+len(s.cold.free) != int(s.cold.n) {
		return fmt.Errorf("%d slots in chains and %d free, of %d", len(inChain), len(s.cold.free), int(s.cold.n))
	}
	for _, t := range s.tenants {
		for k, e := range t {
			if e.frozen || s.hot(k) != e {
				return fmt.Errorf("the tenant index holds %v, which is not the store's entry", k)
			}
		}
	}
	return nil
}

// complete reserves and completes key in scope with body and header.
func complete(t *testing.T, s *Store, scope, key string, body []byte, h http.Header) {
	t.Helper()
	ctx := t.Context()
	res, err := s.Reserve(ctx, store.ReserveParams{Scope: scope, Key: key, Fingerprint: "fp-" + key,
		Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: scope, Key: key, Fence: res.Record.Fence},
		Response: store.Response{Status: 201, Header: h, Body: body}})
	if err != nil {
		t.Fatal(err)
	}
}

// TestColdRecordsAreNotTraced checks what cold records cost the garbage
// collector: completed records add almost no bytes it must scan and no
// objects, where each was two objects and some 130 scanned bytes as an
// entry.
func TestColdRecordsAreNotTraced(t *testing.T) {
	const n = 20000
	s := New(Config{})
	h := http.Header{"Content-Type": {"application/json"}}
	scan := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}, {Name: "/gc/heap/objects:objects"}}
	runtime.GC()
	metrics.Read(scan)
	scan0, objects0 := scan[0].Value.Uint64(), scan[1].Value.Uint64()
	for i := range n {
		complete(t, s, "POST /v1/charges", fmt.Sprintf("key-%d", i), []byte(`{"id":"ch_1"}`), h)
	}
	runtime.GC()
	metrics.Read(scan)
	scanned := (float64(scan[0].Value.Uint64()) - float64(scan0)) / n
	objects := (float64(scan[1].Value.Uint64()) - float64(objects0)) / n
	if rs := s.scopes["POST /v1/charges"]; rs == nil || rs.frozen != n || len(rs.byKey) != 0 {
		t.Fatalf("the completed records are not all cold: %+v", rs)
	}
	// Bounds well above what the cold records cost (about 0.1 byte and
	// 0.004 objects per record: the growing slices), and well below what
	// entries cost.
	if scanned > 8 || objects > 0.1 {
		t.Errorf("per completed record: %.2f bytes to scan, %.3f objects; want at most 8 and 0.1", scanned, objects)
	}
	runtime.KeepAlive(s)
}

// TestColdLimits checks what the cold records hold: an answer larger than
// maxColdText stays an entry; answers whose headers differ each time are
// cold, the first maxHeaders with their header interned and the others
// with it in their text, and each reads back its own.
func TestColdLimits(t *testing.T) {
	s := New(Config{})
	complete(t, s, "s", "big", make([]byte, maxColdText), nil)
	header := func(i int) http.Header {
		return http.Header{"Location": {fmt.Sprint("/v1/charges/", i)}, "Vary": {"Accept", ""}, "X-None": nil}
	}
	for i := range maxHeaders + 2 {
		complete(t, s, "s", fmt.Sprintf("h%d", i), []byte("body"), header(i))
	}
	rs := s.scopes["s"]
	if _, ok := rs.byKey["big"]; !ok {
		t.Error("a record larger than maxColdText is cold")
	}
	if rs.frozen != maxHeaders+2 || len(rs.byKey) != 1 || len(s.cold.headers) != maxHeaders {
		t.Errorf("%d cold records, %d entries, %d headers interned; want %d, 1, %d", rs.frozen, len(rs.byKey), len(s.cold.headers), maxHeaders+2, maxHeaders)
	}
	inline := 0
	for i := range maxHeaders + 2 {
		k := fmt.Sprintf("h%d", i)
		if s.cold.at(s.cold.find(rs, k)).header == inlineHeader {
			inline++
		}
		r, err := s.Get(t.Context(), "s", k)
		if err != nil || r.Fingerprint != "fp-"+k || string(r.Response.Body) != "body" || !reflect.DeepEqual(r.Response.Header, header(i)) {
			t.Errorf("Get %s: %+v, %v", k, r, err)
		}
	}
	if inline != 2 {
		t.Errorf("%d headers kept in the records' text, want 2", inline)
	}
	if r, err := s.Get(t.Context(), "s", "big"); err != nil || r.Response == nil {
		t.Errorf("Get big: %+v, %v", r, err)
	}
	// Listed, and made an entry again, the inline header reads the same.
	listed := 0
	for p := (store.ListParams{Limit: 1000}); ; {
		page, next, err := s.List(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			var i int
			if _, err := fmt.Sscanf(r.Key, "h%d", &i); err == nil && !reflect.DeepEqual(r.Response.Header, header(i)) {
				t.Errorf("listed %s with header %v", r.Key, r.Response.Header)
			}
		}
		if listed += len(page); next == nil {
			break
		}
		p.After = next
	}
	if listed != maxHeaders+3 {
		t.Errorf("listed %d records, want %d", listed, maxHeaders+3)
	}
	last := fmt.Sprintf("h%d", maxHeaders+1)
	if e := s.find(id{"s", last}); e == nil || !reflect.DeepEqual(e.resp.Header, header(maxHeaders+1)) {
		t.Errorf("made an entry, %s has header %v", last, e.resp.Header)
	}
}

// TestColdChunksAreDropped checks that a chunk whose records are all
// gone is dropped and its index reused, so a store whose records come and
// go does not grow.
func TestColdChunksAreDropped(t *testing.T) {
	s := New(Config{})
	body := make([]byte, 4000)
	n := 3 * chunkSize / 4000
	for i := range n {
		complete(t, s, "s", fmt.Sprint(i), body, nil)
	}
	if len(s.cold.chunks) < 3 {
		t.Fatalf("%d chunks for %d records of %d bytes", len(s.cold.chunks), n, len(body))
	}
	for i := range n {
		if err := s.Delete(t.Context(), store.DeleteParams{Scope: "s", Key: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i, ch := range s.cold.chunks {
		if int32(i) != s.cold.cur && (ch.b != nil || ch.live != 0) {
			t.Errorf("chunk %d kept: %d bytes, %d live", i, len(ch.b), ch.live)
		}
	}
	if len(s.cold.free) != int(s.cold.n) || len(s.scopes) != 0 {
		t.Errorf("%d free slots of %d, %d scopes left", len(s.cold.free), int(s.cold.n), len(s.scopes))
	}
	chunks := len(s.cold.chunks)
	for i := range n {
		complete(t, s, "s", fmt.Sprint(i), body, nil)
	}
	if len(s.cold.chunks) != chunks {
		t.Errorf("%d chunks after refilling, want the %d there were", len(s.cold.chunks), chunks)
	}
}

// TestColdRecordIsImmutable checks that what Get returns for a cold record
// stays as it was after the record is deleted and its bytes' chunk
// reused, and that the response is the caller's own.
func TestColdRecordIsImmutable(t *testing.T) {
	s := New(Config{})
	complete(t, s, "s", "k", []byte("first answer"), nil)
	r, err := s.Get(t.Context(), "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := s.Get(t.Context(), "s", "k"); again.Response == r.Response {
		t.Error("two reads of a cold record share one response")
	}
	if err := s.Delete(t.Context(), store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 * chunkSize / 100 {
		complete(t, s, "s", fmt.Sprint(i), make([]byte, 100), nil)
	}
	if r.Key != "k" || r.Fingerprint != "fp-k" || string(r.Response.Body) != "first answer" {
		t.Errorf("a record read before its delete changed: %+v %q", r, r.Response.Body)
	}
	if _, err := s.Get(t.Context(), "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after delete: %v", err)
	}
}

// TestColdEdges checks what random sequences reach rarely: header values
// that are an empty list and none, a thawed record holding no view of its
// chunk, and refusals of cold records that leave them cold.
func TestColdEdges(t *testing.T) {
	ctx := t.Context()
	s := New(Config{})
	complete(t, s, "s", "empty", nil, http.Header{"X": {}})
	complete(t, s, "s", "other", nil, http.Header{"Y": {"1"}}) // not shared with the last (see Store.share)
	complete(t, s, "s", "nil", nil, http.Header{"X": nil})
	for k, want := range map[string][]string{"empty": {}, "nil": nil} {
		r, err := s.Get(ctx, "s", k)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := r.Response.Header["X"]; !ok || got == nil != (want == nil) {
			t.Errorf("record %s: header X %#v (present: %v), want %#v", k, got, ok, want)
		}
	}

	complete(t, s, "s", "k", []byte("answer"), nil)
	rs := s.scopes["s"]
	slot := s.cold.find(rs, "k")
	chunk := s.cold.chunks[s.cold.at(slot).chunk].b
	start, end := uintptr(unsafe.Pointer(unsafe.SliceData(chunk))), uintptr(unsafe.Pointer(unsafe.SliceData(chunk)))+uintptr(cap(chunk))
	inChunk := func(p *byte) bool { return uintptr(unsafe.Pointer(p)) >= start && uintptr(unsafe.Pointer(p)) < end }

	for _, refuse := range []func() error{
		func() error {
			return s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: 1}, To: store.StateFailedRetryable})
		},
		func() error {
			return s.Defer(ctx, store.DeferParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: 1}, Delay: time.Minute, Error: "x"})
		},
	} {
		if err := refuse(); !errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, store.ErrStateConflict) {
			t.Errorf("settling a completed record: %v", err)
		}
	}
	if s.cold.find(rs, "k") < 0 {
		t.Error("a refused settlement made the record an entry")
	}

	e := s.find(id{"s", "k"}) // made an entry, to be changed
	if e == nil || s.cold.find(rs, "k") >= 0 {
		t.Fatal("find did not make the cold record an entry")
	}
	if inChunk(unsafe.StringData(e.key)) || inChunk(unsafe.StringData(e.fp)) || inChunk(unsafe.SliceData(e.resp.Body)) {
		t.Error("the entry still points into the chunk, which it keeps alive")
	}
	if e.key != "k" || e.fp != "fp-k" || string(e.resp.Body) != "answer" {
		t.Errorf("entry %q %q %q", e.key, e.fp, e.resp.Body)
	}
}

// TestColdCompaction runs many requests and deletes over 200 keys against
// a store of small chunks, compacted whenever they are more than twice the
// size of their records, and the same store keeping entries: every record
// reads the same, and the structure (check) stays sound, after each step.
// A record read before its chunk was compacted away keeps its bytes.
func TestColdCompaction(t *testing.T) {
	ctx := t.Context()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	cold, plain := New(Config{Clock: clock}), New(Config{Clock: clock})
	cold.cold.size, cold.cold.maxText, cold.cold.slack, cold.cold.maxHeaders = 96, 96, 0, 3
	plain.cold.disabled = true
	rng := mathrand.New(mathrand.NewPCG(1, 2))
	key := func() string { return fmt.Sprintf("k%d", rng.IntN(200)) }
	var held []store.Record // read before later compactions
	for step := range 5000 {
		k := key()
		switch op := rng.IntN(10); {
		case op < 6: // a request: reserved, then completed
			p := store.ReserveParams{Scope: "s", Key: k, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour,
				LeasePolicy: store.LeaseUnknown, Tenant: "t"}
			a, errA := cold.Reserve(ctx, p)
			b, errB := plain.Reserve(ctx, p)
			if (errA == nil) != (errB == nil) || !reflect.DeepEqual(a, b) {
				t.Fatalf("step %d: reserve %s: %+v %v, entries %+v %v", step, k, a, errA, b, errB)
			}
			if errA != nil || !a.Outcome.Acquired() {
				continue
			}
			body := []byte(strings.Repeat(string(rune('a'+step%26)), rng.IntN(20)))
			var h http.Header // none, or a Location of its own (kept in the text once 3 are interned)
			if rng.IntN(2) == 0 {
				h = http.Header{"Location": {fmt.Sprint("/", step)}}
			}
			c := store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: k, Fence: a.Record.Fence},
				Response: store.Response{Status: 201, Header: h, Body: body}}
			if errA, errB := cold.Complete(ctx, c), plain.Complete(ctx, c); errA != nil || errB != nil {
				t.Fatalf("step %d: complete %s: %v, %v", step, k, errA, errB)
			}
		case op < 9:
			if r, err := cold.Get(ctx, "s", k); err == nil && rng.IntN(20) == 0 {
				held = append(held, r)
			}
			errA, errB := cold.Delete(ctx, store.DeleteParams{Scope: "s", Key: k}), plain.Delete(ctx, store.DeleteParams{Scope: "s", Key: k})
			if !errors.Is(errA, errB) && errA != errB {
				t.Fatalf("step %d: delete %s: %v, entries %v", step, k, errA, errB)
			}
		default:
			now = now.Add(7 * time.Minute) // records expire: reserves replace them
		}
		if err := cold.check(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
	for i := range 200 {
		k := fmt.Sprintf("k%d", i)
		a, errA := cold.Get(ctx, "s", k)
		b, errB := plain.Get(ctx, "s", k)
		if (errA == nil) != (errB == nil) || !reflect.DeepEqual(a, b) {
			t.Errorf("%s: %+v %v, entries %+v %v", k, a, errA, b, errB)
		}
	}
	for _, r := range held {
		if want := strings.Repeat(string(r.Response.Body[:min(1, len(r.Response.Body))]), len(r.Response.Body)); string(r.Response.Body) != want {
			t.Errorf("record %s read before compaction changed: %q", r.Key, r.Response.Body)
		}
	}
}
