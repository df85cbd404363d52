package main

// The fault test: several idem proxy processes on one store, a counting
// upstream, concurrent duplicates of every logical request sent through
// different proxies, proxies SIGKILLed and restarted while they serve and,
// on PostgreSQL, the database server crashed and restarted. It checks the
// promises a client relies on:
//
//   - the upstream executes each key at most once;
//   - an answer a client received as 2xx is the key's answer for good:
//     every other answer for the key, during the run and after it settled,
//     is byte-identical (never 409 outcome-unknown, never another body);
//   - a 2xx answer names its key and an execution the upstream recorded.
//
// The failover topology (TestFaultPostgresFailover) replaces the crash of
// PostgreSQL by a failover: a private primary with a synchronous streaming
// standby, the primary killed mid-run and the standby promoted, the
// proxies on a multi-host URL finding the new primary by themselves.
//
// A key whose proxy died mid-request may end as 409 outcome-unknown (the
// default lease policy never runs it again); that is counted, not an error,
// unless a client had received a 2xx for it.
//
// The reduced run (go test) takes seconds; IDEM_FAULT_FULL=1 or
// -fault.full runs the long one (make fault). Both print their counts.
//
// PostgreSQL runs as a private cluster of this test (initdb into a temporary
// directory, its own port), never the shared server. initdb and postgres
// refuse to run as root: as root, every PostgreSQL command runs through
// `runuser -u postgres --`, in a directory owned by postgres.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgcluster"
)

var faultFull = flag.Bool("fault.full", false, "run the full fault test (also IDEM_FAULT_FULL=1)")

// faultTenantHeader carries the tenant of every fault-test request.
const faultTenantHeader = "X-Tenant"

// faultProxyArgs is the proxy command line of the fault test, besides
// --listen and --log-format; the tenant flag is here and nowhere else. The
// lease is short, so that the keys of a killed proxy settle within seconds,
// yet longer than SQLite's busy timeout (5s), so that a loaded machine
// rarely loses a live execution's lease.
func faultProxyArgs(dsn, upstream string) []string {
	return []string{
		"--store", dsn, "--upstream", upstream,
		"--tenant-from", "trusted-header:" + faultTenantHeader,
		"--lease", "5s", "--sweep-interval", "250ms",
	}
}

// faultPlan sizes a run.
type faultPlan struct {
	proxies     int
	keys        int
	dups        int // concurrent clients per key, starting on different proxies
	kills       int // SIGKILLs of a proxy, each followed by a restart
	pgRestarts  int // crashes and restarts of PostgreSQL (PostgreSQL only)
	inFlight    int // keys under way at once
	largeEvery  int // every n-th key answers ~900 KB
	clientLimit time.Duration
	settleLimit time.Duration
	proxyArgs   []string // more flags of every proxy
}

func faultPlanFor(pg bool) faultPlan {
	p := faultPlan{
		proxies: 3, keys: 200, dups: 4, kills: 3, inFlight: 16, largeEvery: 10,
		clientLimit: 2 * time.Minute, settleLimit: 2 * time.Minute,
	}
	if *faultFull || os.Getenv("IDEM_FAULT_FULL") == "1" {
		p = faultPlan{
			proxies: 4, keys: 3000, dups: 6, kills: 30, pgRestarts: 4, inFlight: 32, largeEvery: 8,
			clientLimit: 5 * time.Minute, settleLimit: 5 * time.Minute,
		}
	}
	if pg {
		p.pgRestarts = max(p.pgRestarts, 1)
	} else {
		p.pgRestarts = 0
	}
	return p
}

// pairPlan sizes a run on a primary and its standby: one database fault,
// the failover or the stall.
func pairPlan() faultPlan {
	if *faultFull || os.Getenv("IDEM_FAULT_FULL") == "1" {
		return faultPlan{
			proxies: 3, keys: 1500, dups: 4, kills: 10, pgRestarts: 1, inFlight: 24, largeEvery: 8,
			clientLimit: 5 * time.Minute, settleLimit: 5 * time.Minute,
		}
	}
	return faultPlan{
		proxies: 2, keys: 120, dups: 3, kills: 1, pgRestarts: 1, inFlight: 12, largeEvery: 10,
		clientLimit: 2 * time.Minute, settleLimit: 2 * time.Minute,
	}
}

func TestFaultSQLite(t *testing.T) {
	skipShort(t)
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	runFault(t, "sqlite", dsn, faultPlanFor(false), nil)
}

