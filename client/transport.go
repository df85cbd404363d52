package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/header"
	"github.com/idem-go/idem/internal/httpfield"
)

// Defaults of the Transport fields.
const (
	DefaultHeader         = "Idempotency-Key"
	DefaultMaxAttempts    = 5
	DefaultMaxDelay       = 30 * time.Second
	DefaultBaseDelay      = 500 * time.Millisecond
	DefaultMaxBackoff     = 8 * time.Second
	DefaultMaxBufferBytes = 1 << 20
)

// Transport is an http.RoundTripper that sends every POST and PATCH under
// an idempotency key and retries it while that is safe and useful (see the
// package documentation for what is retried).
//
// The zero value is ready to use, with every default. A Transport is safe
// for concurrent use; its fields must not change once it is in use. Invalid
// settings (a negative count or duration, a malformed header name) make
// every request fail with an error that names the field.
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper

	// Header is the name of the key's header field. Defaults to
	// Idempotency-Key.
	Header string

	// Methods are the methods that get a key and retries; others go to
	// Base once, untouched. Defaults to POST and PATCH.
	Methods []string

	// MaxAttempts bounds the attempts of one request, the first included;
	// 1 sends the key without ever retrying. Defaults to 5.
	MaxAttempts int

	// MaxDelay bounds the sum of the waits between attempts of one
	// request. A wait that would exceed it is not made: the last answer is
	// returned instead. Defaults to 30s.
	MaxDelay time.Duration

	// BaseDelay is the wait before the first retry, doubled for each
	// retry after it. Defaults to 500ms.
	BaseDelay time.Duration

	// MaxBackoff caps one computed wait (a longer Retry-After from the
	// server is still honoured, within MaxDelay). Defaults to 8s.
	MaxBackoff time.Duration

	// AttemptTimeout, when positive, bounds each attempt: sending the
	// request, its response headers and, for an answer whose case the
	// transport reads from its body (a JSON 202, 409, 429 or 502 that is
	// not replayed), the start of that body, up to 64 KiB. An attempt that
	// takes longer is abandoned, as a network failure wrapping
	// ErrAttemptTimeout, and retried under the same key (if it ran, the
	// retry gets its answer, or waits for it: the server still holds the
	// key). What the caller reads of the body of the response returned is
	// not bounded by it: it reads that after RoundTrip returns, within the
	// request's context and the client's Timeout. http.Client.Timeout and
	// a context deadline bound the whole call instead, every attempt and
	// wait included: a client timeout shorter than a slow answer leaves no
	// time for a retry. The abandoned attempt's connection is closed: the
	// idem proxy finishes the upstream call all the same, but a handler
	// behind the middleware that stops when its client leaves, before it
	// answered, leaves the outcome unknown (the retry gets 409
	// #outcome-unknown), so keep AttemptTimeout above such a handler's
	// usual time. Defaults to 0 (attempts are bounded only by those).
	AttemptTimeout time.Duration

	// RetryUnknown, when positive, retries 409 #outcome-unknown: the first
	// wait is RetryUnknown, doubled after each such answer (not capped by
	// MaxBackoff), so a caller willing to wait for reconciliation gets the
	// settled answer. Raise MaxDelay with it, or no such wait fits.
	// Defaults to 0: the 409 is returned at once.
	RetryUnknown time.Duration

	// MaxBufferBytes bounds how much of a body without GetBody is kept in
	// memory to be sent again; a larger body is sent once without retries.
	// Negative: such bodies are never buffered (sent once). Defaults to
	// 1 MiB.
	MaxBufferBytes int64

	// Now is the clock, used to turn a Retry-After date into a wait and
	// to compare waits with the context's deadline. Defaults to time.Now.
	Now func() time.Time

	// Sleep waits d, or until ctx is done, and then returns ctx's error.
	// Defaults to a timer.
	Sleep func(ctx context.Context, d time.Duration) error

	// Jitter turns a computed wait into the wait made; it must return a
	// duration in [0, d]. Defaults to a uniform draw in [d/2, d].
	Jitter func(d time.Duration) time.Duration

	// OnRetry, when set, is called before each wait, on the goroutine of
	// the request; for logging and metrics.
	OnRetry func(Retry)

	// afterFunc starts the timer of AttemptTimeout and returns its Stop;
	// tests set it (export_test.go) to end an attempt where they choose.
	// Defaults to time.AfterFunc.
	afterFunc func(d time.Duration, f func()) (stop func() bool)
}

// Reason says why an attempt is retried.
type Reason string

