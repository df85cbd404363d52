package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

func TestStateActive(t *testing.T) {
	for st, want := range map[store.State]bool{
		store.StateInProgress: true, store.StateUnknown: true,
		store.StateCompleted: false, store.StateFailedRetryable: false, store.StateExpired: false,
		// A state added later counts unless it is terminal.
		"pending": true,
	} {
		if got := st.Active(); got != want {
			t.Errorf("%s.Active() = %v, want %v", st, got, want)
		}
	}
}

func TestReserveParamsTenant(t *testing.T) {
	base := store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour,
		LeasePolicy: store.LeaseUnknown}
	for name, c := range map[string]struct {
		tenant string
		max    int
		want   error
	}{
		"no cap":                     {"", 0, nil},
		"a cap":                      {"acme", 3, nil},
		"negative cap":               {"acme", -1, store.ErrInvalidParams},
		"tenant at the limit":        {strings.Repeat("t", store.MaxScopeBytes), 1, nil},
		"tenant too long":            {strings.Repeat("t", store.MaxScopeBytes+1), 1, store.ErrTooLong},
		"tenant not UTF-8":           {"a\xff", 1, store.ErrInvalidParams},
		"tenant with a NUL":          {"a\x00b", 1, store.ErrInvalidParams},
		"tenant starting with a NUL": {"\x00a", 1, store.ErrInvalidParams},
	} {
		p := base
		p.Tenant, p.MaxActive = c.tenant, c.max
		err := p.Validate()
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
