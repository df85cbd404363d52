package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// errChecksFailed reports that a required check of idem check failed; the
// report has been printed.
var errChecksFailed = errors.New("required idempotency checks failed")

// checkConfig is what idem check sends and expects.
type checkConfig struct {
	URL     string
	Method  string
	Body    []byte
	AltBody []byte // nil: the mismatch check is skipped
	Header  http.Header
	Profile idem.Profile
	// TenantHeader names a header that carries the tenant; the tenant
	// check sends two random values in it.
	TenantHeader string
	// OtherAuth is the Authorization of a second tenant.
	OtherAuth   string
	Concurrency int
	Timeout     time.Duration
}

// verdict is the outcome of one check.
type verdict int

const (
	pass verdict = iota
	warn
	skip
	fail
)

func (v verdict) String() string {
	return [...]string{"PASS", "WARN", "SKIP", "FAIL"}[v]
}

type checkResult struct {
	verdict verdict
	detail  string
}

func passed(format string, a ...any) checkResult {
	return checkResult{pass, fmt.Sprintf(format, a...)}
}
func warned(format string, a ...any) checkResult {
	return checkResult{warn, fmt.Sprintf(format, a...)}
}
func skipped(format string, a ...any) checkResult {
	return checkResult{skip, fmt.Sprintf(format, a...)}
}
func failed(format string, a ...any) checkResult {
	return checkResult{fail, fmt.Sprintf(format, a...)}
}

// conformanceCheck is one item of the checklist.
type conformanceCheck struct {
	name string
	// proves says what a pass shows about the API.
	proves string
	// advisory checks report a failure as a warning under the profiles
	// they name: the behaviour is recommended there, not required.
	advisory map[idem.Profile]bool
	run      func(c *checker, ctx context.Context) checkResult
}

// checklist is the idempotency checklist of the HTTP contract (docs/http-contract.md),
// with the verification checks a careful reviewer of an idempotent API
// runs, in the order it runs.
var checklist = []conformanceCheck{
	{name: "replay", proves: "a retry with the same key and body gets the first answer again, and says it is a replay", run: (*checker).checkReplay},
	{name: "mismatch", proves: "a key reused with a different body is refused, and the first request's answer is untouched", run: (*checker).checkMismatch},
	{name: "concurrent", proves: "simultaneous duplicates of a new key run it at most once: the others get its answer or an in-flight refusal (409; 429 lock_timeout under stripe), never a 5xx", run: (*checker).checkConcurrent},
	{name: "retry-after", proves: "a 409 for a request still in flight tells the client when to retry", run: (*checker).checkRetryAfter},
	{name: "missing-key", proves: "a protected request without a key is refused, so a client that forgets it gets no silent duplicate (stripe: passes through)", run: (*checker).checkMissingKey},
	{name: "malformed-key", proves: "keys that are empty, over 255 characters or hold a control character are refused with 400", run: (*checker).checkMalformed},
	{name: "repeated-key", proves: "a request carrying Idempotency-Key twice is refused instead of silently using one of the two", run: (*checker).checkRepeated},
	{name: "spelling", proves: `the quoted ("k") and bare (k) spellings of one key name the same record`, advisory: map[idem.Profile]bool{idem.ProfileStripe: true}, run: (*checker).checkSpelling},
	{name: "get-passthrough", proves: "a GET with a key passes through: answered as without a key, never replayed", run: (*checker).checkGetPassthrough},
	{name: "no-set-cookie", proves: "a replay never hands out the Set-Cookie of the first answer (another caller's session)", run: (*checker).checkSetCookie},
	{name: "tenants", proves: "two tenants using the same key get independent results: no shared record, no replay across tenants", run: (*checker).checkTenants},
}

// checker runs the checklist against one API.
type checker struct {
	cfg    checkConfig
	client *http.Client

	// marksReplays is set once the API marked a replay with
	// Idempotent-Replayed: true; without the marker only identical
	// answers show that a request ran once.
	marksReplays atomic.Bool
	// accepted is set once the API answered a first request under a new
	// key below 400: until then a 400 may refuse the request itself, and
	// says nothing about its key.
	accepted atomic.Bool
	// conflicts are the 409 answers seen by the concurrent check.
	conflicts []answer
}

