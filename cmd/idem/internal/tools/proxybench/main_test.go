package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseBaselines(t *testing.T) {
	got, err := parseBaselines("before=/tmp/a,off=/tmp/b")
	if err != nil {
		t.Fatal(err)
	}
	if want := []binary{{"-before", "/tmp/a"}, {"-off", "/tmp/b"}}; !slices.Equal(got, want) {
		t.Errorf("parsed %v, want %v", got, want)
	}
	if got, err := parseBaselines(""); err != nil || len(got) != 0 {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"before", "=/tmp/a", "before=", "a-b=/tmp/a", "x=/a,x=/b"} {
		if _, err := parseBaselines(bad); err == nil || !strings.Contains(err.Error(), "-baseline") {
			t.Errorf("%q: %v, want an error naming -baseline", bad, err)
		}
	}
}

func TestRunRefusesBadOptions(t *testing.T) {
	for _, o := range []options{
		{rounds: 0, slice: time.Second, clients: 1},
		{rounds: 1, slice: time.Millisecond, clients: 1},
		{rounds: 1, slice: time.Second, clients: 0},
		{rounds: 1, slice: time.Second, clients: 1, baseline: "nopath"},
	} {
		if err := run(o); err == nil {
			t.Errorf("run(%+v) = nil, want an error", o)
		}
	}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	s, ok := summarize([]sliceResult{
		{ops: 3, elapsed: time.Second, lat: []time.Duration{3 * ms, 1 * ms, 2 * ms}, walB: 100},
		{ops: 1, elapsed: time.Second, lat: []time.Duration{4 * ms}, walB: 300},
		{ops: 2, elapsed: time.Second, lat: []time.Duration{5 * ms, 6 * ms}, walB: 200},
	})
	if !ok || s.ops != 6 || s.rate != 2 || s.p50 != 4*ms || s.p99 != 6*ms || s.wal != 200 {
		t.Errorf("summary %+v", s)
	}
	if _, ok := summarize(nil); ok {
		t.Error("summary of nothing")
	}
	// pgbench slices carry an average latency only.
	s, _ = summarize([]sliceResult{{ops: 10, elapsed: time.Second, avgLat: 2 * ms}, {ops: 10, elapsed: time.Second, avgLat: 4 * ms}})
	if s.avg != 3*ms || s.p50 != 0 {
		t.Errorf("pgbench summary %+v", s)
	}
}

func TestShellQuote(t *testing.T) {
	out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(`a&b?c='d' $x`)).Output()
	if err != nil || string(out) != `a&b?c='d' $x` {
		t.Fatalf("%q, %v", out, err)
	}
}
