package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// classify decides whether an attempt's outcome is worth another attempt,
// and returns the server's Retry-After as a wait (0 without one). slug is
// the case resp's body names, read by send (see problemSlug).
func (s *settings) classify(ctx context.Context, resp *http.Response, slug string, err error) (Reason, time.Duration, bool) {
	if err != nil {
		// The caller's own deadline or cancellation is final, whatever
		// error the transport reported for it.
		if ctx.Err() != nil || !retryableError(err) {
			return "", 0, false
		}
		return ReasonNetwork, 0, true
	}
	if Replayed(resp) {
		// The stored answer: every retry with this key gets it again,
		// whatever its status (a server that keeps 5xx replays them).
		return "", 0, false
	}
	after, hasAfter := retryAfter(resp.Header, s.Now())
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		if slug == "lock_timeout" {
			// The Stripe profile's answer to a key in use.
			return ReasonInProgress, after, true
		}
		return ReasonRateLimited, after, true
	case http.StatusServiceUnavailable:
		return ReasonUnavailable, after, true
	case http.StatusAccepted:
		// InProgressStatus 202: a deferral, not the answer. Other 202s
		// (an asynchronous route's acceptance, the application's own)
		// are answers.
		if slug == "request-in-progress" {
			return ReasonInProgress, after, true
		}
	case http.StatusBadGateway:
		// Only the proxy's own 502 for a request it never sent: the key
		// was released and nothing ran. Any other 502 (the proxy's
		// upstream-failed, or one the application answered and the server
		// released) may follow an effect behind the gateway, and a retry
		// would run the request again.
		if slug == "upstream-unreachable" {
			return ReasonUnreachable, after, true
		}
	case http.StatusConflict:
		switch slug {
		case "request-in-progress", "idempotency_key_in_use":
			return ReasonInProgress, after, true
		case "outcome-unknown":
			return ReasonOutcomeUnknown, after, s.RetryUnknown > 0
		}
		return ReasonConflict, after, hasAfter
	}
	return "", 0, false
}

// retryableError reports whether a transport error may go away on another
// attempt; errors of configuration (a certificate the client refuses, a
// host that does not exist) would only repeat.
func retryableError(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		record   tls.RecordHeaderError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		dns      *net.DNSError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &record), errors.As(err, &unknown),
		errors.As(err, &hostname), errors.As(err, &invalid):
		return false
	case errors.As(err, &dns):
		return !dns.IsNotFound
	}
	return true
}

// maxProblemBytes bounds what is read of an answer's body to learn its type.
const maxProblemBytes = 64 << 10

// namesCase reports whether classify tells resp's case from its body: a
// JSON answer, not replayed, with one of the statuses whose case classify
// reads.
func namesCase(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusAccepted, http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway:
	default:
		return false
	}
	if Replayed(resp) {
		return false
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// problemSlug returns the case an answer names: the fragment of an RFC 9457
// problem type (idem's "…/problems.md#request-in-progress"), or the code of
// a Stripe-style error object; "" when classify does not read its case
// (see namesCase). It reads the start of the body within ctx and puts it
// back, so a response that is returned to the caller is whole. When ctx
// ends first, the body is closed and the error wraps ctx's cause; a read
// that fails otherwise is no error here: the caller gets its error after
// the bytes before it.
func problemSlug(ctx context.Context, resp *http.Response) (string, error) {
	if !namesCase(resp) {
		return "", nil
	}
	head, ended, err := readWithin(ctx, resp.Body, maxProblemBytes)
	if ended {
		return "", fmt.Errorf("client: reading the answer's body: %w", err)
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), errReader{err}, resp.Body), resp.Body}
	var doc struct {
		Type  string `json:"type"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(head, &doc) != nil {
		return "", nil
	}
	if _, frag, ok := strings.Cut(doc.Type, "#"); ok {
		return frag, nil
	}
	return doc.Error.Code, nil
}

// errReader hands the caller, in order, the error that stopped reading the
// head of a body: the bytes before it are returned first.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	return 0, io.EOF
}

// retryAfter returns the wait a response's Retry-After asks for, from now:
// delay-seconds, or an HTTP-date (a date in the past asks for no wait).
// It reports false when the field is absent, repeated or malformed.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	vs := h.Values("Retry-After")
	if len(vs) != 1 {
		return 0, false
	}
	v := strings.TrimSpace(vs[0])
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return maxWait, true
			}
			return 0, false
		}
		if n > uint64(maxWait/time.Second) {
			return maxWait, true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, t.Sub(now)), true
}

// maxWait stands for a Retry-After too large to represent; any bound on the
// waits refuses it.
const maxWait = time.Duration(1<<63 - 1)
