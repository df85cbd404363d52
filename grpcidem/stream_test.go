package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"google.golang.org/grpc/codes"
	hpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
)

// reflectMethod is the bidirectional streaming method of the reflection
// service every fixture serves.
const reflectMethod = rpb.ServerReflection_ServerReflectionInfo_FullMethodName

// watch calls Watch with the given key ("" sends none) and extra metadata
// pairs, and returns the statuses received and the error the stream ended
// with (nil at its normal end).
func (f *fixture) watch(ctx context.Context, key string, pairs ...string) ([]hpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithCancel(outgoing(ctx, key, pairs...))
	defer cancel()
	stream, err := f.client.Watch(ctx, &hpb.HealthCheckRequest{Service: "db"})
	if err != nil {
		return nil, err
	}
	var got []hpb.HealthCheckResponse_ServingStatus
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		} else if err != nil {
			return got, err
		}
		got = append(got, resp.GetStatus())
	}
}

// reflect runs the reflection service's bidirectional stream with the given
// key ("" sends none) and extra metadata pairs: it asks for the list of
// services, receives it, closes its side and waits for the server's end. It
// returns the services listed and the error the stream ended with.
func (f *fixture) reflect(ctx context.Context, key string, pairs ...string) ([]string, error) {
	ctx, cancel := context.WithCancel(outgoing(ctx, key, pairs...))
	defer cancel()
	stream, err := rpb.NewServerReflectionClient(f.conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	// A stream the server ended at once reports io.EOF on Send, and its
	// status on Recv.
	req := &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}
	if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if err := stream.CloseSend(); err != nil {
		return names, err
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return names, fmt.Errorf("after the answer: %v, want the end of the stream", err)
	}
	return names, nil
}

// wantStreamRefused fails unless err is the refusal of a stream to method,
// and returns its message.
func wantStreamRefused(t *testing.T, err error, method string) string {
	t.Helper()
	msg := wantRefusal(t, err, codes.Unimplemented, grpcidem.ReasonStreamNotProtected).Message()
	if !strings.Contains(msg, method) || !strings.Contains(msg, "streaming method") {
		t.Errorf("message %q does not name %s or say that streaming methods cannot be protected", msg, method)
	}
	return msg
}

// wantWatched fails unless a Watch ran to its end.
func wantWatched(t *testing.T, got []hpb.HealthCheckResponse_ServingStatus, err error) {
	t.Helper()
	if err != nil || !slices.Equal(got, watched) {
		t.Errorf("Watch: %v, %v; want %v and the end of the stream", got, err, watched)
	}
}

// wantReflected fails unless a reflection stream ran to its end and listed
// the Health service.
func wantReflected(t *testing.T, names []string, err error) {
	t.Helper()
	if err != nil || !slices.Contains(names, hpb.Health_ServiceDesc.ServiceName) {
		t.Errorf("reflection: %v, %v; want a list with %s and the end of the stream", names, err, hpb.Health_ServiceDesc.ServiceName)
	}
}

// keySpellings are the keys a streaming call may carry: well formed,
// malformed, and given twice.
var keySpellings = map[string][]string{
	"key":       {grpcidem.KeyMetadata, "k"},
	"malformed": {grpcidem.KeyMetadata, `"k`},
	"repeated":  {grpcidem.KeyMetadata, "a", grpcidem.KeyMetadata, "b"},
}

// A streaming method listed in Required is refused at every call, with a
// key or without, even when keyed streams may pass: its operator believes
// it protected. The handler never runs, and the server says why.
func TestStreamRequiredRefused(t *testing.T) {
	t.Parallel()
	var log testenv.Buffer
	f := newFixture(t, memoryStore(t), grpcidem.Config{
		Required: []string{watchMethod}, PassKeyedStreams: true,
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})
	for range 2 {
		_, err := f.watch(ctx, "")
		wantStreamRefused(t, err, watchMethod)
	}
	for name, pairs := range keySpellings {
		t.Run(name, func(t *testing.T) {
			_, err := f.watch(ctx, "", pairs...)
			wantStreamRefused(t, err, watchMethod)
		})
	}
	wantCalls(t, f, 0)
	if out := log.String(); strings.Count(out, "level=WARN") != 2+len(keySpellings) || !strings.Contains(out, watchMethod) {
		t.Errorf("the server logged %q; want a warning naming %s at each call", out, watchMethod)
	}
}

// A streaming call that carries a key is refused by default, whatever the
// key's form: its client expects a protection the server cannot give.
func TestKeyedStreamRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{})
	for name, pairs := range keySpellings {
		t.Run(name, func(t *testing.T) {
			_, err := f.watch(ctx, "", pairs...)
			if msg := wantStreamRefused(t, err, watchMethod); !strings.Contains(msg, "without "+grpcidem.KeyMetadata) {
				t.Errorf("message %q does not say how to call the method", msg)
			}
			_, err = f.reflect(ctx, "", pairs...)
			wantStreamRefused(t, err, reflectMethod)
		})
	}
	wantCalls(t, f, 0)
}

// With PassKeyedStreams a keyed stream runs, unprotected (every call runs
// again), its key ignored whatever its form; a Required streaming method is
// still refused.
func TestKeyedStreamPassed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{Required: []string{reflectMethod}, PassKeyedStreams: true})
	for name, pairs := range keySpellings {
		t.Run(name, func(t *testing.T) {
			for range 2 {
				got, err := f.watch(ctx, "", pairs...)
				wantWatched(t, got, err)
			}
			_, err := f.reflect(ctx, "", pairs...)
			wantStreamRefused(t, err, reflectMethod)
		})
	}
	wantCalls(t, f, 2*int64(len(keySpellings)))
}

// A streaming call without a key to a method not in Required passes through
// untouched, in both directions; the same call with a key is refused.
func TestStreamWithoutKeyPasses(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{Required: []string{checkMethod}})
	for range 2 {
		got, err := f.watch(ctx, "")
		wantWatched(t, got, err)
		names, err := f.reflect(ctx, "")
		wantReflected(t, names, err)
	}
	_, err := f.watch(ctx, "k")
	wantStreamRefused(t, err, watchMethod)
	wantCalls(t, f, 2)
}

// ServerOptions installs both interceptors from one Config: unary calls
// keep their protection (a retry is a replay, a missing key refused) and a
// Required streaming method is refused, on one server.
func TestServerOptionsProtectsBoth(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{Required: []string{checkMethod, watchMethod}})
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
	wantRefusal(t, f.check(ctx, "", "db").err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
	_, err := f.watch(ctx, "k")
	wantStreamRefused(t, err, watchMethod)
	wantCalls(t, f, 1)
}
