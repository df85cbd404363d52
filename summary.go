package idem

import (
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/store"
)

// An operator settling an unknown record needs to know what the request
// was. An asynchronous record keeps its whole request; a synchronous one
// keeps nothing of it on the common path. Only when its outcome becomes
// unknown does the engine hand MarkUnknown a summary: method, target, the
// headers that cannot carry a credential, and the body's beginning, within
// these bounds.
const (
	summaryBodyBytes   = 1 << 10
	summaryTargetBytes = 1 << 10
	summaryHeaderBytes = 2 << 10 // names and values of all headers kept
	summaryValueBytes  = 256     // one header value
)

// callRef is what an Execution keeps of its call for the summary.
type callRef struct {
	target string
	header map[string][]string
	body   []byte
}

// secretWords are the parts of header names that may carry a credential
// (X-Api-Key, X-Auth-Token, Stripe-Signature, X-Session-Id, ...).
var secretWords = []string{"auth", "cookie", "token", "secret", "password", "passwd", "session",
	"signature", "credential", "key"}

// MayHoldCredential reports whether a request header of this name may
// carry a credential, judged by its name alone (Authorization, Cookie,
// X-Api-Key, X-Auth-Token, Stripe-Signature, X-Session-Id, ...; the
// Idempotency-Key header is not one). A request summary never keeps such a
// header, and the operations console hides their values.
func MayHoldCredential(name string) bool {
	if strings.EqualFold(name, "Idempotency-Key") {
		return false
	}
	lower := strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(lower, w) {
			return true
		}
	}
	return false
}

// secretHeader reports whether the summary must leave header name out.
func (e *Engine) secretHeader(name string) bool {
	switch {
	case name == e.cfg.KeyHeader:
		return false
	case slices.Contains(e.cfg.AsyncDropHeaders, name):
		return true
	}
	return MayHoldCredential(name)
}

// summary describes x's request for MarkUnknown, nil for a worker's
// execution (its record keeps the request) or when the summary would not
// be valid: a summary is for the operator and must never stop the record
// from being marked unknown.
func (x *Execution) summary() *store.PendingRequest {
	c := &x.call
	if c.target == "" {
		return nil
	}
	_, method, _, _ := ParseScope(x.scope)
	s := &store.PendingRequest{Method: method, Target: clip(c.target, summaryTargetBytes), Fence: x.fence}
	// A copy: the store may keep the slice, and the call's buffer is the
	// adapter's.
	if len(c.body) > summaryBodyBytes {
		s.Body, s.BodyBytes = slices.Clone(c.body[:summaryBodyBytes]), len(c.body)
	} else if len(c.body) > 0 {
		s.Body = slices.Clone(c.body)
	}
	names := make([]string, 0, len(c.header))
	for k := range c.header {
		names = append(names, k)
	}
	slices.Sort(names)
	room := summaryHeaderBytes
	for _, k := range names {
		if x.e.secretHeader(k) || !httpfield.ReplayableName(k) {
			continue
		}
		for _, v := range c.header[k] {
			v = clip(v, summaryValueBytes)
			if room -= len(k) + len(v); room < 0 || !httpfield.Valid(k, []string{v}) {
				continue
			}
			if s.Header == nil {
				s.Header = http.Header{}
			}
			s.Header[k] = append(s.Header[k], v)
		}
	}
	if (&store.ReleaseParams{FenceParams: x.fenceParams(), Request: s}).Validate() != nil {
		return nil
	}
	return s
}

// clip cuts s to at most n bytes on a character boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
