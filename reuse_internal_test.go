package idem

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/idem-go/idem/internal/httpfield"
)

// TestReuseScope checks that the calls of one operation share one copy of
// its scope, and that other operations get their own, right, scope.
func TestReuseScope(t *testing.T) {
	u := newReuse()
	scope := func(tenant, method, route string) string {
		req := Request{Tenant: strings.Clone(tenant), Method: strings.Clone(method), Route: strings.Clone(route)}
		s := u.scope(&req)
		if want := req.Scope(); s != want {
			t.Fatalf("scope %q, want %q", s, want)
		}
		return s
	}
	a, b := scope("t", "POST", "/a"), scope("t", "POST", "/a")
	if unsafe.StringData(a) != unsafe.StringData(b) {
		t.Error("two calls of one operation got two copies of its scope")
	}
	for _, r := range [][3]string{{"u", "POST", "/a"}, {"t", "PUT", "/a"}, {"t", "POST", "/b"}, {"", "POST", "/a"}} {
		scope(r[0], r[1], r[2])
	}
	// Operations that share a slot take turns and never get each other's
	// scope: methods of one length on one route always share one, and
	// 64 slots hold many tenants of one route. Another tenant's scope
	// would replay one tenant's stored answers to another.
	for range 2 {
		scope("t", "PUT", "/a")
		scope("t", "GET", "/a")
		for i := range 300 {
			scope(fmt.Sprint("tenant-", i), "POST", "/v1/charges")
		}
	}
}

// TestReuseReplayable checks that answers of one operation with the same
// replayable fields share one header map, which is what Replayable
// returns, and that other fields get a map of their own.
func TestReuseReplayable(t *testing.T) {
	u := newReuse()
	keep := func(scope string, h http.Header) http.Header {
		r := u.replayable(scope, h)
		if want := httpfield.Replayable(h); !reflect.DeepEqual(r, want) {
			t.Fatalf("%v kept as %v, want %v", h, r, want)
		}
		return r
	}
	same := func(a, b http.Header) bool {
		return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
	}
	a := keep("s", http.Header{"Content-Type": {"application/json"}})
	b := keep("s", http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"c=1"}})
	if !same(a, b) {
		t.Error("answers with the same replayable fields got two maps")
	}
	c := keep("s", http.Header{"Content-Type": {"text/plain"}})
	if same(a, c) {
		t.Error("answers with other fields share one map")
	}
	if keep("s", nil) != nil {
		t.Error("no header: want nil")
	}
}
