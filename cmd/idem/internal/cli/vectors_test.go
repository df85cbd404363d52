package cli

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/testenv"
)

// The draft's conformance vectors against the proxy, on both profiles,
// with duplicates waiting (the default) and refused at once (--wait 0):
// every vector passes, and the upstream ran exactly the executions the
// vectors expect.
func TestIETFVectors(t *testing.T) {
	t.Parallel()
	for _, profile := range []idem.Profile{idem.ProfileIETF, idem.ProfileStripe} {
		for _, wait := range []time.Duration{defaultWait, 0} {
			t.Run(string(profile)+"/wait="+wait.String(), func(t *testing.T) {
				t.Parallel()
				api := &chargeAPI{}
				_, base := startProxy(t, ProxyConfig{
					Store:    "sqlite:" + filepath.Join(t.TempDir(), "idem.db"),
					Upstream: newUpstream(t, delayed(api, 100*time.Millisecond)).URL,
					Config:   idem.Config{Profile: profile, Wait: wait},
				})
				cfg := checkConfig{URL: base + "/v1/charges", Method: http.MethodPost, Profile: profile,
					Header: http.Header{"Content-Type": {"application/json"}}, Concurrency: 8, Timeout: 10 * time.Second,
					Body: []byte(`{"amount":100}`), AltBody: []byte(`{"amount":200}`)}
				var out testenv.Buffer
				want, err := runVectors(context.Background(), cfg, &out)
				t.Log("\n" + out.String())
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(out.String(), "0 failed, 0 skipped") {
					t.Errorf("not every vector passed")
				}
				if got := api.calls.Load(); got != int64(want) {
					t.Errorf("the upstream ran %d requests; the vectors expect %d", got, want)
				}
			})
		}
	}
}

// The vectors are well formed: each names its clause, level and
// requirement, and every step says what it expects under both profiles.
func TestIETFVectorsWellFormed(t *testing.T) {
	t.Parallel()
	vs, err := loadVectors()
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) < 10 {
		t.Fatalf("%d vectors", len(vs))
	}
	seen := map[string]bool{}
	for _, v := range vs {
		if v.ID == "" || seen[v.ID] || v.Clause == "" || v.Requirement == "" ||
			v.Level != "MUST" && v.Level != "SHOULD" && v.Level != "MAY" {
			t.Errorf("vector %+v: missing or repeated id, clause, requirement or level", v)
		}
		seen[v.ID] = true
		for i, s := range v.Steps {
			for _, p := range []idem.Profile{idem.ProfileIETF, idem.ProfileStripe} {
				_, own := s.Expect[string(p)]
				_, all := s.Expect["*"]
				if !own && !all {
					t.Errorf("%s step %d expects nothing under %s", v.ID, i+1, p)
				}
			}
		}
	}
}

// The vectors fail an API without idempotency, and idem check runs them
// with --ietf-vectors.
func TestIETFVectorsCatchNoIdempotency(t *testing.T) {
	t.Parallel()
	api := newUpstream(t, &chargeAPI{})
	out, _, err := run("check", "--ietf-vectors", api.URL+"/v1/charges")
	if err == nil || !strings.Contains(out, "FAIL  duplicate-replays") || !strings.Contains(out, "FAIL  key-reused") {
		t.Errorf("vectors against an API without idempotency: %v\n%s", err, out)
	}
	api2 := newUpstream(t, &chargeAPI{})
	_, base := startProxy(t, ProxyConfig{Store: "memory:", Upstream: api2.URL})
	if out, _, err := run("check", "--ietf-vectors", base+"/v1/charges"); err != nil || !strings.Contains(out, "0 failed") {
		t.Errorf("idem check --ietf-vectors against the proxy: %v\n%s", err, out)
	}
}
