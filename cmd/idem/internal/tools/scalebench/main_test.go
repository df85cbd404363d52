package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// parse reads the report: lines of a name and name=value pairs, every
// value a number but stage and op.
func parse(t *testing.T, out string) map[string]map[string]float64 {
	t.Helper()
	got := map[string]map[string]float64{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 2 {
			t.Fatalf("report line %q: no values", line)
		}
		name, vals := f[0], map[string]float64{}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("report line %q: %q is not name=value", line, kv)
			}
			if k == "stage" || k == "op" {
				name += "/" + v
				continue
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("report line %q: %s: %v", line, k, err)
			}
			vals[k] = x
		}
		if w, ok := vals["workers"]; ok {
			name += "/" + strconv.Itoa(int(w))
		}
		got[name] = vals
	}
	return got
}

func TestSmoke(t *testing.T) {
	url := testenv.PostgresURL(t)
	var out bytes.Buffer
	o := options{url: url, n: 2000, chunk: 1000, days: 3, rounds: 1, slice: 100 * time.Millisecond, workers: 2, batch: 100}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	r := parse(t, out.String())
	for _, name := range []string{"fill/large", "size/large", "fill/empty", "latency/new/2", "latency/new/1",
		"latency/replay/2", "latency/replay/1", "latency/get/2", "latency/get/1", "reap",
		"size/reaped", "size/vacuumed", "fill/next_day", "size/next_day"} {
		if r[name] == nil {
			t.Errorf("report has no %s:\n%s", name, out.String())
		}
	}
	// The first day of three: records 0..666 expire within 8h.
	if d := r["reap"]["deleted"]; d < 600 || d > 700 {
		t.Errorf("reaper deleted %v records, want about 667", d)
	}
	if l := r["latency/replay/1"]; l["large_ops"] == 0 || l["empty_ops"] == 0 || l["p50_ratio"] <= 0 {
		t.Errorf("replay latencies %v", l)
	}
	if r["size/vacuumed"]["dead_tup"] != 0 || r["size/reaped"]["dead_tup"] == 0 {
		t.Errorf("dead tuples after the reaper %v, after VACUUM %v", r["size/reaped"], r["size/vacuumed"])
	}
}

func TestRunRefusesBadOptions(t *testing.T) {
	for _, o := range []options{
		{n: 10, chunk: 1, days: 0, rounds: 1, slice: time.Second, workers: 1, batch: 1},
		{n: 2, chunk: 1, days: 3, rounds: 1, slice: time.Second, workers: 1, batch: 1},
		{n: 10, chunk: 1, days: 3, rounds: 1, slice: 0, workers: 1, batch: 1},
		{n: 10, chunk: 1, days: 3, rounds: 1, slice: time.Second, workers: 0, batch: 1},
	} {
		if err := run(context.Background(), o, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%+v) = nil, want an error", o)
		}
	}
}