// The reasons for a retry.
const (
	// ReasonNetwork: no response, the connection failed or was cut.
	ReasonNetwork Reason = "network"
	// ReasonInProgress: the key's first request is still running: 409 or
	// 202 #request-in-progress, 409 idempotency_key_in_use or 429
	// lock_timeout (the Stripe profile).
	ReasonInProgress Reason = "request-in-progress"
	// ReasonOutcomeUnknown: 409 #outcome-unknown, retried only under
	// Transport.RetryUnknown.
	ReasonOutcomeUnknown Reason = "outcome-unknown"
	// ReasonConflict: another 409, carrying Retry-After.
	ReasonConflict Reason = "conflict"
	// ReasonRateLimited: 429.
	ReasonRateLimited Reason = "rate-limited"
	// ReasonUnavailable: 503.
	ReasonUnavailable Reason = "unavailable"
	// ReasonUnreachable: 502 #upstream-unreachable, the idem proxy could
	// not send the request to its upstream (nothing ran).
	ReasonUnreachable Reason = "upstream-unreachable"
)

// Retry describes an attempt that failed and the wait before the next.
type Retry struct {
	// Request is the caller's request.
	Request *http.Request
	// Key is the idempotency key every attempt carries.
	Key string
	// Attempt is the number of the attempt that failed, from 1.
	Attempt int
	// Reason is why it is retried.
	Reason Reason
	// Status is the failed attempt's status, 0 when Err is set.
	Status int
	// Err is the failed attempt's transport error, nil when it answered.
	Err error
	// Delay is the wait before the next attempt.
	Delay time.Duration
}