func TestFaultPostgres(t *testing.T) {
	skipShort(t)
	pg := pgcluster.Start(t, "")
	runFault(t, "postgres", pg.DSN(), faultPlanFor(true), func(r *faultRun) { r.crashPG(pg) })
}

// The failover topology: a private primary and its synchronous streaming
// standby, proxies on a multi-host URL with target_session_attrs=read-write
// and --require-synchronous-replication. Mid-run the primary is killed
// (pg_ctl stop -m immediate) while executions are held, and the standby is
// promoted: the proxies that were not killed find the new primary without
// a restart, and no key runs twice, no answer a client got is lost.
func TestFaultPostgresFailover(t *testing.T) {
	skipShort(t)
	pair := pgcluster.StartPair(t, true)
	plan := pairPlan()
	plan.proxyArgs = []string{"--require-synchronous-replication"}
	var run *faultRun
	runFault(t, "postgres-failover-sync", pair.DSN(), plan, func(r *faultRun) { run = r; r.failover(pair) })
	if run == nil || !run.failedOver.Load() {
		t.Fatal("the failover did not happen")
	}
	if out, err := pair.Standby.Psql("SELECT pg_is_in_recovery()"); err != nil || out != "f" {
		t.Fatalf("the standby is not the primary after the run: %q %v", out, err)
	}
}

// The synchronous standby stalls (it stops, and confirms nothing) for
// longer than the proxies' store timeout while completions wait for it;
// then the primary dies and the standby is promoted with what it had. A
// completion whose wait pgx cancelled is on the primary alone: no proxy
// may count it stored, nor replay it, before the standby confirmed it, or
// a client's 2xx is lost with the primary. The lease is long enough for a
// completion's retries to outlast the stall and the failover, so that the
// answers are recorded on the new primary.
func TestFaultPostgresStandbyStall(t *testing.T) {
	skipShort(t)
	pair := pgcluster.StartPair(t, true)
	plan := pairPlan()
	plan.proxyArgs = []string{"--lease", "30s"}
	var run *faultRun
	runFault(t, "postgres-standby-stall", pair.DSN(), plan, func(r *faultRun) { run = r; r.stallThenFailover(pair) })
	if run == nil || !run.failedOver.Load() {
		t.Fatal("the failover did not happen")
	}
}

