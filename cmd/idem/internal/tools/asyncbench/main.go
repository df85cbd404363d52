// Command asyncbench measures the asynchronous mode of `idem proxy` on
// PostgreSQL as a user runs it:
//
//	go run ./cmd/idem/internal/tools/asyncbench -pg 'postgres://...' [-proxies 2] [-workers 8] [-clients 16] [-duration 5s]
//
// It builds the idem binary, creates a scratch schema, starts a counting
// upstream and -proxies `idem proxy --async 'POST /bench'` processes on
// that schema (each with -workers workers), and runs four phases:
//
//  0. sync: the same proxies on a synchronous route (POST /sync), the
//     same clients for -duration: new keys per second, for scale.
//  1. accept: -clients closed-loop clients post new keys for -duration,
//     round robin over the proxies, while the workers drain the queue: the
//     accepted requests per second and the latency of the 202.
//  2. drain: it waits until the upstream has run every accepted request,
//     and reports the completion rate over the whole run (first accept to
//     last execution), the time from each 202 to its execution by the
//     upstream under that load, and how many keys ran more than once (must
//     be 0).
//  3. end to end: one client posts a request, then reads its status
//     resource every millisecond until the final answer, -sequential
//     times: the latency a client sees from its POST to the stored answer
//     on an idle system (bounded below by the workers' -poll).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/tools/benchdb"
	"github.com/idem-go/idem/cmd/idem/internal/tools/benchnet"
	"github.com/jackc/pgx/v5"
)

type options struct {
	pgURL      string
	proxies    int
	workers    int
	clients    int
	duration   time.Duration
	sequential int
	poll       time.Duration
	idemBin    string
}

func main() {
	var o options
	flag.StringVar(&o.pgURL, "pg", os.Getenv("IDEM_TEST_POSTGRES_URL"), "PostgreSQL URL (default $IDEM_TEST_POSTGRES_URL)")
	flag.IntVar(&o.proxies, "proxies", 2, "idem proxy processes sharing the store")
	flag.IntVar(&o.workers, "workers", 8, "--async-workers of each proxy")
	flag.IntVar(&o.clients, "clients", 16, "closed-loop clients of the accept phase")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "length of the accept phase")
	flag.IntVar(&o.sequential, "sequential", 200, "requests of the end-to-end phase")
	flag.DurationVar(&o.poll, "poll", 10*time.Millisecond, "--async-poll of the proxies")
	flag.StringVar(&o.idemBin, "idem", "", "idem binary to run (default: build ./cmd/idem)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "asyncbench:", err)
		os.Exit(1)
	}
}

