package client

import (
	"net/http"
	"strings"
)

// resultKey is the context key under which each attempt's request carries
// the result of the whole exchange.
type resultKey struct{}

// result is what the transport did for one request. Every attempt's
// request carries the same *result; RoundTrip updates it only before it
// returns, so reading it afterwards needs no lock.
type result struct {
	key      string
	attempts int
}

func resultOf(resp *http.Response) *result {
	if resp == nil || resp.Request == nil {
		return nil
	}
	r, _ := resp.Request.Context().Value(resultKey{}).(*result)
	return r
}

// Key returns the idempotency key under which resp was obtained: the one
// the caller set, or the one the Transport made. It returns "" for a
// response that did not come through a Transport's retrying path (another
// round tripper, or a method outside Transport.Methods).
func Key(resp *http.Response) string {
	if r := resultOf(resp); r != nil {
		return r.key
	}
	return ""
}

// Attempts returns how many attempts the Transport made to obtain resp,
// the first included; 0 for a response that did not come through its
// retrying path. The transport keeps this in the context of resp.Request,
// the request of the last attempt, so it is there without any header.
func Attempts(resp *http.Response) int {
	if r := resultOf(resp); r != nil {
		return r.attempts
	}
	return 0
}

// Replayed reports whether resp is a stored answer the server replayed
// (Idempotent-Replayed: true) rather than the answer of an execution made
// for this call: true after a retry whose first attempt had run but whose
// answer was lost, or when a key is reused on purpose. It reads only the
// response, so it works whatever sent the request.
func Replayed(resp *http.Response) bool {
	if resp == nil {
		return false
	}
	v := strings.TrimSpace(resp.Header.Get("Idempotent-Replayed"))
	return strings.EqualFold(v, "true") || v == "?1"
}
