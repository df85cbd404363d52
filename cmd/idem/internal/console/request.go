package console

import (
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// maxShownBody bounds the body a page shows of a kept request.
const maxShownBody = 1 << 10

// requestView is the request an unknown record keeps, as the record page
// shows it.
type requestView struct {
	Method, Target string
	Header         []headerLine
	// Whole is true for an asynchronous request (kept whole, to be run by
	// a worker), false for the summary kept when the outcome became
	// unknown.
	Whole bool
	// Body: BodyText when it is text, else BodyHex; Shown bytes of Size.
	BodyText, BodyHex string
	Shown, Size       int
}

type headerLine struct {
	Name, Value string
	Hidden      bool // a header that may hold a credential: its value is not shown
}

// KeptRequest is the request an unknown record keeps for its current
// execution: an asynchronous request (kept whole, Queue set) or the
// summary the engine kept when the outcome became unknown. When there is
// none, it says why.
func KeptRequest(r *store.Record) (*store.PendingRequest, string) {
	q := r.Request
	switch {
	case q == nil && r.LastError == "lease_expired":
		return nil, "the process that ran it stopped renewing its lease (it crashed or was cut off from the store) before it recorded an outcome, and the record was marked unknown when the lease expired; only the engine that marks a record unknown itself keeps a summary of the request"
	case q == nil:
		return nil, "the record was marked unknown without a summary of its request (by a handler writing to the store itself, or by a version of idem that kept none)"
	case q.Queue == "" && q.Fence != r.Fence:
		return nil, fmt.Sprintf("the summary kept is of an earlier execution (fence %d); this one (fence %d) ended without recording its own: it stopped before it recorded an outcome", q.Fence, r.Fence)
	}
	return q, ""
}

// requestOf is the request of an unknown record's current execution, or
// why there is none.
func requestOf(r *store.Record) (*requestView, string) {
	q, why := KeptRequest(r)
	if q == nil {
		return nil, why
	}
	v := &requestView{Method: q.Method, Target: q.Target, Whole: q.Queue != "", Size: len(q.Body)}
	if q.BodyBytes > 0 {
		v.Size = q.BodyBytes
	}
	body := q.Body[:min(len(q.Body), maxShownBody)]
	v.Shown = len(body)
	if isText(body) {
		v.BodyText = string(body)
	} else {
		v.BodyHex = hex.Dump(body)
	}
	names := make([]string, 0, len(q.Header))
	for k := range q.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, val := range q.Header[k] {
			if idem.MayHoldCredential(k) {
				// An asynchronous request keeps the headers its worker
				// needs, credentials the operator chose included.
				v.Header = append(v.Header, headerLine{Name: k, Hidden: true})
				continue
			}
			v.Header = append(v.Header, headerLine{Name: k, Value: val})
		}
	}
	return v, ""
}
