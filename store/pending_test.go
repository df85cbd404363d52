package store_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// TestRequestSummarySize: a request summary given to MarkUnknown counts
// its method, target, header names and values and body against
// MaxRequestSummaryBytes: one of exactly that size is kept, one byte more
// is refused as too long.
func TestRequestSummarySize(t *testing.T) {
	summary := func(extra int) *store.PendingRequest {
		r := &store.PendingRequest{Method: "POST", Target: "/a", Header: http.Header{"X-A": {"v"}}}
		r.Body = make([]byte, store.MaxRequestSummaryBytes-len("POST/aX-Av")+extra)
		return r
	}
	fence := store.FenceParams{Scope: "s", Key: "k", Fence: 1}
	at := store.ReleaseParams{FenceParams: fence, Request: summary(0)}
	if err := at.Validate(); err != nil {
		t.Errorf("summary of exactly MaxRequestSummaryBytes: %v", err)
	}
	over := store.ReleaseParams{FenceParams: fence, Request: summary(1)}
	if err := over.Validate(); !errors.Is(err, store.ErrTooLong) {
		t.Errorf("summary one byte over MaxRequestSummaryBytes: %v, want ErrTooLong", err)
	}
}

// TestQueueNameLimit: a queue's name may take up to MaxQueueBytes, and
// not one byte more.
func TestQueueNameLimit(t *testing.T) {
	for n, want := range map[int]error{store.MaxQueueBytes: nil, store.MaxQueueBytes + 1: store.ErrTooLong} {
		p := store.ClaimParams{Queue: strings.Repeat("q", n), Limit: 1, Lease: time.Second}
		if err := p.Validate(); (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
			t.Errorf("queue of %d bytes: %v, want %v", n, err, want)
		}
	}
}
