package idem

import (
	"hash/maphash"
	"net/http"
	"sync/atomic"

	"github.com/idem-go/idem/internal/httpfield"
)

// reuse keeps what the calls of one operation mostly compute alike, so
// that they share one copy instead of allocating their own: the scope of
// the operation, and the replayable header of its answers. A store that
// keeps records in memory then also keeps fewer objects per record for the
// garbage collector to trace. Engines made by With share it: neither
// depends on the configuration.
//
// Each is a small table indexed by a hash of the operation, one entry per
// slot: operations that share a slot take turns, costing the allocation
// this saves and no more. Stored headers are never modified (see
// store.Response), so that one map may serve many records.
type reuse struct {
	seed    maphash.Seed
	scopes  [reuseSlots]atomic.Pointer[scopeOf]
	headers [reuseSlots]atomic.Value // http.Header
}

const reuseSlots = 64

type scopeOf struct {
	req   Request
	scope string
}

func newReuse() *reuse { return &reuse{seed: maphash.MakeSeed()} }

// scope returns req.Scope(), the copy the last call of req's operation in
// its slot got when there is one.
func (u *reuse) scope(req *Request) string {
	h := maphash.String(u.seed, req.Route) + 31*maphash.String(u.seed, req.Tenant) + uint64(len(req.Method))
	slot := &u.scopes[h%reuseSlots]
	if s := slot.Load(); s != nil && s.req == *req {
		return s.scope
	}
	s := &scopeOf{req: *req, scope: req.Scope()}
	slot.Store(s)
	return s.scope
}

// replayable returns httpfield.Replayable(h) for an answer of the
// operation named by scope: the map the last such answer stored when it
// has the same fields.
func (u *reuse) replayable(scope string, h http.Header) http.Header {
	slot := &u.headers[maphash.String(u.seed, scope)%reuseSlots]
	if last, _ := slot.Load().(http.Header); last != nil && httpfield.IsReplayable(last, h) {
		return last
	}
	r := httpfield.Replayable(h)
	if r != nil {
		slot.Store(r)
	}
	return r
}
