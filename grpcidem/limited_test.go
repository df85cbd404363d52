package grpcidem_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	hpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
)

// A tenant over its rate of new keys gets ResourceExhausted with the
// reason and a RetryInfo; the handler does not run.
func TestTenantLimited(t *testing.T) {
	t.Parallel()
	f := &fixture{store: wrap(memoryStore(t)), health: &health{}}
	engine, err := idem.New(f.store, idem.Config{Logger: quiet, TenantRate: 0.001, TenantBurst: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.client = hpb.NewHealthClient(serve(t, f.health, grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(engine, grpcidem.Config{Logger: quiet}))))
	if r := f.check(ctx, "k1", "db"); r.err != nil {
		t.Fatal(r.err)
	}
	st := wantRefusal(t, f.check(ctx, "k2", "db").err, codes.ResourceExhausted, grpcidem.ReasonTenantLimited)
	if d := retryDelay(st); d <= 0 {
		t.Errorf("RetryInfo delay %v, want the time until the next key", d)
	}
	wantCalls(t, f, 1)
}

// Refusals that are no tenant's doing say so: the server's own rate of new
// keys has a reason of its own, and a store at its bound of calls in
// progress is Unavailable (the service is full), not ResourceExhausted.
func TestServerLimitsAreNotTenantLimits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		cfg    idem.Config
		code   codes.Code
		reason string
	}{
		{"new-key rate", idem.Config{Logger: quiet, NewKeyRate: 0.001, NewKeyBurst: 1}, codes.ResourceExhausted, grpcidem.ReasonNewKeysLimited},
		{"store bound", idem.Config{Logger: quiet, StoreMaxActive: 1}, codes.Unavailable, grpcidem.ReasonOverCapacity},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The memory store itself: the bound needs a store that counts
			// (store.ActiveCounter), which the fault-injecting wrapper hides.
			f := &fixture{health: &health{}}
			engine, err := idem.New(memoryStore(t), c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			f.client = hpb.NewHealthClient(serve(t, f.health, grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(engine, grpcidem.Config{Logger: quiet}))))
			// The first call holds its record in progress while the second
			// arrives.
			started, release := make(chan struct{}), make(chan struct{})
			f.health.check = func(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
				close(started)
				<-release
				return &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}, nil
			}
			done := make(chan error, 1)
			go func() { done <- f.check(ctx, "k1", "db").err }()
			<-started
			st := wantRefusal(t, f.check(ctx, "k2", "db").err, c.code, c.reason)
			if d := retryDelay(st); d <= 0 {
				t.Errorf("RetryInfo delay %v", d)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			wantCalls(t, f, 1)
		})
	}
}
