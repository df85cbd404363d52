// Command benchratio reads `go test -bench` output on stdin and prints, for
// every group of sub-benchmarks that has a baseline (a sibling named "bare"
// or "ceiling"), each sibling's time and allocations relative to that
// baseline measured in the same run. With -count > 1 the median is used.
//
//	go test -run '^$' -bench BenchmarkMiddleware -benchmem -count 5 . | go run ./internal/tools/benchratio
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(?:.*?\s([\d.]+) allocs/op)?`)

type sample struct{ ns, allocs []float64 }

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchratio:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	samples := map[string]*sample{}
	var order []string
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		text := sc.Text()
		m := line.FindStringSubmatch(text)
		if m == nil {
			if strings.HasPrefix(text, "cpu:") || strings.HasPrefix(text, "goos:") {
				fmt.Fprintln(out, text)
			}
			continue
		}
		s := samples[m[1]]
		if s == nil {
			s = &sample{}
			samples[m[1]] = s
			order = append(order, m[1])
		}
		ns, _ := strconv.ParseFloat(m[2], 64)
		s.ns = append(s.ns, ns)
		if m[3] != "" {
			a, _ := strconv.ParseFloat(m[3], 64)
			s.allocs = append(s.allocs, a)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	printed := false
	for _, name := range order {
		group, leaf := splitName(name)
		if leaf == "bare" || leaf == "ceiling" {
			continue
		}
		base := samples[group+"/bare"]
		baseName := "bare"
		if base == nil {
			base, baseName = samples[group+"/ceiling"], "ceiling"
		}
		if base == nil {
			continue
		}
		s := samples[name]
		fmt.Fprintf(out, "%-48s %10.0f ns/op  %5.2fx %s", name, median(s.ns), median(s.ns)/median(base.ns), baseName)
		if len(s.allocs) > 0 && len(base.allocs) > 0 {
			fmt.Fprintf(out, "  %+4.0f allocs", median(s.allocs)-median(base.allocs))
		}
		fmt.Fprintln(out)
		printed = true
	}
	if !printed {
		return fmt.Errorf("no benchmark group with a bare or ceiling baseline in the input")
	}
	return nil
}

func splitName(name string) (group, leaf string) {
	i := strings.LastIndex(name, "/")
	if i < 0 {
		return name, ""
	}
	return name[:i], name[i+1:]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