// answer is one response, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a answer) replayed() bool {
	return strings.EqualFold(strings.TrimSpace(a.header.Get("Idempotent-Replayed")), "true")
}

// same reports whether b is a replay of a as far as a client can see:
// status and body byte for byte.
func (a answer) same(b answer) bool {
	return a.err == nil && b.err == nil && a.status == b.status && bytes.Equal(a.body, b.body)
}

// String summarises an answer for a report line: its status, and the
// problem name or the start of its body.
func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	s := strconv.Itoa(a.status)
	if name := problemName(a.body); name != "" {
		return s + " " + name
	}
	if len(a.body) > 0 {
		s += " " + excerpt(a.body, 60)
	}
	return s
}

// inFlight reports whether a is a deferral of a request still running:
// 409 (request-in-progress, or any 409 a client would wait out), 202
// request-in-progress (an InProgressStatus of 202), or Stripe's 429
// lock_timeout.
func (a answer) inFlight() bool {
	if a.err != nil {
		return false
	}
	switch a.status {
	case http.StatusConflict:
		return true
	case http.StatusAccepted:
		return problemName(a.body) == idem.SlugInProgress
	case http.StatusTooManyRequests:
		return problemName(a.body) == "lock_timeout"
	}
	return false
}

// problemName returns the stable name of an error answer: the last
// segment of an RFC 9457 type URI, or the code of a Stripe-style error.
func problemName(body []byte) string {
	var doc struct {
		Type  string `json:"type"`
		Error *struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return ""
	}
	if doc.Error != nil {
		if doc.Error.Code != "" {
			return doc.Error.Code
		}
		return doc.Error.Type
	}
	if doc.Type == "" || doc.Type == "about:blank" {
		return ""
	}
	t := doc.Type
	if i := strings.LastIndexAny(t, "#/"); i >= 0 && i < len(t)-1 {
		t = t[i+1:]
	}
	return t
}

// excerpt returns b on one line, cut to about n characters.
func excerpt(b []byte, n int) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// newKey returns a fresh random key, valid in both spellings.
func newKey() string {
	var b [12]byte
	rand.Read(b[:])
	return "idem-check-" + hex.EncodeToString(b[:])
}

// spell writes a key the way the profile's clients do: an RFC 8941 string
// for ietf, the bare value for stripe.
func (c *checker) spell(key string) []string {
	if c.cfg.Profile == idem.ProfileStripe {
		return []string{key}
	}
	return []string{quoted(key)}
}

func quoted(key string) string { return `"` + key + `"` }

// mismatchStatus is the profile's answer to a key reused with another body.
func (c *checker) mismatchStatus() int {
	if c.cfg.Profile == idem.ProfileStripe {
		return http.StatusBadRequest
	}
	return http.StatusUnprocessableEntity
}

