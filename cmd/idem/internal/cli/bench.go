package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/internal/plural"
)

// benchConfig is what idem bench sends.
type benchConfig struct {
	URL         string
	Method      string
	Body        []byte
	Header      http.Header
	Keys        int
	Dups        int
	Concurrency int
	// Duration, when positive, keeps sending rounds of Keys x Dups
	// requests, each round under new keys, until it has passed.
	Duration time.Duration
	// ReplayOnly completes one key first and sends every request under it.
	ReplayOnly bool
	Timeout    time.Duration
}

// benchClass is what an answer was, as the client sees it.
type benchClass int

const (
	classExecuted benchClass = iota // none of the others
	classReplayed                   // Idempotent-Replayed: true
	classConflict                   // the first was in flight (or its outcome unknown): 409, or the profile's deferral
	classFailed                     // 5xx: the request failed, and a retry runs again
	numClasses
)

// classNames are padded alike: the report's table aligns right.
var classNames = [numClasses]string{"first executions", "replays         ", "409 in progress ", "5xx answers     "}

// benchStats is one worker's tally; workers merge theirs at the end.
type benchStats struct {
	latency    [numClasses][]time.Duration
	status     map[int]int
	errors     int
	errSamples []string
	// executions counts, per key, the answers that were neither replays
	// nor deferrals nor 5xx (a 5xx releases the key, and a retry runs
	// again).
	executions map[string]int
}

func newBenchStats() *benchStats {
	return &benchStats{status: map[int]int{}, executions: map[string]int{}}
}

func (s *benchStats) merge(o *benchStats) {
	for c := range o.latency {
		s.latency[c] = append(s.latency[c], o.latency[c]...)
	}
	for k, v := range o.status {
		s.status[k] += v
	}
	s.errors += o.errors
	for _, e := range o.errSamples {
		if len(s.errSamples) < 3 && !slices.Contains(s.errSamples, e) {
			s.errSamples = append(s.errSamples, e)
		}
	}
	for k, v := range o.executions {
		s.executions[k] += v
	}
}

// benchWork hands out the keys to send, one per request.
type benchWork struct {
	mu       sync.Mutex
	jobs     []string
	next     int
	round    int
	deadline time.Time // zero: one round only
	ctx      context.Context
	newRound func(round int) []string
}

// take returns the key of the next request, or false when the run is over.
func (w *benchWork) take() (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx.Err() != nil {
		return "", false
	}
	if w.next == len(w.jobs) {
		if w.deadline.IsZero() || time.Now().After(w.deadline) {
			return "", false
		}
		w.round++
		w.jobs, w.next = w.newRound(w.round), 0
	}
	if !w.deadline.IsZero() && time.Now().After(w.deadline) {
		return "", false
	}
	k := w.jobs[w.next]
	w.next++
	return k, true
}

// newLoadTransport is a transport for many concurrent requests to one
// host: Go's default keeps 2 idle connections per host, so a load tool
// would measure its own dialing. Like any net/http client, it may resend
// a request carrying Idempotency-Key once when a reused connection fails
// before the answer: that is a client retry, which the API must absorb.
func newLoadTransport(concurrency int) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0, // no limit across hosts
		MaxIdleConnsPerHost:   max(concurrency, 2),
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}
}

// bench runs the load and prints its report.
func bench(ctx context.Context, cfg benchConfig, out io.Writer, prog *progress) error {
	tr := newLoadTransport(cfg.Concurrency)
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// Requests in flight finish when ctx ends (an interrupted run still
	// reports what it did); ctx only stops new ones.
	reqCtx := context.WithoutCancel(ctx)

	work, mode, err := benchPlan(ctx, c, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "idem bench: %s %s\n  %s, concurrency %d\n\n", cfg.Method, cfg.URL, mode, cfg.Concurrency)

	total, elapsed := benchRun(reqCtx, c, cfg, work, prog)
	err = benchReport(out, cfg, total, elapsed)
	if ctx.Err() != nil {
		// The report covers only part of the run: its verdict is not
		// the run's.
		err = errors.Join(err, fmt.Errorf("bench: interrupted before the end of the run: %w", ctx.Err()))
	}
	return err
}

