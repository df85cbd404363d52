// Command proxybench measures `idem proxy` as a user runs it, against a plain
// reverse proxy and against what PostgreSQL itself can do, on this machine
// and in one run:
//
//	go run ./cmd/idem/internal/tools/proxybench [-rounds 5] [-slice 3s] [-clients 16]
//
// It builds the idem binary, starts a counting upstream, a plain
// httputil.ReverseProxy and one `idem proxy` process per store (memory,
// SQLite, PostgreSQL), and, when pgbench is installed, runs the PostgreSQL
// ceilings on a copy of the store's table in a scratch schema: one INSERT
// and one UPDATE of that row per operation for new keys, one SELECT of a row
// for replays, autocommit, prepared statements, the same number of clients.
//
// The variants take turns in slices (-slice each, -rounds times), so that
// load from anything else on the machine falls on all of them alike and the
// ratios stay meaningful. Every HTTP client is closed-loop: it sends its
// next request when the previous answer is read. New-key slices use a key
// never seen before on every request; replay slices repeat one completed
// key per client.
//
// On Linux it reports where each request's CPU time went (the proxy, the
// whole PostgreSQL cluster, the upstream, the load generator, idle time;
// read from /proc around every slice), and each proxy's peak resident set.
//
// For PostgreSQL variants it also reports, per new request, the WAL the
// server wrote (pg_current_wal_lsn; the whole cluster, so anything else
// writing at the time counts too: the median slice is printed) and, from
// the statistics of the variant's own table, heap tuples inserted and
// updated, how many updates were HOT, and index bytes grown.
//
// -baseline name=PATH adds the variants memory-name, sqlite-name and
// postgres-name run by another idem binary (e.g. one built from an earlier
// commit), for a before/after comparison in the same run. The variant
// postgres-cache is this binary with --store-replay-cache 64MiB.
//
// -peer NAME=CMD adds another idempotency proxy, run as the shell command
// CMD with {listen} (the address it must listen on), {upstream} (the
// upstream's URL) and {pg} (a PostgreSQL URL whose search_path is a fresh
// schema of its own) replaced; BENCHMARKS.md says how to build one.
//
// Besides pgbench, the report prints the additive limit: 1 / (1/plain +
// 1/pgbench), what a request would cost if the proxy's HTTP work and the
// database's statements simply added up, and each PostgreSQL variant's
// (and peer's) ratio to it.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/cmd/idem/internal/tools/benchdb"
	"github.com/idem-go/idem/cmd/idem/internal/tools/benchloop"
	"github.com/idem-go/idem/cmd/idem/internal/tools/benchnet"
	"github.com/idem-go/idem/store/postgres"
)

type options struct {
	rounds      int
	slice       time.Duration
	clients     int
	pgURL       string
	idemBin     string
	baseline    string
	tenantFlags string
	storeConns  int
	only        string
	pgModes     string
	peers       []peer
}

// peer is another proxy to measure (-peer NAME=CMD).
type peer struct{ name, cmd string }

