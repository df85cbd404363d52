package maintenance_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// The loops of Start end with Stop: no goroutine outlives its test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// service records its lifecycle; failStart makes Start fail.
type service struct {
	name      string
	failStart bool
	events    *[]string
}

func (s *service) Start(context.Context) error {
	*s.events = append(*s.events, "start "+s.name)
	if s.failStart {
		return errors.New("cannot start " + s.name)
	}
	return nil
}

func (s *service) Stop(context.Context) error {
	*s.events = append(*s.events, "stop "+s.name)
	return nil
}

func TestMaintainerStartStop(t *testing.T) {
	t.Parallel()
	var events []string
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	m.Clock.Manual = true
	mt := m.Maintainer(maintenance.Config{Services: []maintenance.Service{&service{name: "outbox", events: &events}}})
	m.Send("z", true)
	m.Clock.Advance(time.Minute)
	if err := mt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := mt.Start(context.Background()); err != nil { // already running
		t.Fatal(err)
	}
	m.Clock.NextPark(t)
	m.Clock.NextPark(t)
	if n := m.Clock.Pending(); n != 2 {
		t.Fatalf("%d loops run, want the sweeper and the reaper (no reconciler without a Resolver)", n)
	}
	m.Clock.Advance(maintenance.DefaultReapInterval) // past every first wait
	m.Clock.NextPark(t)
	m.Clock.NextPark(t)
	if s := m.State("z"); s != store.StateUnknown {
		t.Fatalf("the running sweeper left z %s", s)
	}
	if err := mt.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := mt.Stop(context.Background()); err != nil { // idempotent
		t.Fatal(err)
	}
	if strings.Join(events, ",") != "start outbox,stop outbox" {
		t.Fatalf("service lifecycle %v", events)
	}
	// A service that cannot start: the others are stopped again and
	// nothing runs.
	events = nil
	waiting := m.Clock.Pending()
	bad := m.Maintainer(maintenance.Config{Services: []maintenance.Service{
		&service{name: "a", events: &events}, &service{name: "b", failStart: true, events: &events}}})
	if err := bad.Start(context.Background()); err == nil {
		t.Fatal("Start succeeded with a failing service")
	}
	if strings.Join(events, ",") != "start a,start b,stop a" {
		t.Fatalf("lifecycle after a failed start %v", events)
	}
	if n := m.Clock.Pending(); n != waiting {
		t.Fatalf("%d loops run after a failed start", n-waiting)
	}
	if err := bad.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A failed pass is logged, and the loop goes on at its interval.
func TestLoopLogsAFailedPass(t *testing.T) {
	t.Parallel()
	// slog's handlers serialize their writes.
	var log strings.Builder
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{})
	m.Clock.Manual = true
	// Any Resolver: it turns the reconciler on.
	resolver := maintenance.ResolverFunc(func(context.Context, store.Record) (maintenance.Resolution, error) {
		return maintenance.Resolution{}, nil
	})
	inner := memory.New(memory.Config{Clock: m.Clock.Now})
	mt, err := maintenance.New(brokenStore{inner}, maintenance.Config{Clock: m.Clock, Resolver: resolver,
		Logger: slog.New(slog.NewTextHandler(&log, nil)), SweepInterval: time.Hour, ReapInterval: time.Hour, ReconcileInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	maintenance.SetRand(mt, func(int64) int64 { return 0 })
	if err := mt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m.Clock.NextPark(t)
	}
	m.Clock.Advance(0)
	for range 3 {
		if d := m.Clock.NextPark(t); d != time.Hour {
			t.Fatalf("wait after a failed pass: %v", d)
		}
	}
	if err := mt.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, svc := range []string{"sweep", "reap", "reconcile"} {
		if !strings.Contains(log.String(), "service="+svc) || !strings.Contains(log.String(), "store unavailable") {
			t.Fatalf("no failed %s pass logged:\n%s", svc, log.String())
		}
	}
}

// brokenStore is a store whose database went away: every background call
// fails.
type brokenStore struct{ store.Store }

var errGone = errors.New("connection refused")

func (brokenStore) SweepExpiredLeases(context.Context, store.SweepParams) ([]store.Record, error) {
	return nil, errGone
}
func (brokenStore) Reap(context.Context, store.ReapParams) (store.ReapResult, error) {
	return store.ReapResult{}, errGone
}
func (brokenStore) ListUnknown(context.Context, store.ListUnknownParams) ([]store.Record, error) {
	return nil, errGone
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	if _, err := maintenance.New(nil, maintenance.Config{}); err == nil {
		t.Fatal("New accepted a nil store")
	}
	for _, tt := range []struct {
		cfg  maintenance.Config
		want string
	}{
		{maintenance.Config{TTL: -1}, "TTL must not be negative"},
		{maintenance.Config{StoreTimeout: -time.Second}, "StoreTimeout must not be negative"},
		{maintenance.Config{SweepInterval: -1}, "SweepInterval"},
		{maintenance.Config{ReapInterval: -1}, "ReapInterval"},
		{maintenance.Config{ReconcileInterval: -1}, "ReconcileInterval"},
		{maintenance.Config{BatchTimeout: -1}, "BatchTimeout"},
		{maintenance.Config{BatchPause: -1}, "BatchPause"},
		{maintenance.Config{AbandonedTTL: -1}, "AbandonedTTL"},
		{maintenance.Config{ReconcileBackoff: -1}, "ReconcileBackoff must not be negative"},
		{maintenance.Config{ReconcileMaxBackoff: -1}, "ReconcileMaxBackoff must not be negative"},
		{maintenance.Config{BatchSize: -5}, "BatchSize must not be negative (got -5)"},
		{maintenance.Config{MaxReconcileAttempts: -1}, "MaxReconcileAttempts"},
		{maintenance.Config{ReconcileBackoff: 2 * time.Hour}, "ReconcileMaxBackoff (1h0m0s) is shorter than ReconcileBackoff (2h0m0s)"},
		{maintenance.Config{ReconcileBackoff: time.Minute, ReconcileMaxBackoff: time.Second}, "ReconcileMaxBackoff (1s) is shorter"},
		{maintenance.Config{StoreTimeout: 2 * time.Minute}, "BatchTimeout (1m0s) is shorter than StoreTimeout (2m0s)"},
		{maintenance.Config{Services: []maintenance.Service{nil}}, "Services[0] is nil"},
	} {
		_, err := maintenance.New(s, tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "maintenance: ") {
			t.Errorf("New(%+v) = %v, want an error with %q", tt.cfg, err, tt.want)
		}
	}
	// Every problem is reported at once.
	_, err := maintenance.New(s, maintenance.Config{TTL: -1, BatchSize: -1})
	if err == nil || !strings.Contains(err.Error(), "TTL") || !strings.Contains(err.Error(), "BatchSize") {
		t.Fatalf("two bad fields: %v", err)
	}
}

// The zero Config takes the documented defaults.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	mt, err := maintenance.New(memory.New(memory.Config{}), maintenance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got := maintenance.ConfigOf(mt)
	want := maintenance.Config{
		TTL: 24 * time.Hour, StoreTimeout: 5 * time.Second, SweepInterval: 15 * time.Second,
		ReapInterval: time.Minute, ReconcileInterval: 10 * time.Second, BatchSize: 100,
		BatchTimeout: time.Minute, BatchPause: 100 * time.Millisecond, AbandonedTTL: 24 * time.Hour,
		ReconcileBackoff: 30 * time.Second, ReconcileMaxBackoff: time.Hour, MaxReconcileAttempts: 10,
	}
	if got.Logger == nil || got.Clock == nil {
		t.Fatal("no default logger or clock")
	}
	got.Logger, got.Clock = nil, nil
	if got.TTL != want.TTL || got.StoreTimeout != want.StoreTimeout || got.SweepInterval != want.SweepInterval ||
		got.ReapInterval != want.ReapInterval || got.ReconcileInterval != want.ReconcileInterval ||
		got.BatchSize != want.BatchSize || got.BatchTimeout != want.BatchTimeout || got.BatchPause != want.BatchPause ||
		got.AbandonedTTL != want.AbandonedTTL || got.ReconcileBackoff != want.ReconcileBackoff ||
		got.ReconcileMaxBackoff != want.ReconcileMaxBackoff || got.MaxReconcileAttempts != want.MaxReconcileAttempts {
		t.Fatalf("defaults %+v, want %+v", got, want)
	}
}