// benchPlan is the keys of the run's rounds and its description. A
// replay-only run first completes its one key: nothing is measured yet,
// so an interruption stops it at once.
func benchPlan(ctx context.Context, c *http.Client, cfg benchConfig) (*benchWork, string, error) {
	prefix := newKey()[len("idem-check-"):]
	newRound := func(round int) []string {
		jobs := make([]string, 0, cfg.Keys*cfg.Dups)
		for i := range cfg.Keys {
			for range cfg.Dups {
				jobs = append(jobs, fmt.Sprintf("idem-bench-%s-%d-%d", prefix, round, i))
			}
		}
		rand.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
		return jobs
	}
	mode := plural.Count(cfg.Keys, "key", "keys") + " x " + plural.Count(cfg.Dups, "duplicate", "duplicates") + ", shuffled"
	if cfg.ReplayOnly {
		key := "idem-bench-" + prefix + "-replay"
		first, err := benchWarmup(ctx, c, cfg, key)
		if err != nil {
			return nil, "", err
		}
		newRound = func(int) []string { return slices.Repeat([]string{key}, cfg.Keys*cfg.Dups) }
		mode = fmt.Sprintf("replay only: one completed key (first answer %d), %s a round", first, plural.Count(cfg.Keys*cfg.Dups, "request", "requests"))
	}
	work := &benchWork{ctx: ctx, newRound: newRound, jobs: newRound(0)}
	if cfg.Duration > 0 {
		work.deadline = time.Now().Add(cfg.Duration)
		mode += fmt.Sprintf(", new keys every round for %s", cfg.Duration)
	}
	return work, mode, nil
}

