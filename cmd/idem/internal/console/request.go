package console

import (
	"encoding/hex"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// MaxShownBody bounds the body of a kept request that the record page and
// idem inspect show.
const MaxShownBody = 1 << 10

// BodySize is the size of q's whole body, of which Body may hold only the
// beginning (a summary's).
func BodySize(q *store.PendingRequest) int {
	if q.BodyBytes > 0 {
		return q.BodyBytes
	}
	return len(q.Body)
}

// ShownText is the beginning of body to show, at most MaxShownBody bytes
// cut on a character boundary; ok is false when it is not text (or is
// empty). A body cut at a byte bound (a summary keeps the beginning) may
// end inside a character: that part is dropped, it does not make the body
// binary.
func ShownText(body []byte) (text string, ok bool) {
	b := body[:min(len(body), MaxShownBody)]
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				b = b[:i]
			}
			break
		}
	}
	if len(b) == 0 || !isText(b) {
		return "", false
	}
	return string(b), true
}

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
	v := &requestView{Method: q.Method, Target: q.Target, Whole: q.Queue != "", Size: BodySize(q)}
	if text, ok := ShownText(q.Body); ok {
		v.BodyText, v.Shown = text, len(text)
	} else {
		body := q.Body[:min(len(q.Body), MaxShownBody)]
		v.BodyHex, v.Shown = hex.Dump(body), len(body)
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