// The services count their work under the engine's metric names, and
// measure their store calls beside the engine's under the op attribute.
func TestMetrics(t *testing.T) {
	t.Parallel()
	obs := &obstest.Recorder{}
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{Observer: obs})
	mt := m.Maintainer(maintenance.Config{Observer: obs, Resolver: enginetest.StillUnknown, MaxReconcileAttempts: 1})
	m.Send("z", true)
	m.Send("done", false)
	m.Clock.Advance(25 * time.Hour)
	if _, err := mt.SweepOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := mt.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The dead letter says why, in words that agree with the count.
	if r, err := m.Record("z"); err != nil || !strings.HasPrefix(r.LastError, "dead-lettered after 1 attempt: ") {
		t.Errorf("dead letter: %q, %v", r.LastError, err)
	}
	if _, err := mt.ReapOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	sums := obs.Events()
	ops := obs.StoreCalls()
	for name, want := range map[string]int64{
		"zombies_swept": 1, "reconcile_dead": 1, "ttl_pruned": 1,
	} {
		if sums[name] != want {
			t.Errorf("%s = %d, want %d (all: %v)", name, sums[name], want, sums)
		}
	}
	// The engine counts the scheduling of records it marks unknown; the
	// sweeper those it moves.
	if sums["reconcile_scheduled"] < 1 {
		t.Errorf("reconcile_scheduled = %d", sums["reconcile_scheduled"])
	}
	for _, op := range []string{"sweep", "reap", "list_unknown", "defer", "reserve"} {
		if ops[op] == 0 {
			t.Errorf("no store call reported for op %s (have %v)", op, ops)
		}
	}
}

// The reaper spares an in-progress record past its expiry whose lease
// ended within SweepGrace, as the sweeper does: its holder may be alive,
// renewing once the store answers again.
func TestReaperWaitsSweepGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := enginetest.NewMaint(t, enginetest.Memory, maintenance.Config{}, idem.Config{TTL: time.Hour})
	m.Send("long", true)
	rec, err := m.Record("long")
	if err != nil {
		t.Fatal(err)
	}
	// The holder renews its lease past the record's expiry, then misses a
	// renewal.
	m.Clock.Advance(time.Hour - time.Second)
	fence := store.FenceParams{Scope: rec.Scope, Key: rec.Key, Fence: rec.Fence}
	if err := m.Store.Extend(ctx, store.ExtendParams{FenceParams: fence, Lease: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	m.Clock.Advance(30*time.Second + maintenance.DefaultSweepGrace - time.Microsecond)
	if res, err := m.M.ReapOnce(ctx); err != nil || res.Abandoned != 0 {
		t.Fatalf("reap within the grace: %+v %v", res, err)
	}
	m.Clock.Advance(time.Microsecond)
	if res, err := m.M.ReapOnce(ctx); err != nil || res.Abandoned != 1 {
		t.Fatalf("reap once the grace passed: %+v %v, want 1 abandoned", res, err)
	}
}
