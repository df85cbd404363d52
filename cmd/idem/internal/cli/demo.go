package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/internal/plural"
)

// serveDemo serves api on a free loopback port and returns its URL and
// the function that stops it.
func serveDemo(ctx context.Context, api http.Handler) (string, func() error, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	stop := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// serveProxy serves a proxy of cfg until the returned function stops it
// and returns what Serve returned.
func serveProxy(ctx context.Context, cfg ProxyConfig) (*Proxy, func() error, error) {
	p, err := NewProxy(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Serve(pctx) }()
	return p, func() error {
		cancel()
		return <-done
	}, nil
}

// demoCharges is the demo's upstream: a fake payments API that makes a
// numbered charge per POST and counts them, so the tour can show how many
// times the upstream really ran.
type demoCharges struct {
	// delay is how long a charge takes; it lets concurrent duplicates
	// meet while the first is in flight.
	delay   time.Duration
	charges atomic.Int64
}

func (d *demoCharges) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/charges":
		var in struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 || in.Currency == "" {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"want {\"amount\": a positive integer, \"currency\": \"eur\"}"}`+"\n")
			return
		}
		if sleepCtx(r.Context(), d.delay) != nil {
			return
		}
		n := d.charges.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","amount":%d,"currency":%q}`+"\n", n, in.Amount, in.Currency)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/charges/count":
		fmt.Fprintf(w, `{"charges":%d}`+"\n", d.charges.Load())
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":"try POST /v1/charges or GET /v1/charges/count"}`+"\n")
	}
}

// demoTour prints each request of the tour and its answer, and checks
// that idem answered as it should.
type demoTour struct {
	out    io.Writer
	client *http.Client
	base   string // the proxy
	api    *demoCharges
	step   int
	posts  atomic.Int64
}

// demoReq is one request of the tour.
type demoReq struct {
	key  string // "" : no Idempotency-Key
	body string
}

func (t *demoTour) title(text string) {
	t.step++
	fmt.Fprintf(t.out, "\n%d. %s\n", t.step, text)
}

func (t *demoTour) show(r demoReq) {
	line := "   POST /v1/charges"
	if r.key != "" {
		line += "  Idempotency-Key: " + quoted(r.key)
	}
	fmt.Fprintf(t.out, "%s  %s\n", line, r.body)
}

func (t *demoTour) showAnswer(a answer) {
	if a.err != nil {
		fmt.Fprintf(t.out, "   <- error: %v\n", a.err)
		return
	}
	line := fmt.Sprintf("   <- %d %s", a.status, http.StatusText(a.status))
	for _, h := range []string{"Idempotent-Replayed", "Retry-After"} {
		if v := a.header.Get(h); v != "" {
			line += "  " + h + ": " + v
		}
	}
	body := bytes.TrimSpace(a.body)
	var buf bytes.Buffer
	if json.Compact(&buf, body) == nil {
		body = buf.Bytes()
	}
	if len(body) > 200 {
		body = append(body[:200:200], "…"...)
	}
	fmt.Fprintf(t.out, "%s  %s\n", line, body)
}