// send makes one request. keys are the Idempotency-Key field lines (none:
// no field); extra headers replace the configured ones of the same name.
func (c *checker) send(ctx context.Context, method string, keys []string, body []byte, extra http.Header) answer {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.URL, rd)
	if err != nil {
		return answer{err: err}
	}
	for k, v := range c.cfg.Header {
		req.Header[k] = v
	}
	if body == nil {
		req.Header.Del("Content-Type")
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	if keys != nil {
		req.Header["Idempotency-Key"] = keys
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// post sends the configured method and the given body under keys. A 503
// with Retry-After (the API's store briefly away, say) is waited out and
// sent again, as a client would, while the wait ends within the timeout:
// it says nothing of the behaviour a check looks at.
func (c *checker) post(ctx context.Context, keys []string, body []byte, extra http.Header) answer {
	deadline := time.Now().Add(c.cfg.Timeout)
	for {
		a := c.send(ctx, c.cfg.Method, keys, body, extra)
		if a.replayed() {
			c.marksReplays.Store(true)
		}
		ra, ok := retryAfter(a.header)
		if a.err != nil || a.status != http.StatusServiceUnavailable || !ok || !time.Now().Add(ra).Before(deadline) {
			return a
		}
		if sleepCtx(ctx, max(ra, 10*time.Millisecond)) != nil {
			return a
		}
	}
}

// retry sends a request again while the API answers 409, as a client
// honouring Retry-After would: the first request may still be running, or
// its answer may have reached the client before its record was completed.
// It polls faster than Retry-After asks, to keep the checks quick, and
// gives up at the timeout. It returns the last answer and how many 409s
// came before it.
func (c *checker) retry(ctx context.Context, keys []string, body []byte, extra http.Header) (answer, int) {
	deadline := time.Now().Add(c.cfg.Timeout)
	wait := 20 * time.Millisecond
	for n := 0; ; n++ {
		a := c.post(ctx, keys, body, extra)
		if !a.inFlight() || time.Now().After(deadline) {
			return a, n
		}
		if ra, ok := retryAfter(a.header); ok && ra < wait {
			wait = max(ra, time.Millisecond)
		}
		if sleepCtx(ctx, wait) != nil {
			return a, n
		}
		wait = min(2*wait, time.Second)
	}
}

// retryAfter parses a Retry-After field: delay-seconds or an HTTP-date.
func retryAfter(h http.Header) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// first sends the first request of a check under a new key; a check
// cannot say anything when the API does not accept the request itself.
func (c *checker) first(ctx context.Context, keys []string, body []byte, extra http.Header) (answer, *checkResult) {
	a := c.post(ctx, keys, body, extra)
	switch {
	case a.err != nil:
		r := failed("the first request failed: %v", a.err)
		return a, &r
	case a.status >= 400:
		// Replays of a refusal would pass most checks and prove nothing.
		r := failed("the API refused the first request under a new key (%s), so there is nothing to check: give a --method, --body and --header it accepts", a)
		return a, &r
	}
	c.accepted.Store(true)
	return a, nil
}

// unseenRefusal is the result of a check of 400 answers to bad keys while
// the API has refused every request, good keys included.
func (c *checker) unseenRefusal() (checkResult, bool) {
	if c.accepted.Load() {
		return checkResult{}, false
	}
	return skipped("the API refused every request under a valid key (see replay), so a 400 here would not show that the key was refused"), true
}

// rerun explains a retry that did not get the first answer back.
func rerun(first, again answer, waited int) string {
	switch {
	case again.err != nil:
		return fmt.Sprintf("the retry failed: %v", again.err)
	case again.inFlight():
		return fmt.Sprintf("the retry still got %s after %d in-flight answers (the first request finished long ago)", again, waited)
	case again.replayed():
		return fmt.Sprintf("the replay differs from the first answer (%s, then %s)", first, again)
	case again.status == first.status:
		return fmt.Sprintf("the retry got a different body (%s, then %s): the request ran again", first, again)
	}
	return fmt.Sprintf("first %s, retry %s", first, again)
}

func (c *checker) checkReplay(ctx context.Context) checkResult {
	k := newKey()
	first, bad := c.first(ctx, c.spell(k), c.cfg.Body, nil)
	if bad != nil {
		return *bad
	}
	again, waited := c.retry(ctx, c.spell(k), c.cfg.Body, nil)
	if !first.same(again) {
		return failed("%s", rerun(first, again, waited))
	}
	note := ""
	if waited > 0 {
		note = fmt.Sprintf(" (after %d 409 answers while the first was being recorded)", waited)
	}
	if !again.replayed() {
		return warned("identical answers (%s), but the retry is not marked Idempotent-Replayed: true, so a client cannot tell a replay from a second execution%s", first, note)
	}
	return passed("%d twice with a byte-identical %d-byte body; the retry marked Idempotent-Replayed: true%s", first.status, len(first.body), note)
}

func (c *checker) checkMismatch(ctx context.Context) checkResult {
	if c.cfg.AltBody == nil {
		return skipped("the body is not JSON, so no different body could be derived: give --alt-body")
	}
	k := newKey()
	first, bad := c.first(ctx, c.spell(k), c.cfg.Body, nil)
	if bad != nil {
		return *bad
	}
	want := c.mismatchStatus()
	alt, _ := c.retry(ctx, c.spell(k), c.cfg.AltBody, nil)
	if alt.err != nil || alt.status != want {
		why := ""
		switch {
		case alt.err != nil:
		case first.same(alt) || alt.replayed():
			why = ": the API replayed the first answer to a different request (it does not compare bodies)"
		case alt.status < 300:
			why = ": the API ran the second body under the first body's key"
		}
		return failed("the same key with a different body got %s, want %d%s", alt, want, why)
	}
	again, waited := c.retry(ctx, c.spell(k), c.cfg.Body, nil)
	if !first.same(again) {
		return failed("the reuse was refused (%s), but then the original no longer replays: %s", alt, rerun(first, again, waited))
	}
	return passed("the different body got %s; the original still replays (%d, same body)", alt, first.status)
}

// burst sends n copies of one request (key fields keys, body) at the same
// moment.
func (c *checker) burst(ctx context.Context, n int, keys []string, body []byte) []answer {
	out := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			<-start
			out[i] = c.post(ctx, keys, body, nil)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// burstTally counts the answers to a burst of duplicates.
type burstTally struct {
	ref                                 *answer // the execution's answer; nil when every duplicate got 409
	served, fresh, replays, errs, fives int
	odd                                 []string // the failed answers
}

// tally counts answers, keeping the in-flight refusals in c.conflicts.
func (c *checker) tally(answers []answer) burstTally {
	var t burstTally
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.errs++
			t.odd = append(t.odd, a.String())
		case a.status >= 500:
			t.fives++
			t.odd = append(t.odd, a.String())
		case a.inFlight():
			c.conflicts = append(c.conflicts, a)
		default:
			t.served++
			if a.replayed() {
				t.replays++
			} else {
				t.fresh++
			}
			// The reference is the execution itself when it is marked
			// apart from its replays.
			if t.ref == nil || !a.replayed() && t.ref.replayed() {
				t.ref = &answers[i]
			}
		}
	}
	return t
}

func (c *checker) checkConcurrent(ctx context.Context) checkResult {
	n := c.cfg.Concurrency
	k := newKey()
	answers := c.burst(ctx, n, c.spell(k), c.cfg.Body)
	t := c.tally(answers)
	if t.errs+t.fives > 0 {
		return failed("%d of %d duplicates failed (%d transport errors, %d 5xx): %s", t.errs+t.fives, n, t.errs, t.fives, strings.Join(t.odd, "; "))
	}
	if t.ref == nil {
		// Every duplicate got 409: the one that reserved the key is
		// reported like the others, so learn its answer by retrying.
		a, _ := c.retry(ctx, c.spell(k), c.cfg.Body, nil)
		t.ref = &a
	}
	if t.ref.err != nil || t.ref.status >= 400 {
		return failed("the API refused the request (%s), so there is nothing to check: give a --method, --body and --header it accepts", t.ref)
	}
	for _, a := range answers {
		if !a.inFlight() && !a.same(*t.ref) {
			return failed("two different answers to duplicates of one request, %s and %s: it ran more than once (or its replay differs)", *t.ref, a)
		}
	}
	if c.marksReplays.Load() && t.fresh > 1 {
		return failed("%d of %d duplicates were answered as new executions (no Idempotent-Replayed): the request ran %d times", t.fresh, n, t.fresh)
	}
	again, waited := c.retry(ctx, c.spell(k), c.cfg.Body, nil)
	if !t.ref.same(again) {
		return failed("after the burst, a retry does not replay the answer: %s", rerun(*t.ref, again, waited))
	}
	conflicts := n - t.served
	res := passed("%d duplicates at once: %d ran (%s), %d replayed it, %d got 409; a retry afterwards replays the same answer",
		n, t.fresh, *t.ref, t.replays, conflicts)
	if !c.marksReplays.Load() {
		res = passed("%d duplicates at once: %d identical answers (%s), %d got 409; the API does not mark replays, so only identical bodies show it ran once",
			n, t.served, *t.ref, conflicts)
	}
	return res
}

func (c *checker) checkRetryAfter(ctx context.Context) checkResult {
	const extraBursts = 2
	conflicts := c.conflicts
	bursts := 1
	for ; len(conflicts) == 0 && bursts <= extraBursts; bursts++ {
		for _, a := range c.burst(ctx, c.cfg.Concurrency, c.spell(newKey()), c.cfg.Body) {
			if a.inFlight() {
				conflicts = append(conflicts, a)
			}
		}
	}
	if len(conflicts) == 0 {
		return skipped("no 409 in %d bursts of %d duplicates: every duplicate arrived after the first had finished (a fast API, or a wait-then-replay mode), so there was nothing to check", bursts, c.cfg.Concurrency)
	}
	var missing int
	values := map[string]bool{}
	for _, a := range conflicts {
		if _, ok := retryAfter(a.header); !ok {
			missing++
			continue
		}
		values[a.header.Get("Retry-After")] = true
	}
	if missing > 0 {
		return failed("%d of %d 409 answers had no valid Retry-After (%s): clients cannot know when to retry", missing, len(conflicts), conflicts[0])
	}
	return passed("%d 409 answers, all with Retry-After (%s)", len(conflicts), strings.Join(sortedKeys(values), ", "))
}

func (c *checker) checkMissingKey(ctx context.Context) checkResult {
	if r, ok := c.unseenRefusal(); ok && c.cfg.Profile != idem.ProfileStripe {
		return r
	}
	a := c.post(ctx, nil, c.cfg.Body, nil)
	if a.err != nil {
		return failed("the request failed: %v", a.err)
	}
	if c.cfg.Profile == idem.ProfileStripe {
		if a.status >= 400 {
			return failed("got %s: under the stripe profile a request without a key is an ordinary request", a)
		}
		return passed("got %s: passed through as an ordinary request", a)
	}
	if a.status != http.StatusBadRequest {
		why := ""
		if a.status < 300 {
			why = ": the API ran a request with no key, so its retries are duplicates"
		}
		return failed("got %s, want 400%s", a, why)
	}
	return passed("got %s", a)
}

func (c *checker) checkMalformed(ctx context.Context) checkResult {
	if r, ok := c.unseenRefusal(); ok {
		return r
	}
	long := strings.Repeat("a", 256)
	cases := []struct{ name, value string }{
		{"empty", ""},
		{"256 characters", long},
		{"a tab inside", "idem\tcheck"},
	}
	if c.cfg.Profile != idem.ProfileStripe {
		cases = []struct{ name, value string }{
			{"empty", ""},
			{`empty string ""`, `""`},
			{"256 characters", quoted(long)},
			{"a tab inside", "\"idem\tcheck\""},
		}
	}
	var bad, names []string
	for _, tc := range cases {
		names = append(names, tc.name)
		a := c.post(ctx, []string{tc.value}, c.cfg.Body, nil)
		if a.err != nil || a.status != http.StatusBadRequest {
			bad = append(bad, fmt.Sprintf("%s: got %s", tc.name, a))
		}
	}
	if len(bad) > 0 {
		return failed("want 400 for each malformed key; %s", strings.Join(bad, "; "))
	}
	return passed("400 for each of: %s", strings.Join(names, ", "))
}

func (c *checker) checkRepeated(ctx context.Context) checkResult {
	if r, ok := c.unseenRefusal(); ok {
		return r
	}
	k1, k2 := newKey(), newKey()
	cases := []struct {
		name  string
		lines []string
	}{
		{"one key on two lines", append(c.spell(k1), c.spell(k1)...)},
		{"two keys on two lines", append(c.spell(k1), c.spell(k2)...)},
	}
	var bad []string
	for _, tc := range cases {
		a := c.post(ctx, tc.lines, c.cfg.Body, nil)
		if a.err != nil || a.status != http.StatusBadRequest {
			bad = append(bad, fmt.Sprintf("%s: got %s", tc.name, a))
		}
	}
	if len(bad) > 0 {
		return failed("want 400 for a repeated Idempotency-Key; %s", strings.Join(bad, "; "))
	}
	return passed("400 for one key sent twice and for two different keys")
}

func (c *checker) checkSpelling(ctx context.Context) checkResult {
	k := newKey()
	firstSpelling, otherSpelling := []string{quoted(k)}, []string{k}
	firstName, otherName := "quoted", "bare"
	if c.cfg.Profile == idem.ProfileStripe {
		firstSpelling, otherSpelling = otherSpelling, firstSpelling
		firstName, otherName = otherName, firstName
	}
	first, bad := c.first(ctx, firstSpelling, c.cfg.Body, nil)
	if bad != nil {
		return *bad
	}
	again, waited := c.retry(ctx, otherSpelling, c.cfg.Body, nil)
	switch {
	case first.same(again):
		return passed("the %s spelling replays the answer to the %s one (%d)", otherName, firstName, first.status)
	case again.err == nil && again.status == http.StatusBadRequest:
		return warned("the %s spelling is refused (%s): stricter than needed, and clients of the other style get 400", otherName, again)
	}
	return failed("the %s spelling is a different key: %s", otherName, rerun(first, again, waited))
}

func (c *checker) checkGetPassthrough(ctx context.Context) checkResult {
	plain := c.send(ctx, http.MethodGet, nil, nil, nil)
	if plain.err != nil {
		return failed("GET without a key failed: %v", plain.err)
	}
	k := newKey()
	var keyed []answer
	for range 2 {
		a := c.send(ctx, http.MethodGet, c.spell(k), nil, nil)
		switch {
		case a.err != nil:
			return failed("GET with a key failed: %v", a.err)
		case a.replayed():
			return failed("a GET with a key was replayed (Idempotent-Replayed: true): safe methods must pass through")
		case a.status != plain.status:
			return failed("GET with a key got %s, without a key %s: the key must be ignored on GET", a, plain)
		}
		keyed = append(keyed, a)
	}
	return passed("GET answered %d with and without a key, twice with the same key, never marked as a replay", keyed[0].status)
}

func (c *checker) checkSetCookie(ctx context.Context) checkResult {
	k := newKey()
	first, bad := c.first(ctx, c.spell(k), c.cfg.Body, nil)
	if bad != nil {
		return *bad
	}
	again, _ := c.retry(ctx, c.spell(k), c.cfg.Body, nil)
	if !first.same(again) && !again.replayed() {
		return skipped("the retry was not a replay (see replay), so there is no replay to inspect")
	}
	if cookies := again.header.Values("Set-Cookie"); len(cookies) > 0 {
		return failed("the replay carries Set-Cookie: %s", strings.Join(cookies, "; "))
	}
	if n := len(first.header.Values("Set-Cookie")); n > 0 {
		return passed("the first answer set %d cookie(s); the replay set none", n)
	}
	return passed("the replay carries no Set-Cookie (the first answer set none either, so this only shows a replay adds none)")
}

func (c *checker) checkTenants(ctx context.Context) checkResult {
	if c.cfg.TenantHeader == "" && c.cfg.OtherAuth == "" {
		return skipped("needs a second tenant: --tenant-header NAME (two random tenants in that header) or --other-auth VALUE (a second credential)")
	}
	a, b := http.Header{}, http.Header{}
	var who []string
	if name := c.cfg.TenantHeader; name != "" {
		suffix := newKey()[len("idem-check-"):]
		a.Set(name, "idem-check-a-"+suffix)
		b.Set(name, "idem-check-b-"+suffix)
		who = append(who, name)
	}
	if c.cfg.OtherAuth != "" {
		b.Set("Authorization", c.cfg.OtherAuth)
		who = append(who, "Authorization")
	}
	// Tenant B reuses tenant A's key with another body when there is one:
	// a shared record then shows as a mismatch, whether or not the API
	// marks replays.
	bBody := c.cfg.AltBody
	if bBody == nil {
		bBody = c.cfg.Body
	}
	k := newKey()
	ra, bad := c.first(ctx, c.spell(k), c.cfg.Body, a)
	if bad != nil {
		return *bad
	}
	rb := c.post(ctx, c.spell(k), bBody, b)
	switch {
	case rb.err != nil:
		return failed("tenant B's request failed: %v", rb.err)
	case rb.replayed() || rb.status == ra.status && bytes.Equal(rb.body, ra.body) && c.cfg.AltBody != nil:
		return failed("tenant B got tenant A's answer (%s): a replay across tenants", rb)
	case rb.status == c.mismatchStatus() || rb.status == http.StatusConflict:
		return failed("tenant B's request under tenant A's key got %s: the tenants share keys", rb)
	case rb.status >= 400:
		// Replays of B's refusal would pass the rest and prove nothing.
		return failed("tenant B's request was refused (%s), so the tenants were not compared: give a --tenant-header or --other-auth the API accepts", rb)
	}
	ra2, wa := c.retry(ctx, c.spell(k), c.cfg.Body, a)
	if !ra.same(ra2) {
		return failed("tenant A's retry does not replay its own answer: %s", rerun(ra, ra2, wa))
	}
	rb2, wb := c.retry(ctx, c.spell(k), bBody, b)
	if !rb.same(rb2) {
		return failed("tenant B's retry does not replay its own answer: %s", rerun(rb, rb2, wb))
	}
	return passed("tenants told apart by %s: B's request under A's key ran on its own (%s), and each tenant's retry replays its own answer",
		strings.Join(who, " and "), rb)
}

// runChecks runs the checklist and prints a line per check and a summary.
// newChecker returns a checker of the API cfg names; close releases its
// connections.
func newChecker(cfg checkConfig) (c *checker, close func()) {
	tr := newLoadTransport(cfg.Concurrency)
	return &checker{cfg: cfg, client: &http.Client{
		Transport: tr,
		// A redirect is an answer like any other: replays must repeat it.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, tr.CloseIdleConnections
}

func runChecks(ctx context.Context, cfg checkConfig, out io.Writer) error {
	c, closeChecker := newChecker(cfg)
	defer closeChecker()
	fmt.Fprintf(out, "idem check: %s %s (profile %s, %d concurrent duplicates)\n\n", cfg.Method, cfg.URL, cfg.Profile, cfg.Concurrency)
	counts := map[verdict]int{}
	var failedNames []string
	for _, chk := range checklist {
		if err := ctx.Err(); err != nil {
			return err
		}
		r := chk.run(c, ctx)
		if r.verdict == fail && chk.advisory[cfg.Profile] {
			r.verdict = warn
			r.detail = "(advisory under this profile) " + r.detail
		}
		counts[r.verdict]++
		if r.verdict == fail {
			failedNames = append(failedNames, chk.name)
		}
		fmt.Fprintf(out, "%s  %-16s %s\n      %s\n", r.verdict, chk.name, chk.proves, r.detail)
	}
	fmt.Fprintf(out, "\n%d checks: %d passed, %d failed, %d warnings, %d skipped\n",
		len(checklist), counts[pass], counts[fail], counts[warn], counts[skip])
	if len(failedNames) > 0 {
		return fmt.Errorf("%w: %s", errChecksFailed, strings.Join(failedNames, ", "))
	}
	return nil
}

// alterJSON returns body with one value changed (the first number, string
// or boolean in member-name order, depth first), or ok false when body is
// not JSON.
func alterJSON(body []byte) (_ []byte, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return nil, false
	}
	v, changed := alterValue(v)
	if !changed {
		switch x := v.(type) {
		case map[string]any:
			x["idem_check_alt"] = true
		case []any:
			v = append(x, "idem-check-alt")
		}
	}
	out, err := json.Marshal(v)
	return out, err == nil
}

func alterValue(v any) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		names := make([]string, 0, len(x))
		for k := range x {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			if nv, ok := alterValue(x[k]); ok {
				x[k] = nv
				return x, true
			}
		}
		return x, false
	case []any:
		for i := range x {
			if nv, ok := alterValue(x[i]); ok {
				x[i] = nv
				return x, true
			}
		}
		return x, false
	case json.Number:
		if n, err := x.Int64(); err == nil && n < 1<<53 {
			return json.Number(strconv.FormatInt(n+1, 10)), true
		}
		if f, err := x.Float64(); err == nil {
			return json.Number(strconv.FormatFloat(f*2+1, 'g', -1, 64)), true
		}
		return x, false
	case string:
		return x + "-alt", true
	case bool:
		return !x, true
	case nil:
		return "idem-check-alt", true
	}
	return v, false
}