func main() {
	var o options
	serve := flag.String("serve", "", "internal: run the `upstream` or `plain` server of a variant")
	listen := flag.String("listen", "", "internal: address of -serve")
	upstream := flag.String("upstream", "", "internal: upstream URL of -serve plain")
	flag.IntVar(&o.rounds, "rounds", 5, "slices per variant and phase")
	flag.DurationVar(&o.slice, "slice", 3*time.Second, "length of one slice")
	flag.IntVar(&o.clients, "clients", 16, "closed-loop clients (and pgbench clients)")
	flag.StringVar(&o.pgURL, "postgres", envOr("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"PostgreSQL `URL`; empty skips the PostgreSQL variants")
	flag.StringVar(&o.idemBin, "idem", "", "idem binary `path`; default: build ./cmd/idem")
	flag.StringVar(&o.baseline, "baseline", "", "other idem binaries run as more memory, SQLite and PostgreSQL variants: `name=path`[,name=path...], e.g. before=/tmp/idem-before")
	flag.StringVar(&o.tenantFlags, "tenant-flags", "--tenant-from trusted-header:X-Tenant", "idem proxy flags that say where the tenant comes from (the load sends X-Tenant: bench)")
	flag.IntVar(&o.storeConns, "store-conns", 0, "idem proxy --store-conns for the PostgreSQL variants (0: its default)")
	flag.StringVar(&o.only, "only", "", "comma-separated variant names to run (default all)")
	flag.Func("peer", "another proxy to measure, `NAME=CMD`: a shell command with {listen}, {upstream} and {pg} (repeatable)", func(v string) error {
		name, cmd, ok := strings.Cut(v, "=")
		if !ok || name == "" || strings.TrimSpace(cmd) == "" || !strings.Contains(cmd, "{listen}") {
			return errors.New("want NAME=CMD, CMD listening on {listen}")
		}
		o.peers = append(o.peers, peer{name, cmd})
		return nil
	})
	flag.StringVar(&o.pgModes, "postgres-modes", "", "pgx query `modes` (comma-separated, e.g. cache_describe) to run as more PostgreSQL variants of this binary, named postgres-MODE, with default_query_exec_mode in the store URL")
	flag.Parse()

	var err error
	switch *serve {
	case "":
		err = run(o)
	case "upstream":
		err = http.ListenAndServe(*listen, upstreamHandler())
	case "plain":
		err = servePlain(*listen, *upstream)
	default:
		err = fmt.Errorf("-serve %q: want upstream or plain", *serve)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// upstreamHandler is a fast API: it reads the request and answers a small
// JSON 201 with a sequence number.
func upstreamHandler() http.Handler {
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d","status":"accepted"}`, n.Add(1))
	})
}

// servePlain is the plain reverse proxy: httputil.ReverseProxy with a
// transport that keeps enough idle connections for the load.
func servePlain(listen, upstream string) error {
	u, err := url.Parse(upstream)
	if err != nil {
		return err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	return http.ListenAndServe(listen, rp)
}

// variant is one thing the load runs against.
type variant struct {
	name   string
	url    string // HTTP variants
	schema string // PostgreSQL variants: the schema of their table
	peer   bool   // -peer
	new    func(ctx context.Context, o options) (sliceResult, error)
	replay func(ctx context.Context, o options) (sliceResult, error)
}

type sliceResult struct {
	ops     int
	elapsed time.Duration
	lat     []time.Duration // HTTP variants
	avgLat  time.Duration   // pgbench
	walB    float64         // WAL bytes per op, PostgreSQL only
	cpu     cpuTimes        // CPU time spent during the slice, by whom
	peakRSS int64           // the proxy's largest resident set so far, bytes
}

func run(o options) error {
	ctx := context.Background()
	if o.rounds < 1 || o.slice < time.Second || o.clients < 1 {
		return errors.New("-rounds and -clients must be positive, -slice at least 1s")
	}
	others, err := parseBaselines(o.baseline)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "proxybench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var (
		procs   []*exec.Cmd
		pids    = map[string]int{} // by URL, the processes spawned
		schemas []string
		pg      *pgx.Conn
	)
	defer func() {
		// The proxies go first: their background services would log
		// errors about the tables dropped under them.
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
		for _, s := range schemas {
			benchdb.DropSchema(pg, s)
		}
		if pg != nil {
			pg.Close(context.Background())
		}
	}()

	if o.idemBin == "" {
		o.idemBin = filepath.Join(dir, "idem")
		fmt.Fprintln(os.Stderr, "building ./cmd/idem")
		if out, err := exec.Command("go", "build", "-o", o.idemBin, "./cmd/idem").CombinedOutput(); err != nil {
			return fmt.Errorf("build idem: %v\n%s", err, out)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	spawn := func(bin string, args ...string) (string, error) {
		addr, err := benchnet.FreeAddr()
		if err != nil {
			return "", err
		}
		cmd := exec.Command(bin, append(args, "--listen", addr)...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return "", err
		}
		procs = append(procs, cmd)
		if err := benchnet.WaitListening(addr); err != nil {
			return "", fmt.Errorf("%s %s: %w", filepath.Base(bin), strings.Join(args, " "), err)
		}
		pids["http://"+addr] = cmd.Process.Pid
		return "http://" + addr, nil
	}

	up, err := spawn(self, "-serve", "upstream")
	if err != nil {
		return err
	}
	plain, err := spawn(self, "-serve", "plain", "-upstream", up)
	if err != nil {
		return err
	}
	// spawnPeer starts a -peer's command and returns its URL.
	spawnPeer := func(p peer, upstream, pgURL string) (string, error) {
		addr, err := benchnet.FreeAddr()
		if err != nil {
			return "", err
		}
		// Quoted for the shell: a URL's & or ? would otherwise end or
		// glob the command.
		line := strings.NewReplacer("{listen}", shellQuote(addr), "{upstream}", shellQuote(upstream),
			"{pg}", shellQuote(pgURL)).Replace(p.cmd)
		cmd := exec.Command("sh", "-c", "exec "+line)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return "", err
		}
		procs = append(procs, cmd)
		if err := benchnet.WaitListening(addr); err != nil {
			return "", fmt.Errorf("peer %s (%s): %w", p.name, line, err)
		}
		pids["http://"+addr] = cmd.Process.Pid // sh execs the command: the same process
		return "http://" + addr, nil
	}
	idemProxy := func(bin, store string, extra ...string) (string, error) {
		args := []string{"proxy", "--upstream", up, "--store", store, "--log-level", "warn"}
		args = append(args, extra...)
		args = append(args, strings.Fields(o.tenantFlags)...)
		if o.storeConns > 0 && strings.HasPrefix(store, "postgres") {
			args = append(args, "--store-conns", strconv.Itoa(o.storeConns))
		}
		return spawn(bin, args...)
	}

	bins := append([]binary{{"", o.idemBin}}, others...)
	wanted := func(name string) bool {
		return o.only == "" || slices.Contains(strings.Split(o.only, ","), name)
	}

	variants := []*variant{{name: "plain", url: plain}}
	for _, b := range bins {
		for _, s := range []struct{ name, dsn string }{
			{"memory", "memory:"},
			{"sqlite", "sqlite:" + filepath.Join(dir, "idem"+b.suffix+".db")},
		} {
			if !wanted(s.name + b.suffix) {
				continue
			}
			u, err := idemProxy(b.path, s.dsn)
			if err != nil {
				return err
			}
			variants = append(variants, &variant{name: s.name + b.suffix, url: u})
		}
	}

	if o.pgURL != "" {
		if pg, err = pgx.Connect(ctx, o.pgURL); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
		// scratch makes a schema, dropped at the end, and returns the
		// URL of o.pgURL in it.
		scratch := func(schema string) (string, error) {
			if err := benchdb.CreateSchema(ctx, pg, schema); err != nil {
				return "", err
			}
			schemas = append(schemas, schema)
			return benchdb.WithSearchPath(o.pgURL, schema)
		}
		type pgVariant struct {
			name, bin, mode string
			flags           []string
		}
		var pgVariants []pgVariant
		for _, b := range bins {
			if wanted("postgres" + b.suffix) {
				pgVariants = append(pgVariants, pgVariant{"postgres" + b.suffix, b.path, "", nil})
			}
		}
		if wanted("postgres-cache") {
			pgVariants = append(pgVariants, pgVariant{"postgres-cache", o.idemBin, "", []string{"--store-replay-cache", "64MiB"}})
		}
		for mode := range strings.SplitSeq(o.pgModes, ",") {
			if name := "postgres-" + mode; mode != "" && wanted(name) {
				pgVariants = append(pgVariants, pgVariant{name, o.idemBin, mode, nil})
			}
		}
		for _, pv := range pgVariants {
			schema := fmt.Sprintf("proxybench_%d_%s", os.Getpid(), strings.ReplaceAll(pv.name, "-", "_"))
			dsn, err := scratch(schema)
			if err != nil {
				return err
			}
			if pv.mode != "" {
				if dsn, err = benchdb.WithParam(dsn, "default_query_exec_mode", pv.mode); err != nil {
					return err
				}
			}
			u, err := idemProxy(pv.bin, dsn, pv.flags...)
			if err != nil {
				return err
			}
			variants = append(variants, &variant{name: pv.name, url: u, schema: schema})
		}
		for _, p := range o.peers {
			if !wanted(p.name) {
				continue
			}
			schema := fmt.Sprintf("proxybench_%d_peer_%s", os.Getpid(), regexp.MustCompile(`\W`).ReplaceAllString(p.name, "_"))
			dsn, err := scratch(schema)
			if err != nil {
				return err
			}
			u, err := spawnPeer(p, up, dsn)
			if err != nil {
				return err
			}
			variants = append(variants, &variant{name: p.name, url: u, peer: true})
		}
		if _, err := exec.LookPath("pgbench"); err != nil {
			fmt.Fprintln(os.Stderr, "pgbench is not installed: no ceiling")
		} else {
			schema := fmt.Sprintf("proxybench_%d_ceiling", os.Getpid())
			if _, err := scratch(schema); err != nil {
				return err
			}
			v, err := ceilingVariant(ctx, o, pg, schema, dir)
			if err != nil {
				return err
			}
			variants = append(variants, v)
		}
	}
	variants = slices.DeleteFunc(variants, func(v *variant) bool { return !wanted(v.name) })
	postmaster := 0
	if pg != nil {
		if postmaster, err = postmasterPID(ctx, pg); err != nil {
			return err
		}
	}
	for _, v := range variants {
		if v.url != "" {
			if err := httpVariant(ctx, v, o); err != nil {
				return err
			}
		}
		wrapCPU(cpuMeter{proxy: pids[v.url], upstream: pids[up], postmaster: postmaster}, v)
		if v.schema != "" {
			wrapWAL(pg, v)
		}
	}

	statsBefore := map[string]tableStats{}
	for _, v := range variants {
		if v.schema != "" {
			if statsBefore[v.name], err = readTableStats(ctx, pg, v.schema); err != nil {
				return err
			}
		}
	}
	newRes := map[string][]sliceResult{}
	repRes := map[string][]sliceResult{}
	started := time.Now().UTC()
	for r := range o.rounds {
		for i := range variants {
			// Rotate the order each round so that no variant always
			// follows the same neighbour.
			v := variants[(i+r)%len(variants)]
			res, err := v.new(ctx, o)
			if err != nil {
				return fmt.Errorf("%s new: %w", v.name, err)
			}
			newRes[v.name] = append(newRes[v.name], res)
		}
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			if v.replay == nil {
				continue
			}
			res, err := v.replay(ctx, o)
			if err != nil {
				return fmt.Errorf("%s replay: %w", v.name, err)
			}
			repRes[v.name] = append(repRes[v.name], res)
		}
		fmt.Fprintf(os.Stderr, "round %d/%d done\n", r+1, o.rounds)
	}
	time.Sleep(1500 * time.Millisecond) // backends flush their table statistics at most once a second
	after := map[string]tableStats{}
	for _, v := range variants {
		if v.schema != "" {
			if after[v.name], err = readTableStats(ctx, pg, v.schema); err != nil {
				return err
			}
		}
	}
	report(os.Stdout, o, variants, newRes, repRes, statsBefore, after, started)
	return nil
}

// shellQuote quotes s as one word for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// binary is an idem binary and the suffix of its variants' names.
type binary struct{ suffix, path string }

// parseBaselines reads -baseline: name=path[,name=path...].
func parseBaselines(v string) ([]binary, error) {
	var bins []binary
	for nb := range strings.SplitSeq(v, ",") {
		if nb == "" {
			continue
		}
		name, bin, ok := strings.Cut(nb, "=")
		if !ok || name == "" || bin == "" || strings.ContainsAny(name, "-=") {
			return nil, fmt.Errorf("-baseline %q: want name=path, the name without '-'", nb)
		}
		if slices.ContainsFunc(bins, func(b binary) bool { return b.suffix == "-"+name }) {
			return nil, fmt.Errorf("-baseline: %s named twice", name)
		}
		bins = append(bins, binary{"-" + name, bin})
	}
	return bins, nil
}

// The request every client sends: a small JSON POST.
var requestBody = []byte(`{"amount":1299,"currency":"EUR","customer":"cus_8f2a61","description":"bench order"}`)

// httpVariant sets v.new and v.replay to closed-loop HTTP load on v.url,
// after completing the keys the replay slices repeat.
func httpVariant(ctx context.Context, v *variant, o options) error {
	c := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: o.clients * 2,
		IdleConnTimeout:     90 * time.Second,
	}}
	idem := v.name != "plain"
	var seq atomic.Int64
	prefix := fmt.Sprintf("%d-%s-", time.Now().UnixNano(), v.name)
	replayKey := func(client int) string { return fmt.Sprintf("%sreplay-%d", prefix, client) }
	if idem {
		for i := range o.clients {
			if _, err := send(ctx, c, v.url, replayKey(i), false); err != nil {
				return fmt.Errorf("%s: seed replay key: %w", v.name, err)
			}
		}
	}
	load := func(replay bool) func(context.Context, options) (sliceResult, error) {
		return func(ctx context.Context, o options) (sliceResult, error) {
			return closedLoop(o, func(client int) error {
				key := replayKey(client)
				if !replay {
					key = prefix + strconv.FormatInt(seq.Add(1), 10)
				}
				_, err := send(ctx, c, v.url, key, replay && idem)
				return err
			})
		}
	}
	v.new = load(false)
	if idem {
		v.replay = load(true)
	}
	return nil
}

