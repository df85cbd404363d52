package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// tableStats is what PostgreSQL counted on one variant's idem_records.
type tableStats struct {
	ins, upd, hot, idxBytes int64
}

func readTableStats(ctx context.Context, pg *pgx.Conn, schema string) (tableStats, error) {
	var s tableStats
	err := pg.QueryRow(ctx, `
		SELECT t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd,
			(SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0)::bigint
			 FROM pg_stat_user_indexes i WHERE i.relid = t.relid)
		FROM pg_stat_user_tables t
		WHERE t.schemaname = $1 AND t.relname = 'idem_records'`, schema).
		Scan(&s.ins, &s.upd, &s.hot, &s.idxBytes)
	if err != nil {
		return s, fmt.Errorf("table statistics of %s: %w", schema, err)
	}
	return s, nil
}

// summary folds a variant's slices of one phase.
type summary struct {
	rate     float64
	p50, p99 time.Duration
	avg      time.Duration // pgbench reports an average only
	wal      float64       // median slice
	ops      int
}

func summarize(rs []sliceResult) (summary, bool) {
	if len(rs) == 0 {
		return summary{}, false
	}
	var (
		s       summary
		elapsed time.Duration
		lat     []time.Duration
		wal     []float64
		avgSum  time.Duration
	)
	for _, r := range rs {
		s.ops += r.ops
		elapsed += r.elapsed
		lat = append(lat, r.lat...)
		wal = append(wal, r.walB)
		avgSum += r.avgLat
	}
	s.rate = float64(s.ops) / elapsed.Seconds()
	if len(lat) > 0 {
		slices.Sort(lat)
		s.p50 = lat[len(lat)*50/100]
		s.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	} else {
		s.avg = avgSum / time.Duration(len(rs))
	}
	slices.Sort(wal)
	s.wal = wal[len(wal)/2]
	return s, true
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func report(w io.Writer, o options, variants []*variant, newRes, repRes map[string][]sliceResult,
	before, after map[string]tableStats, started time.Time) {
	fmt.Fprintf(w, "proxybench: %d rounds of %s slices per variant and phase, %d clients, %d CPUs, started %s, load average at the end %s\n\n",
		o.rounds, o.slice, o.clients, runtime.NumCPU(), started.Format("2006-01-02 15:04 UTC"), loadavg())
	fmt.Fprintln(w, "| variant | new keys/s | p50 | p99 | replays/s | p50 | p99 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	sums := map[string][2]summary{}
	for _, v := range variants {
		n, _ := summarize(newRes[v.name])
		r, ok := summarize(repRes[v.name])
		sums[v.name] = [2]summary{n, r}
		lat := func(s summary) (string, string) {
			if s.avg != 0 {
				return "avg " + fmtDur(s.avg), "–"
			}
			return fmtDur(s.p50), fmtDur(s.p99)
		}
		n50, n99 := lat(n)
		rr, r50, r99 := "–", "–", "–"
		if ok {
			rr = fmt.Sprintf("%.0f", r.rate)
			r50, r99 = lat(r)
		}
		name := v.name
		if v.name != "plain" && v.name != "pgbench" {
			name = "idem proxy, " + v.name
		}
		if v.name == "pgbench" {
			name = "pgbench ceiling (INSERT + UPDATE / SELECT)"
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %s | %s | %s | %s |\n", name, n.rate, n50, n99, rr, r50, r99)
	}

	fmt.Fprintln(w)
	ratio := func(label, a, b string, phase int, target string) {
		x, okA := sums[a]
		y, okB := sums[b]
		if !okA || !okB || y[phase].rate == 0 {
			return
		}
		if target != "" {
			target = " (" + target + ")"
		}
		fmt.Fprintf(w, "- %s: **%.2fx**%s\n", label, x[phase].rate/y[phase].rate, target)
	}
	ratio("memory, new keys / plain proxy", "memory", "plain", 0, "goal >= 0.95x")
	ratio("postgres, new keys / pgbench INSERT + UPDATE", "postgres", "pgbench", 0, "goal >= 0.8x, moonshot >= 1.0x")
	ratio("postgres, replays / pgbench SELECT", "postgres", "pgbench", 1, "")
	for _, v := range variants {
		if base, suffix, ok := strings.Cut(v.name, "-"); ok {
			ratio(base+" / "+v.name+", new keys", base, v.name, 0, "this binary over another")
			ratio(base+" / "+v.name+", replays", base, v.name, 1, "this binary over another")
			if base == "memory" {
				ratio(v.name+", new keys / plain proxy", v.name, "plain", 0, "binary "+suffix)
			}
			if base == "postgres" {
				ratio(v.name+", new keys / pgbench INSERT + UPDATE", v.name, "pgbench", 0, "binary "+suffix)
				ratio(v.name+", replays / pgbench SELECT", v.name, "pgbench", 1, "binary "+suffix)
			}
		}
	}

	for _, v := range variants {
		if v.peer {
			ratio("postgres / "+v.name+", new keys", "postgres", v.name, 0, "goal >= 1.5x")
			ratio("postgres / "+v.name+", replays", "postgres", v.name, 1, "")
			ratio("postgres-cache / "+v.name+", replays", "postgres-cache", v.name, 1, "")
		}
	}
	ratio("postgres-cache, replays / memory", "postgres-cache", "memory", 1, "goal >= 0.8x")
	additive(w, variants, sums)
	cpuTable(w, variants, newRes, "new key")
	cpuTable(w, variants, repRes, "replay")

	if len(after) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Per new request (PostgreSQL; WAL is the whole cluster's, median slice; the rest from the variant's own table):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| variant | WAL bytes | heap tuples inserted | updated | of which HOT | index bytes grown |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, v := range variants {
		a, ok := after[v.name]
		if !ok {
			continue
		}
		b := before[v.name]
		n := float64(sums[v.name][0].ops)
		if n == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %.2f | %.2f | %.1f |\n", v.name, sums[v.name][0].wal,
			float64(a.ins-b.ins)/n, float64(a.upd-b.upd)/n, float64(a.hot-b.hot)/n, float64(a.idxBytes-b.idxBytes)/n)
	}
}

// additive prints the additive limit, 1 / (1/plain + 1/pgbench): what a
// request costs if the plain proxy's HTTP work and the database's
// statements simply added up (new keys: pgbench's INSERT + UPDATE;
// replays: its SELECT), and the ratio of every PostgreSQL variant and
// peer to it.
func additive(w io.Writer, variants []*variant, sums map[string][2]summary) {
	plain, okP := sums["plain"]
	pgb, okB := sums["pgbench"]
	if !okP || !okB || plain[0].rate == 0 || pgb[0].rate == 0 || pgb[1].rate == 0 {
		return
	}
	limit := [2]float64{1 / (1/plain[0].rate + 1/pgb[0].rate), 1 / (1/plain[0].rate + 1/pgb[1].rate)}
	fmt.Fprintf(w, "\nAdditive limit, 1 / (1/plain + 1/pgbench): %.0f new keys/s, %.0f replays/s\n\n", limit[0], limit[1])
	fmt.Fprintln(w, "| variant | new keys / limit | replays / limit |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, v := range variants {
		if v.name == "plain" || v.name == "pgbench" || strings.HasPrefix(v.name, "memory") || strings.HasPrefix(v.name, "sqlite") {
			continue
		}
		s := sums[v.name]
		fmt.Fprintf(w, "| %s | %.2fx | %.2fx |\n", v.name, s[0].rate/limit[0], s[1].rate/limit[1])
	}
}