// upstream runs each request at once and notes when each key ran.
type upstream struct {
	mu   sync.Mutex
	done map[string]time.Time
	runs map[string]int
	n    atomic.Int64
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.Trim(r.Header.Get("Idempotency-Key"), `"`)
	io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.runs[key]++
	u.done[key] = time.Now()
	u.mu.Unlock()
	u.n.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q}`, key)
}

func run(o options) error {
	if o.pgURL == "" {
		return errors.New("-pg (or $IDEM_TEST_POSTGRES_URL) is required")
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "asyncbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if o.idemBin == "" {
		o.idemBin = filepath.Join(dir, "idem")
		fmt.Fprintln(os.Stderr, "building ./cmd/idem")
		if out, err := exec.Command("go", "build", "-o", o.idemBin, "./cmd/idem").CombinedOutput(); err != nil {
			return fmt.Errorf("build idem: %v\n%s", err, out)
		}
	}
	conn, err := pgx.Connect(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	schema := "asyncbench_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := benchdb.CreateSchema(ctx, conn, schema); err != nil {
		return err
	}
	defer benchdb.DropSchema(conn, schema)
	storeURL, err := benchdb.WithSearchPath(o.pgURL, schema)
	if err != nil {
		return err
	}

	up := &upstream{done: map[string]time.Time{}, runs: map[string]int{}}
	usrv := httptest.NewServer(up)
	defer usrv.Close()

	var bases []string
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			p.Process.Signal(os.Interrupt)
			p.Wait()
		}
	}()
	for range o.proxies {
		addr, err := benchnet.FreeAddr()
		if err != nil {
			return err
		}
		cmd := exec.Command(o.idemBin, "proxy", "--upstream", usrv.URL, "--store", storeURL, "--single-tenant",
			"--async", "POST /bench", "--async-workers", strconv.Itoa(o.workers), "--async-poll", o.poll.String(),
			"--log-level", "warn", "--listen", addr)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, cmd)
		if err := benchnet.WaitListening(addr); err != nil {
			return err
		}
		bases = append(bases, "http://"+addr)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	// Phase 0: the same proxies on a synchronous route, for scale.
	var syncN atomic.Int64
	var syncNs []time.Duration
	var smu sync.Mutex
	var swg sync.WaitGroup
	sstart := time.Now()
	sstop := sstart.Add(o.duration)
	for c := range o.clients {
		swg.Go(func() {
			base := bases[c%len(bases)]
			for i := 0; time.Now().Before(sstop); i++ {
				t0 := time.Now()
				status, _, err := postTo(client, base+"/sync", fmt.Sprintf("s%d-%d", c, i))
				if err == nil && status == http.StatusCreated {
					syncN.Add(1)
					smu.Lock()
					syncNs = append(syncNs, time.Since(t0))
					smu.Unlock()
				}
			}
		})
	}
	swg.Wait()
	selapsed := time.Since(sstart)
	fmt.Printf("sync (same proxies, a synchronous route, for scale): %.0f new keys/s, p50 %v p99 %v\n",
		float64(syncN.Load())/selapsed.Seconds(), pct(syncNs, 50), pct(syncNs, 99))

	// Phase 1: accept under load.
	var (
		mu       sync.Mutex
		accepted = map[string]time.Time{}
		acceptNs []time.Duration
		failures atomic.Int64
		seq      atomic.Int64
		wg       sync.WaitGroup
	)
	start := time.Now()
	stop := start.Add(o.duration)
	for c := range o.clients {
		wg.Go(func() {
			base := bases[c%len(bases)]
			for time.Now().Before(stop) {
				key := "k" + strconv.FormatInt(seq.Add(1), 10)
				t0 := time.Now()
				status, _, err := post(client, base, key)
				if err != nil || status != http.StatusAccepted {
					failures.Add(1)
					continue
				}
				mu.Lock()
				accepted[key] = time.Now()
				acceptNs = append(acceptNs, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := len(accepted)
	fmt.Printf("accept: %d requests in %v by %d clients over %d proxies (%d workers each): %.0f accepted/s, 202 latency p50 %v p99 %v, %d failures\n",
		n, elapsed.Round(time.Millisecond), o.clients, o.proxies, o.workers, float64(n)/elapsed.Seconds(),
		pct(acceptNs, 50), pct(acceptNs, 99), failures.Load())

	// Phase 2: drain.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		up.mu.Lock()
		ran := 0
		for k := range accepted {
			if _, ok := up.done[k]; ok {
				ran++
			}
		}
		up.mu.Unlock()
		if ran == n {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drain: %d of %d ran within 5m", ran, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	up.mu.Lock()
	var last time.Time
	var queued []time.Duration
	dups := 0
	for k, at := range accepted {
		d := up.done[k]
		if d.After(last) {
			last = d
		}
		queued = append(queued, d.Sub(at))
		if up.runs[k] > 1 {
			dups++
		}
	}
	up.mu.Unlock()
	total := last.Sub(start)
	fmt.Printf("drain: all %d ran upstream %v after the first accept: %.0f completed/s; 202 to execution p50 %v p99 %v max %v; keys run more than once: %d\n",
		n, total.Round(time.Millisecond), float64(n)/total.Seconds(), pct(queued, 50), pct(queued, 99), pct(queued, 100), dups)

	// Phase 3: end to end on an idle system.
	var e2e []time.Duration
	for i := range o.sequential {
		key := "seq" + strconv.Itoa(i)
		base := bases[i%len(bases)]
		t0 := time.Now()
		status, loc, err := post(client, base, key)
		if err != nil || status != http.StatusAccepted {
			return fmt.Errorf("sequential post: %d %v", status, err)
		}
		for {
			resp, err := client.Get(bases[(i+1)%len(bases)] + loc)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusCreated {
				break
			}
			if resp.StatusCode != http.StatusAccepted {
				return fmt.Errorf("status read: %d", resp.StatusCode)
			}
			time.Sleep(time.Millisecond)
		}
		e2e = append(e2e, time.Since(t0))
	}
	fmt.Printf("end to end (idle, --async-poll %v): POST to stored answer p50 %v p90 %v p99 %v over %d requests\n",
		o.poll, pct(e2e, 50), pct(e2e, 90), pct(e2e, 99), len(e2e))
	return nil
}

func post(c *http.Client, base, key string) (int, string, error) {
	return postTo(c, base+"/bench", key)
}

func postTo(c *http.Client, target, key string) (int, string, error) {
	req, err := http.NewRequest("POST", target, strings.NewReader(`{"report":"monthly"}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location"), nil
}

// pct is the p-th percentile of ds (100: the maximum).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, len(s)*p/100)
	return s[i].Round(10 * time.Microsecond)
}