// Error is what a request ends with when its last attempt got no response:
// it carries the key, so the caller can try again later under the same key
// and still not run the request twice. RoundTrip returns it; http.Client
// wraps it in a *url.Error, so use errors.As.
type Error struct {
	// Key is the idempotency key the attempts carried.
	Key string
	// Attempts is the number of attempts made.
	Attempts int
	// Err is the last attempt's error, or the context's error when the
	// context ended during a wait.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("idempotent request with key %q failed after %d attempt(s): %v", e.Key, e.Attempts, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an http.Client that sends its requests through t; nil means
// a Transport with every default.
func New(t *Transport) *http.Client {
	if t == nil {
		t = &Transport{}
	}
	return &http.Client{Transport: t}
}

// NewKey returns a fresh key: a version 4 UUID from crypto/rand, in its
// canonical lower-case form. The transport makes its keys with it; a
// caller that must keep a key across its own restarts makes one with it,
// stores it, and sets it on the request (quoted, as Transport does, or
// bare).
func NewKey() string {
	var u [16]byte
	rand.Read(u[:])         // never fails (crypto/rand crashes the program instead)
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

// CloseIdleConnections closes the idle connections of Base, when it has
// any; http.Client.CloseIdleConnections calls it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// settings is a Transport with its defaults applied.
type settings struct {
	Transport
}

func (t *Transport) settings() (settings, error) {
	s := settings{*t}
	s.Base = t.base()
	var errs []error
	if s.Header == "" {
		s.Header = DefaultHeader
	} else if !isToken(s.Header) {
		errs = append(errs, fmt.Errorf("client: Header %q is not a valid header field name", s.Header))
	}
	if len(s.Methods) == 0 {
		s.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if s.MaxAttempts == 0 {
		s.MaxAttempts = DefaultMaxAttempts
	}
	if s.MaxAttempts < 0 {
		errs = append(errs, errors.New("client: MaxAttempts must not be negative"))
	}
	def := func(d *time.Duration, v time.Duration, name string) {
		if *d == 0 {
			*d = v
		}
		if *d < 0 {
			errs = append(errs, fmt.Errorf("client: %s must not be negative", name))
		}
	}
	def(&s.MaxDelay, DefaultMaxDelay, "MaxDelay")
	def(&s.BaseDelay, DefaultBaseDelay, "BaseDelay")
	def(&s.MaxBackoff, DefaultMaxBackoff, "MaxBackoff")
	if s.AttemptTimeout < 0 {
		errs = append(errs, errors.New("client: AttemptTimeout must not be negative"))
	}
	if s.RetryUnknown < 0 {
		errs = append(errs, errors.New("client: RetryUnknown must not be negative"))
	}
	if s.MaxBufferBytes == 0 {
		s.MaxBufferBytes = DefaultMaxBufferBytes
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Sleep == nil {
		s.Sleep = sleep
	}
	if s.Jitter == nil {
		s.Jitter = jitter
	}
	if s.afterFunc == nil {
		s.afterFunc = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	return s, errors.Join(errs...)
}

func (s *settings) protects(method string) bool {
	for _, m := range s.Methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// isToken reports whether name is an RFC 9110 token, as a field name must be.
func isToken(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return name != ""
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// jitter spreads the clients that failed together so they do not come back
// together, while keeping at least half of the wait the backoff asked for.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d - mrand.N(d/2+1)
}

// key is the idempotency key of req: the one it carries in s.Header, else
// a new one, then with the header value to set.
func (s *settings) key(req *http.Request) (key, value string, err error) {
	if vs := httpfield.Values(req.Header, http.CanonicalHeaderKey(s.Header)); len(vs) > 0 {
		if key, err = header.Parse(vs); err != nil {
			return "", "", fmt.Errorf("client: the request's %s: %w", s.Header, err)
		}
		return key, "", nil
	}
	key = NewKey()
	return key, `"` + key + `"`, nil
}

// statusOf is resp's status; 0 without a response.
func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// RoundTrip implements http.RoundTripper. It sends req, under a key and
// with retries when its method is one of Methods, and returns the last
// response, or an error (an *Error once an attempt was made).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	s, err := t.settings()
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if !s.protects(req.Method) {
		return s.Base.RoundTrip(req)
	}
	info := &result{}
	var value string // the header value to add; empty when the caller set one
	if info.key, value, err = s.key(req); err != nil {
		closeBody(req)
		return nil, err
	}
	body, err := newReplayer(req, s.MaxBufferBytes)
	if err != nil {
		return nil, &Error{Key: info.key, Err: err}
	}
	ctx := context.WithValue(req.Context(), resultKey{}, info)
	var (
		waited  time.Duration
		unknown int // 409 #outcome-unknown answers so far
	)
	for attempt := 1; ; attempt++ {
		info.attempts = attempt
		areq := req.Clone(ctx)
		if value != "" {
			areq.Header.Set(s.Header, value)
		}
		if err := body.attach(areq, attempt); err != nil {
			return nil, &Error{Key: info.key, Attempts: attempt - 1, Err: err}
		}
		resp, slug, err := s.send(areq)
		if resp != nil && (resp.Request == nil || resp.Request.Context().Value(resultKey{}) != info) {
			resp.Request = areq
		}
		reason, retryAfter, retry := s.classify(ctx, resp, slug, err)
		if !retry {
			return finish(info, resp, err)
		}
		if reason == ReasonOutcomeUnknown {
			unknown++
		}
		delay, ok := s.delay(ctx, attempt, reason, unknown, retryAfter, waited)
		if !ok || !body.replayable {
			return finish(info, resp, err)
		}
		waited += delay
		s.discard(ctx, resp)
		if s.OnRetry != nil {
			s.OnRetry(Retry{Request: req, Key: info.key, Attempt: attempt, Reason: reason, Err: err, Delay: delay, Status: statusOf(resp)})
		}
		if err := s.Sleep(ctx, delay); err != nil {
			return nil, &Error{Key: info.key, Attempts: attempt, Err: err}
		}
	}
}

// ErrAttemptTimeout is the error of an attempt that took longer than
// Transport.AttemptTimeout.
var ErrAttemptTimeout = errors.New("client: the attempt took longer than AttemptTimeout")

// send makes one attempt: it sends areq, reads the answer's head and,
// when classify tells the answer's case from its body, the start of that
// body, and returns that case (see problemSlug). AttemptTimeout, when it
// is set, bounds all of it: an attempt it ends is an error wrapping
// ErrAttemptTimeout. The rest of the body is the caller's to read, after
// RoundTrip returns, and the bound does not reach it: the attempt's
// context is released when the body is closed.
func (s *settings) send(areq *http.Request) (*http.Response, string, error) {
	if s.AttemptTimeout <= 0 {
		resp, err := s.Base.RoundTrip(areq)
		if err != nil {
			return nil, "", err
		}
		slug, err := problemSlug(areq.Context(), resp)
		if err != nil {
			return nil, "", err // and the body is closed
		}
		return resp, slug, nil
	}
	ctx, cancel := context.WithCancelCause(areq.Context())
	stop := s.afterFunc(s.AttemptTimeout, func() { cancel(ErrAttemptTimeout) })
	resp, err := s.Base.RoundTrip(areq.WithContext(ctx))
	answered := err == nil
	var slug string
	if answered {
		slug, err = problemSlug(ctx, resp) // an error closed the body
	}
	if !stop() {
		// It fired: even a response that made it has a dead body.
		if !answered {
			err = fmt.Errorf("%w (%v): %w", ErrAttemptTimeout, s.AttemptTimeout, err)
		} else {
			if err == nil {
				resp.Body.Close()
			}
			err = fmt.Errorf("%w (%v) reading the answer", ErrAttemptTimeout, s.AttemptTimeout)
		}
	}
	if err != nil {
		cancel(nil)
		return nil, "", err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, slug, nil
}

// cancelOnClose releases an attempt's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

func finish(info *result, resp *http.Response, err error) (*http.Response, error) {
	if err != nil {
		return nil, &Error{Key: info.key, Attempts: info.attempts, Err: err}
	}
	return resp, nil
}

// delay returns the wait before the retry that follows attempt, and false
// when no further attempt may be made.
func (s *settings) delay(ctx context.Context, attempt int, reason Reason, unknown int, retryAfter, waited time.Duration) (time.Duration, bool) {
	if attempt >= s.MaxAttempts {
		return 0, false
	}
	var d time.Duration
	if reason == ReasonOutcomeUnknown {
		d = s.Jitter(doubled(s.RetryUnknown, unknown-1, s.MaxDelay))
	} else {
		d = s.Jitter(doubled(s.BaseDelay, attempt-1, s.MaxBackoff))
	}
	d = max(d, retryAfter, 0)
	if d > s.MaxDelay-waited {
		return 0, false
	}
	if deadline, ok := ctx.Deadline(); ok && deadline.Sub(s.Now()) <= d {
		return 0, false
	}
	return d, true
}

// doubled returns base·2ⁿ, at most limit, without overflowing.
func doubled(base time.Duration, n int, limit time.Duration) time.Duration {
	d := base
	for ; n > 0 && d < limit; n-- {
		if d > limit/2 {
			return limit
		}
		d *= 2
	}
	return min(d, limit)
}

// discard drains a little of a response that will not be returned, so its
// connection can be reused, and closes it. The drain is bounded as an
// attempt is: a body that stalls after its head (a 503 whose sender
// stopped) holds the retry for at most AttemptTimeout, and then its
// connection is closed instead of reused.
func (s *settings) discard(ctx context.Context, resp *http.Response) {
	if resp == nil {
		return
	}
	if s.AttemptTimeout > 0 {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		defer s.afterFunc(s.AttemptTimeout, func() { cancel(ErrAttemptTimeout) })()
	}
	if _, ended, _ := readWithin(ctx, resp.Body, 4<<10); !ended {
		resp.Body.Close()
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// replayer gives each attempt its own copy of the request body.
type replayer struct {
	req *http.Request
	// buf is the body read into memory, for a request without GetBody;
	// nil when GetBody or the absence of a body make it unnecessary.
	buf []byte
	// first is the body of the first attempt when it differs from
	// req.Body (a body too large to buffer, sent once).
	first      io.ReadCloser
	replayable bool
}

func newReplayer(req *http.Request, limit int64) (*replayer, error) {
	r := &replayer{req: req, replayable: true}
	if req.Body == nil || req.Body == http.NoBody || req.GetBody != nil {
		return r, nil
	}
	if limit < 0 || req.ContentLength > limit {
		r.replayable = false
		return r, nil
	}
	// The request's context bounds the wait for the caller's source as it
	// bounds the attempts.
	buf, ended, err := readWithin(req.Context(), req.Body, limit+1)
	if err != nil {
		if !ended {
			req.Body.Close()
		}
		return nil, fmt.Errorf("client: reading the request body: %w", err)
	}
	if int64(len(buf)) > limit {
		// Too large to keep: send what was read and the rest, once.
		r.replayable = false
		r.first = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
		return r, nil
	}
	req.Body.Close()
	r.buf = buf
	return r, nil
}

// readWithin reads r, up to limit bytes, for no longer than ctx lasts:
// when ctx ends first, it closes r, which ends a Read that blocks, and
// returns what it read, true, and ctx's cause; r is then closed and must
// not be closed again. The transport reads this way the request body it
// buffers (one without GetBody) and the start of an answer whose case
// classify reads.
func readWithin(ctx context.Context, r io.ReadCloser, limit int64) (b []byte, ended bool, err error) {
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		r.Close()
		close(closed)
	})
	b, err = io.ReadAll(io.LimitReader(r, limit))
	if !stop() {
		<-closed
		return b, true, context.Cause(ctx)
	}
	return b, false, err
}

// attach sets the body of areq, the clone of the request for attempt.
func (r *replayer) attach(areq *http.Request, attempt int) error {
	switch {
	case r.first != nil:
		areq.Body = r.first
	case r.buf != nil:
		areq.ContentLength = int64(len(r.buf))
		areq.GetBody = func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(r.buf)), nil
		}
		areq.Body, _ = areq.GetBody()
		if len(r.buf) == 0 {
			areq.Body = http.NoBody
		}
	case attempt > 1 && r.req.GetBody != nil:
		b, err := r.req.GetBody()
		if err != nil {
			return fmt.Errorf("client: GetBody for attempt %d: %w", attempt, err)
		}
		areq.Body = b
	}
	return nil
}
