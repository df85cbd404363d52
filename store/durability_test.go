package store_test

import (
	"testing"

	"github.com/idem-go/idem/store"
)

// TestDurabilitySummary: the log line of a durability report tells no
// replica seen (0) from replicas the store could not see (-1), lists the
// settings in a stable order, and two reports are Equal exactly when they
// say the same, warnings included, so that a change is logged once.
func TestDurabilitySummary(t *testing.T) {
	d := store.Durability{State: store.DurabilityAtRisk, Replicas: 0, Synchronous: false,
		Settings: map[string]string{"synchronous_commit": "on", "fsync": "on"},
		Warnings: []string{"no standby"}}
	if got, want := d.String(), `at_risk replicas=0 synchronous=false fsync="on" synchronous_commit="on"`; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	unseen := store.Durability{State: store.DurabilityUnknown, Replicas: -1}
	if got, want := unseen.String(), "unknown replicas=unknown synchronous=false"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if !d.AtRisk() || unseen.AtRisk() {
		t.Errorf("AtRisk: %v for %s, %v for %s", d.AtRisk(), d.State, unseen.AtRisk(), unseen.State)
	}
	same := d
	same.Settings = map[string]string{"fsync": "on", "synchronous_commit": "on"}
	otherWarning := d
	otherWarning.Warnings = []string{"standby lagging"}
	for name, c := range map[string]struct {
		o    store.Durability
		want bool
	}{
		"itself":              {d, true},
		"the same settings":   {same, true},
		"another warning":     {otherWarning, false},
		"another replica set": {unseen, false},
	} {
		if got := d.Equal(c.o); got != c.want {
			t.Errorf("Equal with %s = %v, want %v", name, got, c.want)
		}
	}
}
