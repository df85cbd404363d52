package grpcidem_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/grpcidem"
	"google.golang.org/grpc/codes"
	hpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// A downstream call with its own timeout fails with a context error: the
// client gets DeadlineExceeded (grpc-go maps context errors), and Classify
// judges that code too (it used to get the raw error, whose code is
// Unknown): the application's "DeadlineExceeded means uncertain" rule
// holds, and the retry does not run the handler a second time.
func TestDownstreamDeadlineClassifiedAsSent(t *testing.T) {
	f := newFixture(t, memoryStore(t), grpcidem.Config{Classify: func(err error) grpcidem.Outcome {
		if status.Code(err) == codes.DeadlineExceeded {
			return grpcidem.Unknown
		}
		return grpcidem.DefaultClassify(err)
	}})
	f.health.check = func(ctx context.Context, _ *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		dctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		defer cancel()
		<-dctx.Done() // the payment gateway did not answer in time
		return nil, fmt.Errorf("payment gateway: %w", dctx.Err())
	}
	if code := status.Code(f.check(ctx, "k", "db").err); code != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded", code)
	}
	second := f.check(ctx, "k", "db")
	if f.calls() != 1 {
		t.Fatalf("handler ran %d times (second call: %v); the client saw DeadlineExceeded, which Classify marks Unknown", f.calls(), second.err)
	}
}

// A definite NotFound whose message holds bytes that are not UTF-8 (an
// identifier from a bytes field, a file name), which google.rpc.Status
// cannot hold: the invalid bytes are replaced, for the first client and
// the record alike, and retries replay NotFound (the record used to go
// unknown, every retry refused).
func TestNonUTF8ErrorMessageReplayed(t *testing.T) {
	f := newFixture(t, memoryStore(t), grpcidem.Config{})
	f.health.check = func(ctx context.Context, _ *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		return nil, status.Error(codes.NotFound, "no account \xff\xfe")
	}
	first := f.check(ctx, "k", "db")
	second := f.check(ctx, "k", "db")
	if status.Code(first.err) != codes.NotFound || status.Code(second.err) != codes.NotFound ||
		status.Convert(first.err).Message() != status.Convert(second.err).Message() || f.calls() != 1 {
		t.Fatalf("first %v, retry %v (%d runs); want NotFound replayed", first.err, second.err, f.calls())
	}
}