// With an asynchronous standby attached, a proxy warns at start that
// acknowledged answers can be lost in a failover (and how to fix it), and
// a proxy with --require-synchronous-replication refuses protected
// requests with 503 store-not-durable, calling nothing upstream.
func TestFaultPostgresAsyncStandby(t *testing.T) {
	skipShort(t)
	pair := pgcluster.StartPair(t, false)
	dsn := pair.DSN()
	if _, errOut, err := runIdem(t, "migrate", "--store", dsn); err != nil {
		t.Fatalf("idem migrate: %v\n%s", err, errOut)
	}
	up := &countingUpstream{execs: map[string][]int64{}, large: func(string) bool { return false }}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	c := &http.Client{Timeout: 30 * time.Second}
	r := &faultRun{t: t, client: c}

	lax := startProxy(t, faultProxyArgs(dsn, upSrv.URL)...)
	if a, err := r.send(context.Background(), lax.base, "lax"); err != nil || a.status != http.StatusCreated {
		t.Fatalf("through the proxy without the strict flag: %+v %v", a, err)
	}
	var warning string
	for deadline := time.Now().Add(10 * time.Second); warning == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(lax.log)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"level":"WARN"`) && strings.Contains(line, "can be lost") {
				warning = line
			}
		}
	}
	if warning == "" || !strings.Contains(warning, "commits do not wait") || !strings.Contains(warning, "synchronous_standby_names") {
		b, _ := os.ReadFile(lax.log)
		t.Fatalf("no warning at start naming the asynchronous standby and the fix:\n%s", b)
	}
	t.Logf("the warning: %s", warning)

	strict := startProxy(t, append(faultProxyArgs(dsn, upSrv.URL), "--require-synchronous-replication",
		"--durability-check-interval", "200ms")...)
	a, err := r.send(context.Background(), strict.base, "strict")
	if err != nil || a.status != http.StatusServiceUnavailable || problemType(a.body) != idem.ProblemBase+idem.SlugStoreNotDurable {
		t.Fatalf("through the strict proxy: %+v %v, want 503 store-not-durable", a, err)
	}
	if ex := up.executions("strict"); len(ex) != 0 {
		t.Fatalf("the strict proxy let the request reach the upstream: %v", ex)
	}

	// The operator makes commits wait for the standby: the strict proxy
	// sees it at its next check and serves, without a restart, and logs
	// the change.
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
		if out, err := pair.Primary.Psql(q); err != nil {
			t.Fatalf("%s: %v %s", q, err, out)
		}
	}
	changed := time.Now()
	deadline := changed.Add(20 * time.Second)
	for {
		a, err = r.send(context.Background(), strict.base, "strict")
		if err == nil && a.status == http.StatusCreated {
			t.Logf("the strict proxy serves %v after the change", time.Since(changed).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the strict proxy still refuses 20s after commits wait for the standby: %+v %v", a, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if b, _ := os.ReadFile(strict.log); !strings.Contains(string(b), "store durability checked") ||
		!strings.Contains(string(b), "synchronous=true") {
		t.Errorf("the strict proxy did not log the new finding:\n%s", b)
	}
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault test runs several proxy processes; skipped with -short")
	}
}

// countingUpstream is the API behind the proxies. It lives in the test
// process, which no fault touches, so its count of executions per key is
// exact. Every execution answers 201 with a body naming the key and the
// execution; large keys answer ~900 KB.
type countingUpstream struct {
	mu    sync.Mutex
	execs map[string][]int64
	next  int64
	large func(key string) bool

	// The next holdLeft executions wait for gate to close; held counts
	// those waiting.
	holdLeft int
	gate     chan struct{}
	held     *atomic.Int64
}

// holdNext makes the next n executions wait until gate is closed; the
// returned counter tells how many are waiting.
func (u *countingUpstream) holdNext(n int, gate chan struct{}) *atomic.Int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.holdLeft, u.gate, u.held = n, gate, new(atomic.Int64)
	return u.held
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in struct{ Key string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Key == "" {
		http.Error(w, "want a JSON body with a key", http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.next++
	id := u.next
	u.execs[in.Key] = append(u.execs[in.Key], id)
	var gate chan struct{}
	if u.holdLeft > 0 {
		u.holdLeft--
		gate = u.gate
		u.held.Add(1)
	}
	u.mu.Unlock()
	if gate != nil {
		<-gate
	}

	// Some work, so that faults land while requests are under way.
	time.Sleep(time.Duration(5+rand.IntN(55)) * time.Millisecond)
	body := fmt.Sprintf(`{"key":%q,"exec":%d`, in.Key, id)
	if u.large(in.Key) {
		body += `,"pad":"` + strings.Repeat(strconv.FormatInt(id%10, 10), 900<<10) + `"`
	}
	body += "}"
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, body)
}

func (u *countingUpstream) executions(key string) []int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]int64(nil), u.execs[key]...)
}

// proxyFleet is the set of proxies, one slot each. A killed proxy's slot
// keeps its address until the restart, so clients also meet dead proxies.
type proxyFleet struct {
	bin, logDir string
	args        []string
	mu          sync.Mutex
	procs       []*proxyProc
}

func (f *proxyFleet) start(slot int) error {
	p, err := spawnProxy(f.bin, f.logDir, f.args...)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.procs[slot] = p
	f.mu.Unlock()
	return nil
}

// pick returns a random proxy: its slot and base URL.
func (f *proxyFleet) pick() (int, string) { return f.at(rand.IntN(len(f.procs))) }

// at returns the proxy of slot i modulo the number of slots.
func (f *proxyFleet) at(i int) (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i %= len(f.procs)
	return i, f.procs[i].base
}

func (f *proxyFleet) proc(slot int) *proxyProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs[slot]
}

// answer is one HTTP answer a client received.
type answer struct {
	status   int
	body     string
	replayed bool
	problem  string // the problem type of a 409
	// sent is when the request left the client, got when its answer was
	// read: a 409 outcome-unknown for a request sent before another client
	// got its 2xx was true when it was given.
	sent, got time.Time
}

// faultStats counts what the clients saw.
type faultStats struct {
	attempts, retries, transportErrs, inProgress, unavailable, other5xx atomic.Int64
}

// faultRun is one run of the fault test.
type faultRun struct {
	t        *testing.T
	plan     faultPlan
	fleet    *proxyFleet
	up       *countingUpstream
	client   *http.Client
	stats    faultStats
	started  atomic.Int64 // keys whose clients have started
	finished atomic.Int64 // keys whose clients have all ended
	large    chan int     // slot of a proxy that just delivered a fresh large answer
	finals   [][][]answer // per key, per client: the final answers (at most one)
	timeouts atomic.Int64 // clients that reached their deadline without a final answer
	// failedOver is set once a failover promoted the standby.
	failedOver atomic.Bool
}

// runFault runs the load and the faults: plan.kills SIGKILLs of proxies
// and plan.pgRestarts calls of dbFault (a crash and restart of PostgreSQL,
// or a failover), spread over the run.
func runFault(t *testing.T, name, dsn string, plan faultPlan, dbFault func(r *faultRun)) {
	bin := idemBinary(t)
	up := &countingUpstream{execs: map[string][]int64{}, large: func(key string) bool {
		n, _ := strconv.Atoi(strings.TrimPrefix(key, "k"))
		return n%plan.largeEvery == 0
	}}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)

	// The schema first, so that the proxies do not all migrate at once.
	if _, errOut, err := runIdem(t, "migrate", "--store", dsn); err != nil {
		t.Fatalf("idem migrate: %v\n%s", err, errOut)
	}
	fleet := &proxyFleet{bin: bin, logDir: t.TempDir(), args: append(faultProxyArgs(dsn, upSrv.URL), plan.proxyArgs...),
		procs: make([]*proxyProc, plan.proxies)}
	t.Cleanup(func() {
		for _, p := range fleet.procs {
			if p != nil {
				p.cmd.Process.Kill()
				<-p.done
				p.done <- nil
			}
		}
		if t.Failed() {
			logTails(t, fleet.logDir)
		}
	})
	for i := range plan.proxies {
		if err := fleet.start(i); err != nil {
			t.Fatal(err)
		}
	}

	tr := &http.Transport{MaxIdleConnsPerHost: 64, ResponseHeaderTimeout: time.Minute}
	t.Cleanup(tr.CloseIdleConnections)
	r := &faultRun{
		t: t, plan: plan, fleet: fleet, up: up,
		client: &http.Client{Transport: tr, Timeout: 2 * time.Minute},
		large:  make(chan int, 1),
		finals: make([][][]answer, plan.keys),
	}
	for k := range r.finals {
		r.finals[k] = make([][]answer, plan.dups)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var clients sync.WaitGroup
	t.Cleanup(func() { cancel(); clients.Wait() })
	clients.Add(1)
	go func() {
		defer clients.Done()
		r.load(ctx)
	}()
	kills, restarts := r.chaos(dbFault)
	clients.Wait()

	// Settle: every key is asked once more, through the restarted fleet,
	// until it answers something other than in-progress.
	settled := r.settle(ctx)
	r.report(name, kills, restarts, settled)
}

// load runs the clients: plan.inFlight keys at once, plan.dups concurrent
// clients per key.
func (r *faultRun) load(ctx context.Context) {
	sem := make(chan struct{}, r.plan.inFlight)
	var wg sync.WaitGroup
	for k := range r.plan.keys {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		r.started.Add(1)
		wg.Add(1)
		go func() {
			defer func() { <-sem; r.finished.Add(1); wg.Done() }()
			var dups sync.WaitGroup
			for d := range r.plan.dups {
				dups.Add(1)
				go func() {
					defer dups.Done()
					r.finals[k][d] = r.clientLoop(ctx, k, d)
				}()
			}
			dups.Wait()
		}()
	}
	wg.Wait()
}

func faultKey(k int) string { return fmt.Sprintf("k%05d", k) }

// clientLoop is client d of key k: it sends the request through proxy k+d
// (the clients of a key start on different proxies) and, on a failure, a
// 5xx or 409 request-in-progress, retries through a random proxy until a
// final answer (2xx, 409 outcome-unknown, another 4xx) or its deadline.
func (r *faultRun) clientLoop(ctx context.Context, k, d int) []answer {
	deadline := time.Now().Add(r.plan.clientLimit)
	for first := true; ; first = false {
		if !first {
			r.stats.retries.Add(1)
			time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			r.timeouts.Add(1)
			return nil
		}
		slot, base := r.fleet.at(k + d)
		if !first {
			slot, base = r.fleet.pick()
		}
		a, err := r.send(ctx, base, faultKey(k))
		if err != nil {
			r.stats.transportErrs.Add(1)
			continue
		}
		switch {
		case a.status == http.StatusConflict && a.problem == idem.ProblemBase+"request-in-progress":
			r.stats.inProgress.Add(1)
			continue
		case a.status == http.StatusServiceUnavailable:
			r.stats.unavailable.Add(1)
			continue
		case a.status >= 500:
			r.stats.other5xx.Add(1)
			continue
		}
		if a.status/100 == 2 && !a.replayed && len(a.body) > 100<<10 {
			select { // a fresh large answer: the moment the chaos may aim at
			case r.large <- slot:
			default:
			}
		}
		return []answer{a}
	}
}

func (r *faultRun) send(ctx context.Context, base, key string) (answer, error) {
	r.stats.attempts.Add(1)
	sent := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/orders",
		strings.NewReader(`{"key":"`+key+`","amount":100}`))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set(faultTenantHeader, "fault")
	resp, err := r.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		sent: sent, got: time.Now()}
	if a.status == http.StatusConflict {
		a.problem = problemType(a.body)
	}
	return a, nil
}

// chaos runs the faults while the load runs, spread over its progress
// (keys started), never by the clock: a slow machine sees the same faults.
// Two kills in three aim at the moment right after a proxy delivered a
// fresh large answer, when its completion may not be stored yet; the
// others hit a random proxy.
func (r *faultRun) chaos(dbFault func(r *faultRun)) (kills, restarts int) {
	t := r.t
	events := r.plan.kills + r.plan.pgRestarts
	for e := range events {
		threshold := int64((e + 1) * r.plan.keys / (events + 1))
		for r.started.Load() < threshold && r.finished.Load() < int64(r.plan.keys) {
			time.Sleep(5 * time.Millisecond)
		}
		// The crashes of PostgreSQL are spread among the kills.
		isPG := r.plan.pgRestarts > 0 &&
			(2*(e+1)*r.plan.pgRestarts+events)/(2*events) > (2*e*r.plan.pgRestarts+events)/(2*events)
		if isPG {
			dbFault(r)
			restarts++
			continue
		}
		slot := rand.IntN(r.plan.proxies)
		if kills%3 != 2 {
			select {
			case <-r.large: // stale: drop it
			default:
			}
			select {
			case slot = <-r.large:
			case <-time.After(5 * time.Second):
			}
		}
		r.fleet.proc(slot).kill(t)
		kills++
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		if err := r.fleet.start(slot); err != nil {
			t.Fatalf("restarting proxy %d: %v", slot, err)
		}
	}
	return kills, restarts
}

// crashPG crashes PostgreSQL and starts it again after a moment, the
// crash landing between executions and the storing of their answers (see
// whileHeld).
func (r *faultRun) crashPG(pg *pgcluster.Cluster) {
	t := r.t
	r.whileHeld(func() {
		if err := pg.Crash(); err != nil {
			t.Fatalf("crashing PostgreSQL: %v", err)
		}
	})
	time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
	if err := pg.Start(); err != nil {
		t.Fatalf("restarting PostgreSQL: %v", err)
	}
}

// failover kills the primary (as a crash would: every backend at once, no
// checkpoint), lands between executions and the storing of their answers
// (see whileHeld), and promotes the standby after a moment. The proxies
// are not told: their multi-host URL finds the new primary.
func (r *faultRun) failover(pair *pgcluster.Pair) {
	t := r.t
	var killed time.Time
	r.whileHeld(func() {
		if err := pair.Primary.Crash(); err != nil {
			t.Fatalf("killing the primary: %v", err)
		}
		killed = time.Now()
	})
	time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
	r.promote(pair, killed)
}

// stallThenFailover stops the synchronous standby (it confirms nothing
// more) while executions are held, so that their completions wait for it
// past the proxies' store timeout: pgx then cancels their waits, and
// PostgreSQL keeps those commits on the primary alone, visible. Then the
// primary dies, and the standby, started again, is promoted with what it
// had: the commits it never confirmed are gone.
func (r *faultRun) stallThenFailover(pair *pgcluster.Pair) {
	t := r.t
	r.whileHeld(func() {
		if err := pair.Standby.Stop(); err != nil {
			t.Fatalf("stopping the standby: %v", err)
		}
	})
	time.Sleep(faultStall)
	if err := pair.Primary.Crash(); err != nil {
		t.Fatalf("killing the primary: %v", err)
	}
	killed := time.Now()
	if err := pair.Standby.Start(); err != nil {
		t.Fatalf("starting the standby again: %v\n%s", err, pair.Standby.Log())
	}
	r.promote(pair, killed)
}

// faultStall is how long the standby confirms nothing before the primary
// dies: past the proxies' store timeout (5 s).
const faultStall = 8 * time.Second

// promote promotes the standby once the primary was killed, and waits
// until every proxy serves a new key again, by itself: neither its pool
// nor its circuit breaker is stuck on the dead primary. The proxies are not
// told: their multi-host URL finds the new primary.
func (r *faultRun) promote(pair *pgcluster.Pair, killed time.Time) {
	t := r.t
	if err := pair.Standby.Pgctl("promote", "-w", "-t", "60"); err != nil {
		t.Fatalf("promoting the standby: %v", err)
	}
	promoted := time.Since(killed)
	r.failedOver.Store(true)
	for slot := range r.plan.proxies {
		_, base := r.fleet.at(slot)
		for n := 0; ; n++ {
			a, err := r.send(context.Background(), base, fmt.Sprintf("failover-probe-%d-%d", slot, n))
			if err == nil && a.status == http.StatusCreated {
				break
			}
			if time.Since(killed) > time.Minute {
				t.Fatalf("proxy %d does not serve a new key a minute after the failover: %+v %v", slot, a, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("failover: promoted %v after the kill; every proxy served a new key %v after it",
		promoted.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// faultHeld is how many executions a database fault waits for.
const faultHeld = 4

// whileHeld runs fault while the next faultHeld executions the upstream
// starts are held (up to 5s), then lets them go: their proxies then store
// their outcomes while the database is down.
func (r *faultRun) whileHeld(fault func()) {
	gate := make(chan struct{})
	held := r.up.holdNext(faultHeld, gate)
	defer close(gate) // also when fault ends the test
	deadline := time.Now().Add(5 * time.Second)
	for held.Load() < faultHeld && time.Now().Before(deadline) && r.finished.Load() < int64(r.plan.keys) {
		time.Sleep(5 * time.Millisecond)
	}
	fault()
}

// settle asks every key once more, once all proxies run, and returns the
// answer each key settled on (status 0: none before the deadline).
func (r *faultRun) settle(ctx context.Context) []answer {
	out := make([]answer, r.plan.keys)
	deadline := time.Now().Add(r.plan.settleLimit)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range r.plan.inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := int(next.Add(1) - 1); k < r.plan.keys; k = int(next.Add(1) - 1) {
				for time.Now().Before(deadline) && ctx.Err() == nil {
					_, base := r.fleet.pick()
					a, err := r.send(ctx, base, faultKey(k))
					if err == nil && a.status < 500 &&
						(a.status != http.StatusConflict || a.problem != idem.ProblemBase+"request-in-progress") {
						out[k] = a
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// faultCounts is what a run found. The first group must be all zero.
type faultCounts struct {
	duplicates int // keys the upstream executed more than once
	lost       int // keys a client got a 2xx for whose settled answer is not that 2xx, byte for byte
	lostLarge  int // the lost keys whose answer was large
	changed    int // keys another client got a different final answer for: another 2xx, or a 409 outcome-unknown to a request sent once one client had its 2xx
	wrong      int // 2xx answers naming another key or an execution the upstream never ran
	unexpected int // final answers other than 2xx and 409
	unsettled  int // keys without a settled answer

	completed, unknown int // keys whose settled answer is a 2xx, 409 outcome-unknown
	got2xx             int // keys a client got a 2xx for
	clientUnknown      int // clients whose final answer was 409 outcome-unknown
	executions         int

	examples []string // the first broken promises, for the log
}

func (c *faultCounts) broken() int {
	return c.duplicates + c.lost + c.changed + c.wrong + c.unexpected + c.unsettled
}

func (c *faultCounts) example(format string, a ...any) {
	if len(c.examples) < 20 {
		c.examples = append(c.examples, fmt.Sprintf(format, a...))
	}
}

// countFault checks every key: execs and large describe the upstream's
// side, finals[k] holds the final answers of key k's clients (none for a
// client that gave up), settled[k] the answer after the run (status 0:
// none).
func countFault(keys int, execs func(string) []int64, large func(string) bool,
	finals [][][]answer, settled []answer) faultCounts {
	var c faultCounts
	isUnknown := func(a answer) bool {
		return a.status == http.StatusConflict && a.problem == idem.ProblemBase+"outcome-unknown"
	}
	for k := range keys {
		key := faultKey(k)
		ex := execs(key)
		c.executions += len(ex)
		if len(ex) > 1 {
			c.duplicates++
			c.example("%s: executed %d times %v", key, len(ex), ex)
		}
		var clients []answer
		for _, f := range finals[k] {
			clients = append(clients, f...)
		}
		s := settled[k]
		switch {
		case s.status/100 == 2:
			c.completed++
		case isUnknown(s):
			c.unknown++
		case s.status == 0:
			c.unsettled++
			c.example("%s: no settled answer before the deadline", key)
		}

		var first *answer // the first 2xx a client got
		for i, a := range append(clients, s) {
			switch {
			case a.status == 0:
			case a.status/100 == 2:
				var body struct {
					Key  string
					Exec int64
				}
				json.Unmarshal([]byte(a.body), &body)
				if body.Key != key || !containsID(ex, body.Exec) {
					c.wrong++
					c.example("%s: a 2xx names key %q execution %d; executions %v", key, body.Key, body.Exec, ex)
				}
				if first == nil && i < len(clients) {
					first = &clients[i]
				}
			case a.status == http.StatusConflict:
				if isUnknown(a) && i < len(clients) {
					c.clientUnknown++
				}
			default:
				c.unexpected++
				c.example("%s: answered %d %.200s", key, a.status, a.body)
			}
		}
		if first == nil {
			continue
		}
		c.got2xx++
		if s.status != first.status || s.body != first.body {
			c.lost++
			if large(key) {
				c.lostLarge++
			}
			c.example("%s: a client got %d (%d bytes), the settled answer is %d %.200s",
				key, first.status, len(first.body), s.status, s.body)
		}
		known := first.got // when a client first had the 2xx
		for _, a := range clients {
			if a.status == first.status && a.body == first.body && a.got.Before(known) {
				known = a.got
			}
		}
		for _, a := range clients {
			if a.status == first.status && a.body == first.body {
				continue
			}
			if isUnknown(a) && a.sent.Before(known) {
				// Asked while the outcome was still unknown (the record
				// was swept while its execution was cut off from the
				// store, then settled by that execution): a true answer
				// then, which a later retry replaces.
				continue
			}
			c.changed++
			c.example("%s: a client got %d (%d bytes), another client %d %.200s",
				key, first.status, len(first.body), a.status, a.body)
			break
		}
	}
	return c
}

// report counts, prints, and fails the test on a broken promise.
func (r *faultRun) report(name string, kills, restarts int, settled []answer) {
	t := r.t
	c := countFault(r.plan.keys, r.up.executions, r.up.large, r.finals, settled)
	st := &r.stats
	summary := fmt.Sprintf("fault %s: proxies=%d keys=%d dups=%d kills=%d pg-restarts=%d | "+
		"duplicates=%d lost=%d (large %d) changed=%d wrong=%d unexpected=%d unsettled=%d | "+
		"completed=%d unknown=%d keys-with-client-2xx=%d client-unknown=%d client-timeouts=%d "+
		"executions=%d attempts=%d retries=%d 503s=%d in-progress-409s=%d other-5xx=%d transport-errors=%d "+
		"released=%d",
		name, r.plan.proxies, r.plan.keys, r.plan.dups, kills, restarts,
		c.duplicates, c.lost, c.lostLarge, c.changed, c.wrong, c.unexpected, c.unsettled,
		c.completed, c.unknown, c.got2xx, c.clientUnknown, r.timeouts.Load(),
		c.executions, st.attempts.Load(), st.retries.Load(), st.unavailable.Load(), st.inProgress.Load(),
		st.other5xx.Load(), st.transportErrs.Load(), countLogged(r.fleet.logDir, releasedMsg))
	t.Log(summary)
	fmt.Println(summary)
	for _, e := range c.examples {
		t.Log("  " + e)
	}
	if c.broken() > 0 {
		t.Errorf("broken promises: %d keys executed more than once, %d answers lost, %d keys answered "+
			"differently after a 2xx, %d wrong answers, %d unexpected answers, %d keys never settled",
			c.duplicates, c.lost, c.changed, c.wrong, c.unexpected, c.unsettled)
	}
	if c.completed == 0 {
		t.Error("no key completed: the run tested nothing")
	}
	if kills != r.plan.kills || restarts != r.plan.pgRestarts {
		t.Errorf("ran %d kills and %d PostgreSQL restarts, planned %d and %d", kills, restarts, r.plan.kills, r.plan.pgRestarts)
	}
}

// TestFaultCounts checks the checker: each broken promise is counted.
func TestFaultCounts(t *testing.T) {
	t.Parallel()
	// Times: a 2xx arrives at t0+1s; an unknown is asked at t0 unless later.
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ok := func(key string, exec int64) answer {
		return answer{status: 201, body: fmt.Sprintf(`{"key":%q,"exec":%d}`, key, exec), sent: t0, got: t0.Add(time.Second)}
	}
	unknown := answer{status: 409, problem: idem.ProblemBase + "outcome-unknown", sent: t0, got: t0.Add(time.Millisecond)}
	later := func(a answer) answer {
		a.sent, a.got = t0.Add(2*time.Second), t0.Add(3*time.Second)
		return a
	}
	execs := map[string][]int64{}
	var finals [][][]answer
	var settled []answer
	add := func(ex []int64, clients []answer, s answer) {
		key := faultKey(len(finals))
		execs[key] = ex
		var f [][]answer
		for _, a := range clients {
			if a.status == 0 {
				f = append(f, nil) // a client that gave up
			} else {
				f = append(f, []answer{a})
			}
		}
		finals = append(finals, f)
		settled = append(settled, s)
	}
	add([]int64{1}, []answer{ok("k00000", 1), ok("k00000", 1), {}}, ok("k00000", 1)) // fine
	add([]int64{2, 3}, []answer{ok("k00001", 2)}, ok("k00001", 2))                   // executed twice
	add([]int64{4}, []answer{ok("k00002", 4), later(unknown)}, unknown)              // lost and changed
	add([]int64{5}, []answer{later(unknown), ok("k00003", 5)}, ok("k00003", 5))      // changed: asked once a client had the 2xx
	add([]int64{6}, []answer{ok("k00004", 7)}, ok("k00004", 7))                      // wrong execution
	add([]int64{8}, []answer{ok("k00000", 1)}, ok("k00000", 1))                      // wrong key
	add([]int64{9}, []answer{{status: 422, body: "reuse"}}, ok("k00006", 9))         // unexpected
	add([]int64{10}, []answer{{}}, answer{})                                         // unsettled
	add([]int64{11}, []answer{unknown, unknown}, unknown)                            // unknown: no error
	add(nil, []answer{unknown}, unknown)                                             // never executed: no error
	add([]int64{12}, []answer{ok("k00010", 12), unknown}, ok("k00010", 12))          // asked while unknown, settled later: no error

	c := countFault(len(finals), func(k string) []int64 { return execs[k] },
		func(k string) bool { return k == "k00002" }, finals, settled)
	got := fmt.Sprintf("duplicates=%d lost=%d/%d changed=%d wrong=%d unexpected=%d unsettled=%d "+
		"completed=%d unknown=%d got2xx=%d clientUnknown=%d executions=%d",
		c.duplicates, c.lost, c.lostLarge, c.changed, c.wrong, c.unexpected, c.unsettled,
		c.completed, c.unknown, c.got2xx, c.clientUnknown, c.executions)
	want := "duplicates=1 lost=1/1 changed=2 wrong=4 unexpected=1 unsettled=1 " +
		"completed=7 unknown=3 got2xx=7 clientUnknown=6 executions=11"
	if got != want {
		t.Errorf("counts\n got %s\nwant %s\n%s", got, want, strings.Join(c.examples, "\n"))
	}
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// releasedMsg begins the log message of a proxy that gave back a
// reservation whose answer was lost, released or resolved
// (docs/http-contract.md, Lost reservations).
const releasedMsg = `"msg":"idem: a reservation whose answer was lost was `

// countLogged counts the lines of every proxy log in dir that hold s.
func countLogged(dir, s string) int {
	names, _ := filepath.Glob(filepath.Join(dir, "proxy-*.log"))
	n := 0
	for _, name := range names {
		b, _ := os.ReadFile(name)
		n += strings.Count(string(b), s)
	}
	return n
}

// logTails logs the warnings and errors of every proxy log in dir.
func logTails(t *testing.T, dir string) {
	names, _ := filepath.Glob(filepath.Join(dir, "proxy-*.log"))
	sort.Strings(names)
	for _, name := range names {
		b, _ := os.ReadFile(name)
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"level":"ERROR"`) || strings.Contains(l, `"level":"WARN"`) {
				lines = append(lines, l)
			}
		}
		if len(lines) > 10 {
			lines = append([]string{fmt.Sprintf("... %d earlier lines", len(lines)-10)}, lines[len(lines)-10:]...)
		}
		t.Logf("%s: %d bytes, warnings and errors:\n%s", filepath.Base(name), len(b), strings.Join(lines, "\n"))
	}
}