// do sends r through the proxy. wait makes a retry wait out a 409 the way
// a client honouring Retry-After would (only while the first request's
// record is being written; the tour's own 409 step does not wait).
func (t *demoTour) do(ctx context.Context, r demoReq) answer {
	t.posts.Add(1)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.base+"/v1/charges", strings.NewReader(r.body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if r.key != "" {
		req.Header.Set("Idempotency-Key", quoted(r.key))
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

func (t *demoTour) send(ctx context.Context, r demoReq) answer {
	t.show(r)
	a := t.do(ctx, r)
	t.showAnswer(a)
	return a
}

func (t *demoTour) charges(want int64) error {
	n := t.api.charges.Load()
	fmt.Fprintf(t.out, "   upstream charges made so far: %d\n", n)
	if n != want {
		return fmt.Errorf("demo: the upstream made %s, want %d", plural.Count(n, "charge", "charges"), want)
	}
	return nil
}

func (t *demoTour) run(ctx context.Context) error {
	key := newKey()[len("idem-check-"):]
	first := demoReq{key: "order-" + key[:8], body: `{"amount":1000,"currency":"eur"}`}
	a1, err := t.newCharge(ctx, first)
	if err == nil {
		err = t.retry(ctx, first, a1)
	}
	if err == nil {
		err = t.reusedKey(ctx, first)
	}
	if err == nil {
		err = t.duplicates(ctx, demoReq{key: "order-" + key[8:16], body: `{"amount":2500,"currency":"eur"}`})
	}
	if err == nil {
		err = t.keyless(ctx)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(t.out, "\nThe upstream made 2 charges for %d POST requests: each charge ran once.\n", t.posts.Load())
	return nil
}

func (t *demoTour) newCharge(ctx context.Context, first demoReq) (answer, error) {
	t.title("A new charge under a new key: the upstream runs it.")
	a1 := t.send(ctx, first)
	if a1.err != nil || a1.status != http.StatusCreated {
		return a1, fmt.Errorf("demo: the first charge got %s, want 201", a1)
	}
	return a1, t.charges(1)
}

func (t *demoTour) retry(ctx context.Context, first demoReq, a1 answer) error {
	t.title("The answer was lost; the client retries with the same key. idem replays the\n   first answer and does not call the upstream.")
	t.show(first)
	a2 := t.do(ctx, first)
	for deadline := time.Now().Add(5 * time.Second); a2.status == http.StatusConflict && time.Now().Before(deadline); {
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
		a2 = t.do(ctx, first)
	}
	t.showAnswer(a2)
	if !a1.same(a2) || !a2.replayed() {
		return fmt.Errorf("demo: the retry got %s, want a replay of %s", a2, a1)
	}
	fmt.Fprintln(t.out, "   same status and body as the first answer, marked Idempotent-Replayed")
	return t.charges(1)
}

func (t *demoTour) reusedKey(ctx context.Context, first demoReq) error {
	t.title("The same key with a different amount is a client bug: refused, and the first\n   charge's record is untouched.")
	a3 := t.send(ctx, demoReq{key: first.key, body: `{"amount":9999,"currency":"eur"}`})
	if a3.status != http.StatusUnprocessableEntity {
		return fmt.Errorf("demo: the reused key got %s, want 422", a3)
	}
	return t.charges(1)
}

func (t *demoTour) duplicates(ctx context.Context, dup demoReq) error {
	t.title("Two duplicates of a new key at the same moment (a double click): one runs,\n   the other is told to retry (409) or gets the replay.")
	t.show(dup)
	t.show(dup)
	var pair [2]answer
	startGate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range pair {
		wg.Go(func() {
			<-startGate
			pair[i] = t.do(ctx, dup)
		})
	}
	close(startGate)
	wg.Wait()
	var created, deferred int
	for _, a := range pair {
		t.showAnswer(a)
		switch {
		case a.err == nil && a.status == http.StatusCreated && !a.replayed():
			created++
		case a.err == nil && (a.status == http.StatusConflict || a.replayed()):
			deferred++
		}
	}
	if created != 1 || deferred != 1 {
		return fmt.Errorf("demo: the duplicates got %s and %s, want one 201 and one 409 or replay", pair[0], pair[1])
	}
	return t.charges(2)
}

func (t *demoTour) keyless(ctx context.Context) error {
	t.title("A POST without Idempotency-Key is refused: a retry of it could not be told\n   from a new charge.")
	a5 := t.send(ctx, demoReq{body: `{"amount":500,"currency":"eur"}`})
	if a5.status != http.StatusBadRequest {
		return fmt.Errorf("demo: the request without a key got %s, want 400", a5)
	}
	return t.charges(2)
}

const demoSynopsis = `[--keep] [--store DSN] [--listen ADDR]

Shows idem at work with nothing else running: starts a fake charges API on
a free loopback port, starts idem proxy in front of it (its keys in a
SQLite file in a temporary directory, or in --store), then sends a scripted
tour of requests and prints each request and answer: a first charge, its
retry (replayed), the key reused with another amount (422), two concurrent
duplicates (one runs), a request without a key (400). Then it stops
everything, unless --keep: the proxy and the fake API keep running for
you to try with curl until interrupted (Ctrl-C).
`

// runDemo is `idem demo`.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := newFlags("demo", demoSynopsis, stderr)
	keep := fs.Bool("keep", false, "leave the proxy and the fake API running after the tour, until interrupted")
	dsn := fs.String("store", "", "store `DSN` of the proxy (default: sqlite: in a temporary directory)")
	listen := fs.String("listen", "127.0.0.1:0", "`address` of the proxy (default: a free loopback port)")
	delay := fs.Duration("delay", 300*time.Millisecond, "how long the fake API takes for a charge (lets duplicates meet)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *delay < 0 {
		return usageErr(fs, "--delay must not be negative")
	}
	logger, err := newLogger(stderr, "text", "error")
	if err != nil {
		return err
	}

	storeDSN, cleanup, err := demoStore(*dsn)
	if err != nil {
		return err
	}
	defer cleanup()

	api := &demoCharges{delay: *delay}
	upURL, stopUp, err := serveDemo(ctx, api)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer func() {
		if uerr := stopUp(); uerr != nil {
			err = errors.Join(err, fmt.Errorf("demo: upstream: %w", uerr))
		}
	}()
	p, stopProxy, err := serveProxy(ctx, ProxyConfig{
		Listen: *listen, Upstream: upURL, Store: storeDSN, Migrate: true,
		// The tour is one caller.
		SingleTenant:    true,
		ShutdownTimeout: 5 * time.Second, Logger: logger,
	})
	if err != nil {
		return err
	}
	defer func() {
		if perr := stopProxy(); perr != nil {
			err = errors.Join(err, perr)
		}
	}()
	base := "http://" + p.Addr().String()

	fmt.Fprintf(stdout, "idem demo\n  fake charges API  %s  (counts the charges it makes: GET /v1/charges/count)\n  idem proxy        %s  in front of it, keys in %s\n",
		upURL, base, storeDSN)
	tr := newLoadTransport(4)
	defer tr.CloseIdleConnections()
	tour := &demoTour{out: stdout, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, base: base, api: api}
	if err := tour.run(ctx); err != nil {
		return err
	}
	if *keep {
		keepServing(ctx, stdout, base, upURL)
	}
	return nil
}

// demoStore is the store of the demo: dsn, else a SQLite database in a
// temporary directory that cleanup removes.
func demoStore(dsn string) (_ string, cleanup func(), _ error) {
	if dsn != "" {
		return dsn, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "idem-demo-")
	if err != nil {
		return "", nil, err
	}
	return "sqlite:" + filepath.Join(dir, "idem.db"), func() { os.RemoveAll(dir) }, nil
}

// keepServing says how to try the proxy at base in front of the fake API
// at upURL, and returns when ctx ends.
func keepServing(ctx context.Context, stdout io.Writer, base, upURL string) {
	fmt.Fprintf(stdout, `
Still running; press Ctrl-C to stop.
  idem proxy        %[1]s
  fake charges API  %[2]s
Try:
  curl -i %[1]s/v1/charges -H 'Idempotency-Key: "my-key-1"' -H 'Content-Type: application/json' -d '{"amount":700,"currency":"eur"}'
  curl %[2]s/v1/charges/count
`, base, upURL)
	<-ctx.Done()
	fmt.Fprintln(stdout, "stopping")
}