// send posts the request under key and checks the answer: a 201, replayed
// when wantReplay.
func send(ctx context.Context, c *http.Client, u, key string, wantReplay bool) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u+"/payments", bytes.NewReader(requestBody))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer bench")
	req.Header.Set("X-Tenant", "bench")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, fmt.Errorf("status %d: %.200s", resp.StatusCode, body)
	}
	// idem says Idempotent-Replayed; a peer may spell it Idempotency-Replayed.
	replayed := resp.Header.Get("Idempotent-Replayed") == "true" || resp.Header.Get("Idempotency-Replayed") == "true"
	if replayed != wantReplay {
		return resp.StatusCode, fmt.Errorf("replayed=%v, want %v", replayed, wantReplay)
	}
	return resp.StatusCode, nil
}

// closedLoop runs o.clients loops of do for one slice.
func closedLoop(o options, do func(client int) error) (sliceResult, error) {
	lat, elapsed, err := benchloop.Run(o.clients, o.slice, do)
	if err != nil {
		return sliceResult{}, err
	}
	return sliceResult{ops: len(lat), elapsed: elapsed, lat: lat}, nil
}

// wrapWAL measures the WAL written during each slice of a PostgreSQL
// variant.
func wrapWAL(pg *pgx.Conn, v *variant) {
	wrap := func(f func(context.Context, options) (sliceResult, error)) func(context.Context, options) (sliceResult, error) {
		if f == nil {
			return nil
		}
		return func(ctx context.Context, o options) (sliceResult, error) {
			var before, after int64
			const q = `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`
			if err := pg.QueryRow(ctx, q).Scan(&before); err != nil {
				return sliceResult{}, err
			}
			res, err := f(ctx, o)
			if err != nil {
				return res, err
			}
			if err := pg.QueryRow(ctx, q).Scan(&after); err != nil {
				return sliceResult{}, err
			}
			if res.ops > 0 {
				res.walB = float64(after-before) / float64(res.ops)
			}
			return res, nil
		}
	}
	v.new, v.replay = wrap(v.new), wrap(v.replay)
}