// requestHeaders collects repeated --header 'Name: value' flags of a
// request.
type requestHeaders struct{ h http.Header }

func (f *requestHeaders) String() string { return "" }

func (f *requestHeaders) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || !validToken(name) {
		return errors.New(`want "Name: value"`)
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return fmt.Errorf("header %s: value holds a line break or NUL", name)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

// bodyArg reads a --body flag: TEXT, or @FILE.
func bodyArg(s string) ([]byte, error) {
	if path, ok := strings.CutPrefix(s, "@"); ok {
		return os.ReadFile(path)
	}
	return []byte(s), nil
}

// targetURL checks the URL of check and bench.
func targetURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want an http:// or https:// URL with a host", raw)
	}
	return nil
}

// defaultBody is the request body of check and bench when none is given:
// the body of the demo's charges API.
const defaultBody = `{"amount":1000,"currency":"eur"}`

const checkSynopsis = `URL [flags]

Runs the idempotency checklist against the API at URL (an API with its own
idempotency keys, or idem proxy in front of one) and prints a line per
check: PASS, FAIL, WARN (recommended, not required) or SKIP (not enough
information), with what the check proves and what was seen. Every check
uses fresh random keys, and most execute the request (give a --body the
API accepts, and --header for its authentication). The exit status is 1
when a required check fails.

Checks: replay, mismatch (--alt-body, default: --body with one JSON value
changed), concurrent (--concurrency duplicates at once), retry-after,
missing-key, malformed-key, repeated-key, spelling, get-passthrough,
no-set-cookie, tenants (needs --tenant-header or --other-auth).
`

