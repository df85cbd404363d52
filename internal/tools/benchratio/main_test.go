package main

import (
	"strings"
	"testing"
)

func TestRatios(t *testing.T) {
	in := `cpu: Test CPU
BenchmarkMiddleware/memory/bare-2     100  1000 ns/op  10 B/op  19 allocs/op
BenchmarkMiddleware/memory/first-2    100  1800 ns/op  40 B/op  34 allocs/op
BenchmarkMiddleware/memory/bare-2     100  1200 ns/op  10 B/op  19 allocs/op
BenchmarkMiddleware/memory/first-2    100  2000 ns/op  40 B/op  34 allocs/op
BenchmarkMiddleware/memory/bare-2     100  1100 ns/op  10 B/op  19 allocs/op
BenchmarkMiddleware/memory/first-2    100  9000 ns/op  40 B/op  34 allocs/op
BenchmarkPG/new-2                     100  500 ns/op
BenchmarkPG/ceiling-2                 100  400 ns/op
`
	var out strings.Builder
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"cpu: Test CPU", "BenchmarkMiddleware/memory/first", "1.82x bare", "+15 allocs", "1.25x ceiling"} {
		if !strings.Contains(got, want) {
			t.Fatalf("output lacks %q:\n%s", want, got)
		}
	}
	if err := run(strings.NewReader("BenchmarkX-2 1 5 ns/op\n"), &out); err == nil {
		t.Fatal("input without a baseline accepted")
	}
}