// ceilingVariant runs pgbench on a table created by the store's own
// migrations, so the ceiling pays for the same columns and indexes.
func ceilingVariant(ctx context.Context, o options, pg *pgx.Conn, schema, dir string) (*variant, error) {
	s, err := postgres.Open(ctx, o.pgURL, postgres.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	s.Close()
	t := pgx.Identifier{schema, "idem_records"}.Sanitize()
	const (
		scope = `'0f3c1e9a7b5d2c48e6a1f0b9d8c7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9 POST /payments'`
		fp    = `'sha256:4b227777d4dd1fc61c6f884f48641d02b4d121d3fd328cb08b5531fcacdabf8a'`
		hdrs  = `'{"Content-Type":["application/json"]}'`
		body  = `'{"id":"pay_1","status":"accepted"}'::bytea`
	)
	insert := `INSERT INTO ` + t + ` (scope, key, fingerprint, state, fence, lease_policy, locked_until,
		attempts, created_at, updated_at, expires_at)
	VALUES (` + scope + `, :key, ` + fp + `, 'in_progress', 1, 'unknown', now() + interval '30 s',
		1, now(), now(), now() + interval '24 h') ON CONFLICT DO NOTHING;`
	newScript := `\set k random(1, 1000000000000000)
` + strings.ReplaceAll(insert, ":key", "'k' || :k") + `
UPDATE ` + t + ` SET state = 'completed', response_status = 201, response_headers = ` + hdrs + `,
	response_body = ` + body + `, response_body_omitted = false, last_error = '', completed_at = now(),
	updated_at = now(), expires_at = now() + interval '24 h'
WHERE scope = ` + scope + ` AND key = 'k' || :k AND state = 'in_progress' AND fence = 1;
`
	replayScript := `SELECT scope, key, fingerprint, state, fence, lease_policy, locked_until,
	recovery_point, response_status, response_headers, response_body, response_body_omitted,
	last_error, attempts, created_at, updated_at, completed_at, expires_at, reconcile_after,
	reconcile_attempts
FROM ` + t + ` WHERE scope = ` + scope + ` AND key = 'replay-' || :client_id;
`
	newPath := filepath.Join(dir, "new.sql")
	replayPath := filepath.Join(dir, "replay.sql")
	if err := os.WriteFile(newPath, []byte(newScript), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(replayPath, []byte(replayScript), 0o600); err != nil {
		return nil, err
	}
	for i := range o.clients {
		if _, err := pg.Exec(ctx, strings.ReplaceAll(insert, ":key", fmt.Sprintf("'replay-%d'", i))); err != nil {
			return nil, err
		}
		if _, err := pg.Exec(ctx, `UPDATE `+t+` SET state = 'completed', response_status = 201,
			response_headers = `+hdrs+`, response_body = `+body+`, completed_at = now() WHERE key = $1`,
			fmt.Sprintf("replay-%d", i)); err != nil {
			return nil, err
		}
	}
	pgbench := func(script string) func(context.Context, options) (sliceResult, error) {
		return func(ctx context.Context, o options) (sliceResult, error) {
			return runPgbench(ctx, o, script)
		}
	}
	return &variant{name: "pgbench", schema: schema, new: pgbench(newPath), replay: pgbench(replayPath)}, nil
}

var (
	tpsLine = regexp.MustCompile(`(?m)^tps = ([\d.]+) \(without initial connection time\)`)
	latLine = regexp.MustCompile(`(?m)^latency average = ([\d.]+) ms`)
	txLine  = regexp.MustCompile(`(?m)^number of transactions actually processed: (\d+)`)
)

func runPgbench(ctx context.Context, o options, script string) (sliceResult, error) {
	secs := max(1, int(o.slice.Round(time.Second)/time.Second))
	cmd := exec.CommandContext(ctx, "pgbench", "-n", "-M", "prepared", "-c", strconv.Itoa(o.clients),
		"-j", "2", "-T", strconv.Itoa(secs), "-f", script, o.pgURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return sliceResult{}, fmt.Errorf("pgbench: %v\n%s", err, out)
	}
	tps, lat, tx := tpsLine.FindSubmatch(out), latLine.FindSubmatch(out), txLine.FindSubmatch(out)
	if tps == nil || lat == nil || tx == nil {
		return sliceResult{}, fmt.Errorf("pgbench: unexpected output:\n%s", out)
	}
	rate, _ := strconv.ParseFloat(string(tps[1]), 64)
	ms, _ := strconv.ParseFloat(string(lat[1]), 64)
	n, _ := strconv.Atoi(string(tx[1]))
	return sliceResult{ops: n, elapsed: time.Duration(float64(n) / rate * float64(time.Second)),
		avgLat: time.Duration(ms * float64(time.Millisecond))}, nil
}
