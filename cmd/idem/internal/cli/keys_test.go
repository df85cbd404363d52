package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// record makes a record of (tenant, route, key) created at the time the
// store's clock reads, in state: completed (status 201), unknown or
// in_progress.
func record(t *testing.T, s store.Store, tenant, route, key string, state store.State) {
	t.Helper()
	ctx := context.Background()
	scope := (&idem.Request{Tenant: tenant, Method: "POST", Route: route}).Scope()
	res, err := s.Reserve(ctx, store.ReserveParams{Scope: scope, Key: key, Fingerprint: "fp", Lease: time.Hour, TTL: 24 * time.Hour,
		LeasePolicy: store.LeaseUnknown})
	if err != nil || !res.Outcome.Acquired() {
		t.Fatalf("reserve %s: %v %v", key, res.Outcome, err)
	}
	fp := store.FenceParams{Scope: scope, Key: key, Fence: res.Record.Fence}
	switch state {
	case store.StateCompleted:
		err = s.Complete(ctx, store.CompleteParams{FenceParams: fp, Response: store.Response{Status: 201, Body: []byte(`{}`)}, TTL: 24 * time.Hour})
	case store.StateUnknown:
		err = s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fp, Error: "upstream hung up"})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// keysOf lists with args and returns the keys of the page, in order, and