// readBodies reads the --body and --alt-body of fs (TEXT or @FILE), makes
// the other body from the first when there is no --alt-body, and sends a
// JSON body as JSON unless a Content-Type was given.
func (c *checkConfig) readBodies(fs *flag.FlagSet, body, alt string) error {
	var err error
	if c.Body, err = bodyArg(body); err != nil {
		return fmt.Errorf("--body: %w", err)
	}
	if alt != "" {
		if c.AltBody, err = bodyArg(alt); err != nil {
			return fmt.Errorf("--alt-body: %w", err)
		}
		if bytes.Equal(c.AltBody, c.Body) {
			return usageErr(fs, "--alt-body must differ from --body")
		}
	} else if b, ok := alterJSON(c.Body); ok {
		c.AltBody = b
	}
	if c.Header == nil {
		c.Header = http.Header{}
	}
	if c.Header.Get("Content-Type") == "" && json.Valid(c.Body) {
		c.Header.Set("Content-Type", "application/json")
	}
	return nil
}

// runCheck is `idem check`.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check", checkSynopsis, stderr)
	method := fs.String("method", http.MethodPost, "protected `method` to check")
	body := fs.String("body", defaultBody, "request body the API accepts: `TEXT`, or @FILE")
	alt := fs.String("alt-body", "", "a different valid body for the mismatch check: `TEXT` or @FILE (default: --body with one JSON value changed)")
	var hdr requestHeaders
	fs.Var(&hdr, "header", "request header `'Name: value'` sent with every request, e.g. authentication (repeatable)")
	profile := fs.String("profile", string(idem.ProfileIETF), "expected dialect: ietf (400 without key, 422 on reuse) or stripe (key optional, 400 on reuse)")
	tenantHeader := fs.String("tenant-header", "", "header `NAME` that carries the tenant; the tenant check sends two random tenants in it")
	otherAuth := fs.String("other-auth", "", "Authorization `VALUE` of a second tenant, for the tenant check")
	conc := fs.Int("concurrency", 8, "simultaneous duplicates in the concurrent check")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on each request, and on waiting out 409s and 503s with Retry-After")
	vectors := fs.Bool("ietf-vectors", false, "run the conformance vectors of the IETF Idempotency-Key draft (-07), each MUST and SHOULD with where idem differs, instead of the checklist")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, "want exactly one URL")
	}
	if err := targetURL(pos[0]); err != nil {
		return usageErr(fs, "%v", err)
	}
	cfg := checkConfig{
		URL: pos[0], Method: strings.ToUpper(*method), Header: hdr.h, Profile: idem.Profile(*profile),
		TenantHeader: *tenantHeader, OtherAuth: *otherAuth, Concurrency: *conc, Timeout: *timeout,
	}
	if cfg.Profile != idem.ProfileIETF && cfg.Profile != idem.ProfileStripe {
		return usageErr(fs, "--profile %q: want ietf or stripe", *profile)
	}
	if cfg.Concurrency < 2 {
		return usageErr(fs, "--concurrency must be at least 2")
	}
	if cfg.Timeout <= 0 {
		return usageErr(fs, "--timeout must be positive")
	}
	if cfg.TenantHeader != "" && !validToken(cfg.TenantHeader) {
		return usageErr(fs, "--tenant-header %q is not a valid header name", cfg.TenantHeader)
	}
	if err := cfg.readBodies(fs, *body, *alt); err != nil {
		return err
	}
	if *vectors {
		_, err := runVectors(ctx, cfg, stdout)
		return err
	}
	return runChecks(ctx, cfg, stdout)
}
