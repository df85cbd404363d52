package memory_test

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewDatabase: func(t *testing.T) storetest.Opener {
			var s *memory.Store
			return func(t *testing.T, clock store.Clock) store.Store {
				// One map per database: a second handle is the same store.
				if s == nil {
					s = memory.New(memory.Config{Clock: clock})
				}
				return s
			}
		},
	})
}

// TestRecordsShareEqualStrings checks that records of one scope share one
// copy of it, and that a record of another scope keeps its own.
func TestRecordsShareEqualStrings(t *testing.T) {
	ctx := t.Context()
	s := memory.New(memory.Config{})
	scope := func(key, scope string) *byte {
		t.Helper()
		_, err := s.Reserve(ctx, store.ReserveParams{Scope: strings.Clone(scope), Key: key, Fingerprint: "f",
			Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown, Tenant: strings.Clone("t")})
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Get(ctx, scope, key)
		if err != nil {
			t.Fatal(err)
		}
		if r.Scope != scope {
			t.Fatalf("scope %q, want %q", r.Scope, scope)
		}
		return unsafe.StringData(r.Scope)
	}
	a, b, c := scope("a", "0:POST /a"), scope("b", "0:POST /a"), scope("c", "0:POST /b")
	if a != b {
		t.Error("two records of one scope keep two copies of it")
	}
	if c == a {
		t.Error("records of different scopes share one")
	}
}

// TestAnswersShareEqualHeaders checks that answers with equal headers share
// one header map, and that an answer with other headers keeps its own.
func TestAnswersShareEqualHeaders(t *testing.T) {
	ctx := t.Context()
	s := memory.New(memory.Config{})
	complete := func(key string, h map[string][]string) map[string][]string {
		t.Helper()
		res, err := s.Reserve(ctx, store.ReserveParams{Scope: "s", Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Complete(ctx, store.CompleteParams{
			FenceParams: store.FenceParams{Scope: "s", Key: key, Fence: res.Record.Fence},
			Response:    store.Response{Status: 201, Header: h, Body: []byte("{}")}, TTL: time.Hour,
		})
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Get(ctx, "s", key)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(map[string][]string(r.Response.Header), h) {
			t.Fatalf("%s: stored header %v, want %v", key, r.Response.Header, h)
		}
		return r.Response.Header
	}
	a := complete("a", map[string][]string{"Content-Type": {"application/json"}})
	b := complete("b", map[string][]string{"Content-Type": {"application/json"}})
	c := complete("c", map[string][]string{"Content-Type": {"text/plain"}})
	d := complete("d", map[string][]string{"Content-Type": {"text/plain"}, "X-A": {"1"}})
	if reflect.ValueOf(a).UnsafePointer() != reflect.ValueOf(b).UnsafePointer() {
		t.Error("two answers with equal headers keep two header maps")
	}
	if reflect.ValueOf(c).UnsafePointer() == reflect.ValueOf(a).UnsafePointer() ||
		reflect.ValueOf(d).UnsafePointer() == reflect.ValueOf(c).UnsafePointer() {
		t.Error("answers with different headers share one header map")
	}
}

// TestCompletedRecordIsOneText checks that a completed record keeps its
// key, fingerprint and body in one allocation, in that order, and that the
// body handed out cannot be appended to in place.
func TestCompletedRecordIsOneText(t *testing.T) {
	ctx := t.Context()
	s := memory.New(memory.Config{})
	key, fp := strings.Clone("key-1"), strings.Clone("fingerprint")
	res, err := s.Reserve(ctx, store.ReserveParams{Scope: "s", Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":1}`)
	err = s.Complete(ctx, store.CompleteParams{
		FenceParams: store.FenceParams{Scope: "s", Key: key, Fence: res.Record.Fence},
		Response:    store.Response{Status: 201, Body: body}, TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	body[0] = 'x' // the engine's buffer: the store keeps its own copy
	r, err := s.Get(ctx, "s", key)
	if err != nil {
		t.Fatal(err)
	}
	if r.Key != key || r.Fingerprint != fp || string(r.Response.Body) != `{"id":1}` {
		t.Fatalf("record %q %q %q, want %q %q %q", r.Key, r.Fingerprint, r.Response.Body, key, fp, `{"id":1}`)
	}
	k, f, b := unsafe.StringData(r.Key), unsafe.StringData(r.Fingerprint), unsafe.SliceData(r.Response.Body)
	if unsafe.Add(unsafe.Pointer(k), len(key)) != unsafe.Pointer(f) || unsafe.Add(unsafe.Pointer(f), len(fp)) != unsafe.Pointer(b) {
		t.Error("key, fingerprint and body are not one text")
	}
	if cap(r.Response.Body) != len(r.Response.Body) {
		t.Errorf("body capacity %d beyond its length %d", cap(r.Response.Body), len(r.Response.Body))
	}
}