// the next cursor.
func keysOf(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	out, errOut, err := run(append([]string{"keys", "list", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("keys list %q: %v\n%s", args, err, errOut)
	}
	var page keysPage
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("keys list %q printed %q: %v", args, out, err)
	}
	var keys []string
	for _, r := range page.Records {
		keys = append(keys, r.Key)
	}
	return keys, page.Next
}

// allPages pages through a listing with --limit n and returns every key.
func allPages(t *testing.T, n int, args ...string) []string {
	t.Helper()
	var all []string
	after := ""
	for range 100 {
		a := append([]string{"--limit", fmt.Sprint(n)}, args...)
		if after != "" {
			a = append(a, "--after", after)
		}
		keys, next := keysOf(t, a...)
		if len(keys) > n {
			t.Fatalf("page of %d records with --limit %d", len(keys), n)
		}
		all = append(all, keys...)
		if next == "" {
			return all
		}
		after = next
	}
	t.Fatal("paging does not end")
	return nil
}

func TestKeysList(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	base := time.Now().Add(-time.Hour)
	// Each record is created a second after the previous: newest first is
	// the reverse of this order.
	seq := []struct {
		tenant, route, key string
		state              store.State
	}{
		{"", "/v1/charges", "c1", store.StateCompleted},
		{"acme", "/v1/charges", "a1", store.StateCompleted},
		{"", "/v1/charges?x=1", "q1", store.StateCompleted},
		{"", "/v1/charges", "c2", store.StateCompleted},
		{"", "/v1/refunds", "r1", store.StateUnknown},
		{"", "/v1/charges", "c3", store.StateInProgress},
		{"acme", "/v1/charges", "a2", store.StateUnknown},
		{"", "/v1/charges", "c4", store.StateCompleted},
		{"", "/v1/charges", "c5", store.StateCompleted},
	}
	for i, r := range seq {
		record(t, seeded(t, dsn, base.Add(time.Duration(i)*time.Second)), r.tenant, r.route, r.key, r.state)
	}
	newest := func(keep func(tenant, route, key string, state store.State) bool) []string {
		var keys []string
		for _, r := range slices.Backward(seq) {
			if keep(r.tenant, r.route, r.key, r.state) {
				keys = append(keys, r.key)
			}
		}
		return keys
	}
	every := newest(func(string, string, string, store.State) bool { return true })

	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"all", nil, every},
		// No tenant named: the route under every tenant.
		{"route", []string{"--route", "/v1/charges"}, newest(func(_, rt, _ string, _ store.State) bool { return rt == "/v1/charges" })},
		{"route of no tenant", []string{"--route", "/v1/charges", "--tenant", ""}, newest(func(tn, rt, _ string, _ store.State) bool { return tn == "" && rt == "/v1/charges" })},
		{"route of a tenant", []string{"--route", "/v1/charges", "--tenant", "acme"}, []string{"a2", "a1"}},
		{"tenant", []string{"--tenant", "acme"}, []string{"a2", "a1"}},
		{"scope", []string{"--scope", "0:POST /v1/refunds"}, []string{"r1"}},
		{"state", []string{"--state", "unknown"}, []string{"a2", "r1"}},
		{"state and route", []string{"--state", "completed", "--route", "/v1/charges"}, []string{"c5", "c4", "c2", "a1", "c1"}},
		{"quoted key", []string{"--key", `"c3"`}, []string{"c3"}},
		{"bare key", []string{"--key", "q1"}, []string{"q1"}},
		{"no match", []string{"--tenant", "nobody"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, n := range []int{1, 2, 3, 50} {
				if got := allPages(t, n, append([]string{"--store", dsn}, c.args...)...); !slices.Equal(got, c.want) {
					t.Errorf("--limit %d: %q, want %q", n, got, c.want)
				}
			}
		})
	}

	// A record created while an operator pages does not shift the pages.
	first, next := keysOf(t, "--store", dsn, "--limit", "3")
	record(t, seeded(t, dsn, time.Now()), "", "/v1/charges", "late", store.StateCompleted)
	rest := allPages(t, 3, "--store", dsn, "--after", next)
	if got := append(first, rest...); !slices.Equal(got, every) {
		t.Errorf("pages around a new record: %q, want %q", got, every)
	}

	// The table, and the next page's cursor on stderr.
	out, errOut, err := run("keys", "list", "--store", dsn, "--limit", "2", "--route", "/v1/charges", "--state", "completed")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "CREATED") ||
		!regexp.MustCompile(`^\S+Z\s+completed\s+201\s+1\s+POST /v1/charges\s+-\s+"late"$`).MatchString(lines[1]) ||
		!strings.HasSuffix(lines[2], `"c5"`) {
		t.Errorf("table:\n%s", out)
	}
	m := regexp.MustCompile(`next page: --after (\S+)\n`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("no next cursor on stderr: %q", errOut)
	}
	if keys, _ := keysOf(t, "--store", dsn, "--limit", "2", "--route", "/v1/charges", "--state", "completed", "--after", m[1]); !slices.Equal(keys, []string{"c4", "c2"}) {
		t.Errorf("page after the printed cursor: %q", keys)
	}
	out, _, _ = run("keys", "list", "--store", dsn, "--json", "--key", "a2")
	var page keysPage
	if json.Unmarshal([]byte(out), &page) != nil || len(page.Records) != 1 || page.Next != "" {
		t.Fatalf("json: %s", out)
	}
	if r := page.Records[0]; r.Tenant != "acme" || r.Method != "POST" || r.Route != "/v1/charges" || r.Scope != "4:acmePOST /v1/charges" ||
		r.State != store.StateUnknown || r.LastError != "upstream hung up" || r.Fence <= 0 || r.CreatedAt == nil || r.Status != 0 {
		t.Errorf("json record: %+v", r)
	}
	if _, errOut, err := run("keys", "list", "--store", dsn, "--tenant", "nobody"); err != nil || !strings.Contains(errOut, "no records match") {
		t.Errorf("empty listing: %v %q", err, errOut)
	}
}

func TestKeysListErrors(t *testing.T) {
	t.Parallel()
	dsn := tempDSN(t)
	seeded(t, dsn, time.Now())
	for _, args := range [][]string{
		{"--limit", "0"},
		{"--limit", "1001"},
		{"--state", "done"},
		{"--after", "garbage"},
		{"--after", "1.@@.@@"},
		{"--scope", "0:POST /x", "--route", "/x"},
		{"--method", "PUT"},
		{"--key", "two words"},
		{"extra"},
	} {
		_, errOut, err := run(append([]string{"keys", "list", "--store", dsn}, args...)...)
		if !errors.Is(err, ErrUsage) || !strings.Contains(errOut, "Usage: idem keys list") {
			t.Errorf("%q: %v\n%s", args, err, errOut)
		}
	}
	if _, _, err := run("keys"); !errors.Is(err, ErrUsage) {
		t.Errorf("keys without a subcommand: %v", err)
	}
	if _, _, err := run("keys", "list", "--store", "sqlite:/nonexistent/x.db"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing database: %v", err)
	}
}