// benchRun sends work's requests from cfg.Concurrency workers and returns
// their statistics and how long they took.
func benchRun(reqCtx context.Context, c *http.Client, cfg benchConfig, work *benchWork, prog *progress) (*benchStats, time.Duration) {
	parts := make([]*benchStats, cfg.Concurrency)
	var wg sync.WaitGroup
	var done, failed atomic.Int64
	start := time.Now()
	stop := prog.start(func() string {
		elapsed := time.Since(start)
		n := done.Load()
		total := fmt.Sprint(cfg.Keys * cfg.Dups)
		if cfg.Duration > 0 {
			total = fmt.Sprintf("%d a round, %s of %s", cfg.Keys*cfg.Dups, elapsed.Round(time.Second), cfg.Duration)
		}
		return fmt.Sprintf("bench: %d/%s requests, %s, %s", n, total, rate(n, elapsed), plural.Count(failed.Load(), "error", "errors"))
	})
	for i := range parts {
		s := newBenchStats()
		parts[i] = s
		wg.Go(func() {
			for {
				key, ok := work.take()
				if !ok {
					return
				}
				if !benchOne(reqCtx, c, cfg, key, s) {
					failed.Add(1)
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	stop()
	elapsed := time.Since(start)
	total := newBenchStats()
	for _, s := range parts {
		total.merge(s)
	}
	return total, elapsed
}

// benchWarmup completes the key of a replay-only run.
func benchWarmup(ctx context.Context, c *http.Client, cfg benchConfig, key string) (int, error) {
	deadline := time.Now().Add(cfg.Timeout)
	for {
		a := benchRequest(ctx, c, cfg, key)
		switch status := a.status; {
		case a.err != nil:
			return 0, fmt.Errorf("bench: the first request failed: %w", a.err)
		case a.inFlight() && time.Now().Before(deadline):
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return 0, err
			}
			continue
		case status >= 400:
			return 0, fmt.Errorf("bench: the first request under the replayed key got %d: give a --method, --body and --header the API accepts", status)
		}
		return a.status, nil
	}
}

// benchRequest sends one request under key. The answer keeps its body
// when it may be a deferral other than 409, which only its body tells from
// an execution; other bodies are discarded unread into memory.
func benchRequest(ctx context.Context, c *http.Client, cfg benchConfig, key string) answer {
	var body io.Reader
	if cfg.Body != nil {
		body = bytes.NewReader(cfg.Body)
	}
	req, err := http.NewRequestWithContext(ctx, cfg.Method, cfg.URL, body)
	if err != nil {
		return answer{err: err}
	}
	for k, v := range cfg.Header {
		req.Header[k] = v
	}
	req.Header["Idempotency-Key"] = []string{quoted(key)}
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	if a.status == http.StatusAccepted || a.status == http.StatusTooManyRequests {
		// Only these may be deferrals, told apart by their body (inFlight).
		a.body, err = io.ReadAll(resp.Body)
	} else {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	if err != nil {
		return answer{err: err}
	}
	return a
}

// benchOne sends one request and counts it in s; it reports whether the
// request succeeded (an answer below 500).
func benchOne(ctx context.Context, c *http.Client, cfg benchConfig, key string, s *benchStats) bool {
	t0 := time.Now()
	a := benchRequest(ctx, c, cfg, key)
	took := time.Since(t0)
	if a.err != nil {
		s.errors++
		if len(s.errSamples) < 3 {
			s.errSamples = append(s.errSamples, a.err.Error())
		}
		return false
	}
	s.status[a.status]++
	class := classExecuted
	switch {
	case a.status >= 500:
		class = classFailed
	case a.inFlight():
		class = classConflict
	case a.replayed():
		class = classReplayed
	default:
		s.executions[key]++
	}
	s.latency[class] = append(s.latency[class], took)
	return class != classFailed
}

// percentile returns the nearest-rank percentile p (0..1] of sorted d.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func fmtLatency(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// printBenchLatencies prints the latencies of each class of answer.
func printBenchLatencies(out io.Writer, s *benchStats) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "                \tcount\tp50\tp90\tp99\tmax\t")
	for c := range numClasses {
		d := s.latency[c]
		slices.Sort(d)
		if len(d) == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t-\t\n", classNames[c])
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", classNames[c], len(d),
			fmtLatency(percentile(d, .50)), fmtLatency(percentile(d, .90)),
			fmtLatency(percentile(d, .99)), fmtLatency(d[len(d)-1]))
	}
	tw.Flush()
}

// printBenchStatuses prints how many answers had each status, and a few
// of the errors.
func printBenchStatuses(out io.Writer, s *benchStats) {
	fmt.Fprint(out, "\nstatuses:")
	codes := make([]int, 0, len(s.status))
	for code := range s.status {
		codes = append(codes, code)
	}
	slices.Sort(codes)
	for _, code := range codes {
		fmt.Fprintf(out, "  %d x %d", code, s.status[code])
	}
	fmt.Fprintln(out)
	if s.errors > 0 {
		fmt.Fprintf(out, "errors: %d, e.g. %s\n", s.errors, strings.Join(s.errSamples, "; "))
	}
}

func benchReport(out io.Writer, cfg benchConfig, s *benchStats, elapsed time.Duration) error {
	answered := 0
	for _, n := range s.status {
		answered += n
	}
	sent := answered + s.errors
	fmt.Fprintf(out, "%s in %s: %.1f requests/s, %s\n\n", plural.Count(sent, "request", "requests"),
		elapsed.Round(time.Millisecond), float64(sent)/elapsed.Seconds(), plural.Count(s.errors, "error", "errors"))

	printBenchLatencies(out, s)
	printBenchStatuses(out, s)
	var keys, twice, executions int
	for _, n := range s.executions {
		keys++
		executions += n
		if n > 1 {
			twice++
		}
	}
	switch {
	case twice > 0:
		were := " were"
		if twice == 1 {
			were = " was"
		}
		fmt.Fprintf(out, "DUPLICATES: %s answered as new executions more than once (%s for %s)\n",
			plural.Count(twice, "key", "keys")+were, plural.Count(executions, "execution", "executions"), plural.Count(keys, "key", "keys"))
	case cfg.ReplayOnly:
		fmt.Fprintf(out, "no request ran again: %s under the completed key\n", plural.Count(executions, "new execution", "new executions"))
	default:
		fmt.Fprintf(out, "no key ran twice: %s for %s\n", plural.Count(executions, "execution", "executions"), plural.Count(keys, "key", "keys"))
	}

	var errs []error
	if s.errors > 0 {
		errs = append(errs, fmt.Errorf("%s failed", plural.Count(s.errors, "request", "requests")))
	}
	if n := len(s.latency[classFailed]); n > 0 {
		errs = append(errs, fmt.Errorf("%s answered 5xx", plural.Count(n, "request", "requests")))
	}
	if twice > 0 || cfg.ReplayOnly && executions > 0 {
		errs = append(errs, errors.New("duplicates of a key ran more than once"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

const benchSynopsis = `URL [flags]

Sends --keys keys x --dups duplicates of a request (shuffled, so the
duplicates of a key meet at random) from --concurrency clients and prints
the request rate, latency percentiles of first executions, replays, 409s
(or the profile's other in-flight answer: 429 lock_timeout, 202) and 5xx
apart, the statuses and the errors. --duration repeats rounds under new keys
until it has passed. --replay-only completes one key first and sends every
request under it. The exit status is 1 when requests failed (no answer, or
a 5xx), a key was answered as a new execution twice, or the run was
interrupted. With --progress (the default when stderr
is a terminal) a line on stderr every second tells the requests done out
of the total, the rate and the errors so far.
`

// runBench is `idem bench`.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", benchSynopsis, stderr)
	var cfg benchConfig
	fs.StringVar(&cfg.URL, "url", "", "`URL` to send the requests to: the older spelling of the URL argument, still accepted")
	fs.StringVar(&cfg.Method, "method", http.MethodPost, "request `method`")
	body := fs.String("body", defaultBody, "request body: `TEXT`, or @FILE")
	var hdr requestHeaders
	fs.Var(&hdr, "header", "request header `'Name: value'` (repeatable)")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys a round")
	fs.IntVar(&cfg.Dups, "dups", 2, "requests per key (1: no duplicates)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 32, "requests in flight")
	fs.DurationVar(&cfg.Duration, "duration", 0, "run rounds under new keys for this long; 0: one round")
	fs.BoolVar(&cfg.ReplayOnly, "replay-only", false, "complete one key, then send every request under it")
	fs.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "bound on each request")
	var pf progressFlags
	pf.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	// The URL is an argument, as for idem check; --url is kept for the
	// command lines written before.
	switch {
	case len(pos) == 1 && cfg.URL == "":
		cfg.URL = pos[0]
	case len(pos) > 0 && cfg.URL != "":
		return usageErr(fs, "the URL is given twice, as %q and with --url", pos[0])
	case len(pos) > 1:
		return usageErr(fs, "unexpected argument %q", pos[1])
	case cfg.URL == "":
		return usageErr(fs, "the URL to load is required: idem bench URL")
	}
	if err := targetURL(cfg.URL); err != nil {
		return usageErr(fs, "URL %v", err)
	}
	for name, v := range map[string]int{"keys": cfg.Keys, "dups": cfg.Dups, "concurrency": cfg.Concurrency} {
		if err := positive(fs, name, v); err != nil {
			return err
		}
	}
	if cfg.Duration < 0 || cfg.Timeout <= 0 {
		return usageErr(fs, "--duration must not be negative and --timeout must be positive")
	}
	cfg.Method = strings.ToUpper(cfg.Method)
	if cfg.Body, err = bodyArg(*body); err != nil {
		return fmt.Errorf("--body: %w", err)
	}
	cfg.Header = hdr.h
	if cfg.Header == nil {
		cfg.Header = http.Header{}
	}
	if cfg.Header.Get("Content-Type") == "" && len(cfg.Body) > 0 && json.Valid(cfg.Body) {
		cfg.Header.Set("Content-Type", "application/json")
	}
	prog, err := pf.open(stderr)
	if err != nil {
		return err
	}
	return bench(ctx, cfg, stdout, prog)
}
