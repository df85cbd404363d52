package compat

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/internal/testkit/testenv"
)

// A duplicate storm: many callers send one request under one key at once
// (a retry loop gone wild, a fan-out bug) while the upstream takes its
// time. Whatever --wait says, it runs once and every caller gets its
// answer; the test reports what the wait costs: requests the proxy
// answered, store operations, the proxy's peak memory, and how long the
// callers took. IDEM_COMPAT_STORM sets the number of duplicates (64 by
// default).
func TestDuplicateStorm(t *testing.T) {
	mock := stripeMock(t)
	n := 64
	if v := os.Getenv("IDEM_COMPAT_STORM"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 2 {
			t.Fatalf("IDEM_COMPAT_STORM=%q: want a number above 1", v)
		}
	}
	for _, wait := range []string{"0", "5s"} {
		t.Run("wait="+wait, func(t *testing.T) {
			admin := testenv.FreeAddr(t)
			s := newStack(t, mock, "sqlite:"+t.TempDir()+"/idem.db", time.Second, "--wait", wait, "--admin", admin)
			var attempts atomic.Int64
			tr := &client.Transport{MaxAttempts: 100, MaxDelay: time.Minute, BaseDelay: 100 * time.Millisecond, MaxBackoff: time.Second}
			c := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
			key := client.NewKey()
			ids := make([]string, n)
			errs := make([]error, n)
			begin := time.Now()
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.proxyURL+"/v1/customers",
						strings.NewReader(url.Values{"description": {"call-0"}}.Encode()))
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
					req.Header.Set("Authorization", "Bearer sk_test_storm")
					req.Header.Set("Idempotency-Key", key)
					resp, err := c.Do(req)
					if err != nil {
						errs[i] = err
						return
					}
					defer resp.Body.Close()
					attempts.Add(int64(client.Attempts(resp)))
					b, _ := io.ReadAll(resp.Body)
					if resp.StatusCode != http.StatusOK {
						errs[i] = fmt.Errorf("%d %s", resp.StatusCode, b)
						return
					}
					ids[i] = jsonID(b)
				})
			}
			wg.Wait()
			took := time.Since(begin)
			execs := s.ledger.executions()
			if len(execs) != 1 {
				t.Fatalf("%d executions of one request, want 1", len(execs))
			}
			for i := range n {
				if errs[i] != nil || ids[i] != execs[0].id {
					t.Fatalf("caller %d: %q, %v; the execution created %q", i, ids[i], errs[i], execs[0].id)
				}
			}
			ops := storeOps(t, admin)
			t.Logf("--wait %s: %d duplicates of a 1s request: 1 execution, %d requests answered, store operations %s, proxy peak RSS %s, all answered in %v",
				wait, n, attempts.Load(), ops, peakRSS(s.proxy.Process.Pid), took.Round(10*time.Millisecond))
		})
	}
}

// jsonID returns the "id" member of a JSON object.
func jsonID(b []byte) string {
	var doc struct {
		ID string `json:"id"`
	}
	json.Unmarshal(b, &doc)
	return doc.ID
}

// storeOps sums the proxy's store operations by name from its metrics.
func storeOps(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	counts := map[string]string{}
	var order []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "idem_store_duration_seconds_count{") {
			continue
		}
		_, rest, _ := strings.Cut(line, `op="`)
		op, _, _ := strings.Cut(rest, `"`)
		fields := strings.Fields(line)
		if _, seen := counts[op]; !seen {
			order = append(order, op)
		}
		counts[op] = fields[len(fields)-1]
	}
	var parts []string
	for _, op := range order {
		parts = append(parts, op+"="+counts[op])
	}
	return strings.Join(parts, " ")
}

// peakRSS reads a process's peak resident memory (Linux), or "?".
func peakRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "?"
}
