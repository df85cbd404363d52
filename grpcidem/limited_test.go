package grpcidem_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

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
	f.client = serve(t, grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(engine, grpcidem.Config{Logger: quiet})), f.health)
	if r := f.check(ctx, "k1", "db"); r.err != nil {
		t.Fatal(r.err)
	}
	st := wantRefusal(t, f.check(ctx, "k2", "db").err, codes.ResourceExhausted, grpcidem.ReasonTenantLimited)
	if d := retryDelay(st); d <= 0 {
		t.Errorf("RetryInfo delay %v, want the time until the next key", d)
	}
	wantCalls(t, f, 1)
}
