package grpcidem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/sqlite"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	hpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	listMethod  = "/grpc.health.v1.Health/List"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

var quiet = slog.New(slog.DiscardHandler)

// health is a real Health service whose Check counts its executions and
// answers SERVING only the first time, so a replay is told from a second
// execution by its content. Tests replace check to fail, block or panic.
// Watch, a server-streaming method, counts among the executions too.
type health struct {
	hpb.UnimplementedHealthServer
	calls atomic.Int64
	check func(ctx context.Context, req *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error)
}

func (h *health) Check(ctx context.Context, req *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
	n := h.calls.Add(1)
	if h.check != nil {
		return h.check(ctx, req)
	}
	st := hpb.HealthCheckResponse_NOT_SERVING
	if n == 1 {
		st = hpb.HealthCheckResponse_SERVING
	}
	return &hpb.HealthCheckResponse{Status: st}, nil
}

// watched is what Watch sends.
var watched = []hpb.HealthCheckResponse_ServingStatus{hpb.HealthCheckResponse_SERVING, hpb.HealthCheckResponse_NOT_SERVING}

// Watch sends two statuses and ends the stream, so that a test sees
// messages flow and the stream close.
func (h *health) Watch(_ *hpb.HealthCheckRequest, stream hpb.Health_WatchServer) error {
	h.calls.Add(1)
	for _, st := range watched {
		if err := stream.Send(&hpb.HealthCheckResponse{Status: st}); err != nil {
			return err
		}
	}
	return nil
}

func (h *health) List(ctx context.Context, req *hpb.HealthListRequest) (*hpb.HealthListResponse, error) {
	n := h.calls.Add(1)
	return &hpb.HealthListResponse{Statuses: map[string]*hpb.HealthCheckResponse{
		fmt.Sprint("call-", n): {Status: hpb.HealthCheckResponse_SERVING},
	}}, nil
}

// faultyStore wraps a real store: it fails Reserve on demand, as an outage
// would, and reports every final transition so a test can wait for the
// server to record a call whose client has already gone.
type faultyStore struct {
	store.Store
	failReserve atomic.Bool
	reserves    chan struct{}
	settled     chan string
}

func wrap(s store.Store) *faultyStore {
	return &faultyStore{Store: s, reserves: make(chan struct{}, 64), settled: make(chan string, 64)}
}

func (f *faultyStore) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if f.failReserve.Load() {
		return store.ReserveResult{}, errors.New("connection refused")
	}
	res, err := f.Store.Reserve(ctx, p)
	select {
	case f.reserves <- struct{}{}:
	default:
	}
	return res, err
}

func (f *faultyStore) note(what string) {
	select {
	case f.settled <- what:
	default:
	}
}

func (f *faultyStore) Complete(ctx context.Context, p store.CompleteParams) error {
	err := f.Store.Complete(ctx, p)
	f.note("completed")
	return err
}

func (f *faultyStore) Release(ctx context.Context, p store.ReleaseParams) error {
	err := f.Store.Release(ctx, p)
	f.note("released")
	return err
}

func (f *faultyStore) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	err := f.Store.MarkUnknown(ctx, p)
	f.note("unknown")
	return err
}

type newStore func(t *testing.T) store.Store

func memoryStore(*testing.T) store.Store { return memory.New(memory.Config{}) }

func sqliteStore(t *testing.T) store.Store {
	return openSQLite(t, filepath.Join(t.TempDir(), "idem.db"))
}

func openSQLite(t *testing.T, path string) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// eachStore runs a test against the memory store and SQLite.
func eachStore(t *testing.T, test func(t *testing.T, open newStore)) {
	for name, open := range map[string]newStore{"memory": memoryStore, "sqlite": sqliteStore} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, open)
		})
	}
}

// fixture is a real gRPC server on an in-memory listener, with the
// interceptors in front of the Health service, and a client of it.
type fixture struct {
	store  *faultyStore
	health *health
	conn   *grpc.ClientConn
	client hpb.HealthClient
}

func newFixture(t *testing.T, st store.Store, cfg grpcidem.Config) *fixture {
	t.Helper()
	f := &fixture{store: wrap(st), health: &health{}}
	engine, err := idem.New(f.store, idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	// Installed as the package documentation says: the application's own
	// interceptors first, grpcidem's inside them.
	opts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(recoverPanics)}, grpcidem.ServerOptions(engine, cfg)...)
	f.conn = serve(t, f.health, opts...)
	f.client = hpb.NewHealthClient(f.conn)
	return f
}

// serve starts a server with the given options in front of h and of the
// reflection service (a second streaming service, bidirectional), and
// returns a connection to it; both stop when the test ends.
func serve(t *testing.T, h hpb.HealthServer, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	hpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(lis)
	}()
	conn, err := dial(lis)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
	})
	return conn
}

// dial returns a connection to the server listening on lis.
func dial(lis *bufconn.Listener) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// recoverPanics stands for the application's recovery interceptor, which
// runs outside grpcidem: without it a panicking handler kills the process.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return handler(ctx, req)
}

type result struct {
	resp   *hpb.HealthCheckResponse
	header metadata.MD
	err    error
}

func (r result) replayed() bool {
	return strings.Join(r.header.Get(grpcidem.ReplayedMetadata), ",") == "true"
}

// outgoing returns ctx with the key ("" sends none) and extra metadata
// pairs to send.
func outgoing(ctx context.Context, key string, pairs ...string) context.Context {
	if key != "" {
		pairs = append(pairs, grpcidem.KeyMetadata, key)
	}
	if len(pairs) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, pairs...)
	}
	return ctx
}

// check calls Check with the given key ("" sends none) and extra metadata
// pairs.
func (f *fixture) check(ctx context.Context, key, service string, pairs ...string) result {
	var r result
	r.resp, r.err = f.client.Check(outgoing(ctx, key, pairs...), &hpb.HealthCheckRequest{Service: service}, grpc.Header(&r.header))
	return r
}

func (f *fixture) calls() int64 { return f.health.calls.Load() }

// waitSettled waits until the server recorded a final transition and
// returns which.
func (f *fixture) waitSettled(t *testing.T) string {
	t.Helper()
	select {
	case what := <-f.store.settled:
		return what
	case <-time.After(10 * time.Second):
		t.Fatal("the server never recorded the call's outcome")
		return ""
	}
}

// wantOK fails unless r is a successful answer with the given status and
// replay flag.
func wantOK(t *testing.T, r result, want hpb.HealthCheckResponse_ServingStatus, replayed bool) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("call failed: %v", r.err)
	}
	if r.resp.GetStatus() != want {
		t.Errorf("status = %v, want %v", r.resp.GetStatus(), want)
	}
	if r.replayed() != replayed {
		t.Errorf("replayed = %v, want %v (header %v)", r.replayed(), replayed, r.header)
	}
}

// wantRefusal fails unless err has the code and the interceptor's
// ErrorInfo reason, and returns the status.
func wantRefusal(t *testing.T, err error, code codes.Code, reason string) *status.Status {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("code = %v (%v), want %v", st.Code(), err, code)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.Reason != reason || info.Domain != grpcidem.ErrorDomain {
				t.Errorf("ErrorInfo = %s/%s, want %s/%s", info.Domain, info.Reason, grpcidem.ErrorDomain, reason)
			}
			return st
		}
	}
	t.Errorf("no ErrorInfo in %v", st.Details())
	return st
}

func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.RetryDelay.AsDuration()
		}
	}
	return 0
}

func wantCalls(t *testing.T, f *fixture, n int64) {
	t.Helper()
	if got := f.calls(); got != n {
		t.Errorf("handler ran %d times, want %d", got, n)
	}
}

var ctx = context.Background()

func TestReplay(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open newStore) {
		f := newFixture(t, open(t), grpcidem.Config{Required: []string{checkMethod}})
		wantOK(t, f.check(ctx, "k-1", "db"), hpb.HealthCheckResponse_SERVING, false)
		wantOK(t, f.check(ctx, "k-1", "db"), hpb.HealthCheckResponse_SERVING, true)
		wantCalls(t, f, 1)
		// Another key is another request.
		wantOK(t, f.check(ctx, "k-2", "db"), hpb.HealthCheckResponse_NOT_SERVING, false)
		wantCalls(t, f, 2)
	})
}

func TestReplayAfterRestart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	first := newFixture(t, openSQLite(t, path), grpcidem.Config{})
	wantOK(t, first.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)

	// A new server process over the same database file.
	second := newFixture(t, openSQLite(t, path), grpcidem.Config{})
	wantOK(t, second.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
	wantCalls(t, second, 0)
}

func TestQuotedAndBareSpellingsAreOneKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{})
	wantOK(t, f.check(ctx, `"k-1"`, "db"), hpb.HealthCheckResponse_SERVING, false)
	wantOK(t, f.check(ctx, "k-1", "db"), hpb.HealthCheckResponse_SERVING, true)
	wantCalls(t, f, 1)
}

func TestKeyReused(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open newStore) {
		f := newFixture(t, open(t), grpcidem.Config{})
		wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)
		r := f.check(ctx, "k", "cache")
		st := wantRefusal(t, r.err, codes.FailedPrecondition, grpcidem.ReasonKeyReused)
		if !strings.Contains(st.Message(), "different request") {
			t.Errorf("message %q does not say why", st.Message())
		}
		// The original record is untouched.
		wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
		wantCalls(t, f, 1)
	})
}

// An engine made for asynchronous HTTP routes runs unary calls at once: a
// call has no 202 or status resource to come back to.
func TestAsynchronousEngineRunsCallsAtOnce(t *testing.T) {
	t.Parallel()
	engine, err := idem.New(memoryStore(t), idem.Config{Async: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{health: &health{}}
	f.client = hpb.NewHealthClient(serve(t, f.health, grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(engine, grpcidem.Config{Logger: quiet}))))
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
	wantCalls(t, f, 1)
}

func TestKeyReusedCode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{KeyReusedCode: codes.InvalidArgument})
	f.check(ctx, "k", "db")
	wantRefusal(t, f.check(ctx, "k", "cache").err, codes.InvalidArgument, grpcidem.ReasonKeyReused)
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open newStore) {
		f := newFixture(t, open(t), grpcidem.Config{})
		const n = 16
		start := make(chan struct{})
		results := make([]result, n)
		var wg sync.WaitGroup
		for i := range results {
			wg.Go(func() {
				<-start
				results[i] = f.check(ctx, "k", "db")
			})
		}
		close(start)
		wg.Wait()
		wantCalls(t, f, 1)
		var executed, replayed, aborted int
		for _, r := range results {
			switch {
			case r.err != nil:
				wantRefusal(t, r.err, codes.Aborted, grpcidem.ReasonInProgress)
				aborted++
				continue
			case r.replayed():
				replayed++
			default:
				executed++
			}
			wantOK(t, r, hpb.HealthCheckResponse_SERVING, r.replayed())
		}
		if executed != 1 {
			t.Errorf("%d answers came from an execution, want 1 (%d replayed, %d aborted)", executed, replayed, aborted)
		}
	})
}

func TestInProgress(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{RetryAfter: 3 * time.Second})
	entered, release := make(chan struct{}), make(chan struct{})
	f.health.check = func(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		close(entered)
		<-release
		return &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}, nil
	}
	first := make(chan result)
	go func() { first <- f.check(ctx, "k", "db") }()
	<-entered

	dups := make([]result, 15)
	var wg sync.WaitGroup
	for i := range dups {
		wg.Go(func() { dups[i] = f.check(ctx, "k", "db") })
	}
	wg.Wait()
	close(release)
	for _, r := range dups {
		st := wantRefusal(t, r.err, codes.Aborted, grpcidem.ReasonInProgress)
		if d := retryDelay(st); d != 3*time.Second {
			t.Errorf("RetryInfo delay = %v, want 3s", d)
		}
	}
	wantOK(t, <-first, hpb.HealthCheckResponse_SERVING, false)
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
	wantCalls(t, f, 1)
}

func TestWaitThenReplay(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{Wait: 30 * time.Second})
	entered, release := make(chan struct{}), make(chan struct{})
	f.health.check = func(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		close(entered)
		<-release
		return &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}, nil
	}
	first := make(chan result)
	go func() { first <- f.check(ctx, "k", "db") }()
	<-entered
	<-f.store.reserves

	const dups = 15
	results := make(chan result, dups)
	for range dups {
		go func() { results <- f.check(ctx, "k", "db") }()
	}
	// Every duplicate has found the call in progress and is waiting.
	for range dups {
		<-f.store.reserves
	}
	close(release)
	wantOK(t, <-first, hpb.HealthCheckResponse_SERVING, false)
	for range dups {
		wantOK(t, <-results, hpb.HealthCheckResponse_SERVING, true)
	}
	wantCalls(t, f, 1)
}

func TestStoredError(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open newStore) {
		f := newFixture(t, open(t), grpcidem.Config{})
		f.health.check = func(_ context.Context, req *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
			st, err := status.New(codes.NotFound, "no service "+req.Service).WithDetails(
				&errdetails.ResourceInfo{ResourceType: "service", ResourceName: req.Service})
			if err != nil {
				return nil, err
			}
			return nil, st.Err()
		}
		first := f.check(ctx, "k", "billing")
		second := f.check(ctx, "k", "billing")
		wantCalls(t, f, 1)
		if first.replayed() || !second.replayed() {
			t.Errorf("replayed: first %v, second %v; want false, true", first.replayed(), second.replayed())
		}
		a, b := status.Convert(first.err), status.Convert(second.err)
		if a.Code() != codes.NotFound || !proto.Equal(a.Proto(), b.Proto()) {
			t.Errorf("replayed error %v, want %v", b.Proto(), a.Proto())
		}
		if info, ok := b.Details()[0].(*errdetails.ResourceInfo); !ok || info.ResourceName != "billing" {
			t.Errorf("replayed details = %v", b.Details())
		}
	})
}

func TestTransientErrorReleases(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open newStore) {
		f := newFixture(t, open(t), grpcidem.Config{})
		f.health.check = func(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
			if f.calls() == 1 {
				return nil, status.Error(codes.Unavailable, "database restarting")
			}
			return &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}, nil
		}
		if code := status.Code(f.check(ctx, "k", "db").err); code != codes.Unavailable {
			t.Fatalf("first call: %v, want Unavailable", code)
		}
		wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)
		wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
		wantCalls(t, f, 2)
	})
}

func TestClassify(t *testing.T) {
	t.Parallel()
	// DeadlineExceeded from a downstream call: this application says its
	// effect may have happened.
	f := newFixture(t, memoryStore(t), grpcidem.Config{Classify: func(err error) grpcidem.Outcome {
		if status.Code(err) == codes.DeadlineExceeded {
			return grpcidem.Unknown
		}
		return grpcidem.DefaultClassify(err)
	}})
	f.health.check = func(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		return nil, status.Error(codes.DeadlineExceeded, "payment gateway timed out")
	}
	if code := status.Code(f.check(ctx, "k", "db").err); code != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded", code)
	}
	wantRefusal(t, f.check(ctx, "k", "db").err, codes.Aborted, grpcidem.ReasonOutcomeUnknown)
	wantCalls(t, f, 1)
}

func TestDefaultClassify(t *testing.T) {
	t.Parallel()
	keep := map[codes.Code]bool{
		codes.InvalidArgument: true, codes.NotFound: true, codes.AlreadyExists: true, codes.PermissionDenied: true,
		codes.FailedPrecondition: true, codes.OutOfRange: true, codes.Unauthenticated: true,
	}
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		want := grpcidem.Release
		if keep[c] {
			want = grpcidem.Keep
		}
		if got := grpcidem.DefaultClassify(status.Error(c, "x")); got != want {
			t.Errorf("%v: %v, want %v", c, got, want)
		}
	}
	if got := grpcidem.DefaultClassify(errors.New("plain")); got != grpcidem.Release {
		t.Errorf("a plain error: %v, want release", got)
	}
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{Required: []string{checkMethod}})
	wantRefusal(t, f.check(ctx, "", "db").err, codes.InvalidArgument, grpcidem.ReasonKeyMissing)
	wantCalls(t, f, 0)
}

func TestMethodNotRequired(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{Required: []string{checkMethod}})
	list := func(key string) (*hpb.HealthListResponse, metadata.MD, error) {
		var hdr metadata.MD
		resp, err := f.client.List(outgoing(ctx, key), &hpb.HealthListRequest{}, grpc.Header(&hdr))
		return resp, hdr, err
	}
	// Without a key: untouched, run every time.
	for range 2 {
		if _, hdr, err := list(""); err != nil || len(hdr.Get(grpcidem.ReplayedMetadata)) != 0 {
			t.Fatalf("List without a key: %v, header %v", err, hdr)
		}
	}
	wantCalls(t, f, 2)
	// With a key: protected.
	a, _, err := list("k")
	if err != nil {
		t.Fatal(err)
	}
	b, hdr, err := list("k")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(a, b) || hdr.Get(grpcidem.ReplayedMetadata)[0] != "true" {
		t.Errorf("second List with the key: %v (header %v), want a replay of %v", b, hdr, a)
	}
	wantCalls(t, f, 3)
}

func TestMalformedKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{})
	for name, key := range map[string]string{
		"empty quoted":   `""`,
		"space":          "a b",
		"unterminated":   `"abc`,
		"after quote":    `"a"b`,
		"too long":       strings.Repeat("k", 256),
		"too long quote": `"` + strings.Repeat("k", 256) + `"`,
		"lone comma":     ",",
	} {
		t.Run(name, func(t *testing.T) {
			wantRefusal(t, f.check(ctx, key, "db").err, codes.InvalidArgument, grpcidem.ReasonKeyMalformed)
		})
	}
	t.Run("repeated", func(t *testing.T) {
		r := f.check(ctx, "a", "db", grpcidem.KeyMetadata, "b")
		wantRefusal(t, r.err, codes.InvalidArgument, grpcidem.ReasonKeyRepeated)
	})
	t.Run("joined list", func(t *testing.T) {
		wantRefusal(t, f.check(ctx, "a, b", "db").err, codes.InvalidArgument, grpcidem.ReasonKeyRepeated)
	})
	t.Run("255 characters", func(t *testing.T) {
		wantOK(t, f.check(ctx, strings.Repeat("k", 255), "db"), hpb.HealthCheckResponse_SERVING, false)
	})
	wantCalls(t, f, 1)
}

func TestStoreDown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{})
	f.store.failReserve.Store(true)
	st := wantRefusal(t, f.check(ctx, "k", "db").err, codes.Unavailable, grpcidem.ReasonStoreUnavailable)
	if retryDelay(st) != time.Second {
		t.Errorf("RetryInfo delay = %v, want the default 1s", retryDelay(st))
	}
	wantCalls(t, f, 0)
	// Back up: the key was never taken.
	f.store.failReserve.Store(false)
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)
}

func TestPanicLeavesOutcomeUnknown(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open newStore) {
		f := newFixture(t, open(t), grpcidem.Config{})
		f.health.check = func(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
			panic("nil map")
		}
		if st := status.Convert(f.check(ctx, "k", "db").err); st.Code() != codes.Internal || st.Message() != "panic: nil map" {
			t.Fatalf("first call: %v, want the recovery interceptor's answer", st)
		}
		st := wantRefusal(t, f.check(ctx, "k", "db").err, codes.Aborted, grpcidem.ReasonOutcomeUnknown)
		if !strings.Contains(st.Message(), "unknown") || retryDelay(st) == 0 {
			t.Errorf("outcome unknown answer %q, RetryInfo %v", st.Message(), retryDelay(st))
		}
		wantCalls(t, f, 1)
	})
}

func TestUncertain(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{})
	f.health.check = func(ctx context.Context, _ *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		idem.FromContext(ctx).Uncertain("gateway timed out")
		return nil, status.Error(codes.Unavailable, "try again")
	}
	if code := status.Code(f.check(ctx, "k", "db").err); code != codes.Unavailable {
		t.Fatalf("first call: %v", code)
	}
	wantRefusal(t, f.check(ctx, "k", "db").err, codes.Aborted, grpcidem.ReasonOutcomeUnknown)
	wantCalls(t, f, 1)
}

func TestCancelledCall(t *testing.T) {
	t.Parallel()
	// The handler gives up when its call ends: it may have been part way.
	t.Run("no result", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, memoryStore(t), grpcidem.Config{})
		entered := make(chan struct{})
		f.health.check = func(ctx context.Context, _ *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
			close(entered)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan result)
		go func() { done <- f.check(cctx, "k", "db") }()
		<-entered
		cancel()
		if code := status.Code((<-done).err); code != codes.Canceled {
			t.Fatalf("cancelled call: %v", code)
		}
		if what := f.waitSettled(t); what != "unknown" {
			t.Fatalf("record %s, want unknown", what)
		}
		wantRefusal(t, f.check(ctx, "k", "db").err, codes.Aborted, grpcidem.ReasonOutcomeUnknown)
		wantCalls(t, f, 1)
	})
	// The handler finished despite the cancellation: its answer stands.
	t.Run("result", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, memoryStore(t), grpcidem.Config{})
		entered := make(chan struct{})
		f.health.check = func(ctx context.Context, _ *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
			close(entered)
			<-ctx.Done()
			return &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}, nil
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan result)
		go func() { done <- f.check(cctx, "k", "db") }()
		<-entered
		cancel()
		<-done
		if what := f.waitSettled(t); what != "completed" {
			t.Fatalf("record %s, want completed", what)
		}
		wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
		wantCalls(t, f, 1)
	})
}

func TestTenants(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open newStore) {
		f := newFixture(t, open(t), grpcidem.Config{Tenant: func(ctx context.Context) string {
			// A real server takes this from the verified credentials.
			md, _ := metadata.FromIncomingContext(ctx)
			return strings.Join(md.Get("x-tenant"), "")
		}})
		wantOK(t, f.check(ctx, "k", "db", "x-tenant", "a"), hpb.HealthCheckResponse_SERVING, false)
		// Same key, another tenant, even another request: its own record.
		wantOK(t, f.check(ctx, "k", "cache", "x-tenant", "b"), hpb.HealthCheckResponse_NOT_SERVING, false)
		wantOK(t, f.check(ctx, "k", "db", "x-tenant", "a"), hpb.HealthCheckResponse_SERVING, true)
		wantOK(t, f.check(ctx, "k", "cache", "x-tenant", "b"), hpb.HealthCheckResponse_NOT_SERVING, true)
		wantCalls(t, f, 2)
	})
}

func TestResponseTooLargeToKeep(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{MaxResponseBytes: 4})
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)
	wantRefusal(t, f.check(ctx, "k", "db").err, codes.FailedPrecondition, grpcidem.ReasonResponseNotKept)
	wantCalls(t, f, 1)
}

func TestExecutionInContext(t *testing.T) {
	t.Parallel()
	f := newFixture(t, memoryStore(t), grpcidem.Config{})
	var key string
	var fence int64
	f.health.check = func(ctx context.Context, _ *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		if x := idem.FromContext(ctx); x != nil {
			key, fence = x.Key(), x.Fence()
		}
		return &hpb.HealthCheckResponse{}, nil
	}
	f.check(ctx, `"order-7"`, "db")
	if key != "order-7" || fence <= 0 {
		t.Errorf("handler saw key %q fence %d, want order-7 and a positive fence", key, fence)
	}
}

func TestScope(t *testing.T) {
	t.Parallel()
	st := memoryStore(t)
	f := newFixture(t, st, grpcidem.Config{Tenant: func(context.Context) string { return "acct_1" }})
	f.check(ctx, "k", "db")
	scope := (&idem.Request{Tenant: "acct_1", Method: grpcidem.Method, Route: checkMethod}).Scope()
	rec, err := st.Get(ctx, scope, "k")
	if err != nil {
		t.Fatalf("no record under %q: %v", scope, err)
	}
	if rec.State != store.StateCompleted || rec.Response.Status != 200 {
		t.Errorf("record %s with status %d, want completed with 200", rec.State, rec.Response.Status)
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	engine, err := idem.New(memoryStore(t), idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// Every constructor judges a Config alike.
	constructors := map[string]func(*idem.Engine, grpcidem.Config){
		"unary":   func(e *idem.Engine, cfg grpcidem.Config) { grpcidem.UnaryServerInterceptor(e, cfg) },
		"stream":  func(e *idem.Engine, cfg grpcidem.Config) { grpcidem.StreamServerInterceptor(e, cfg) },
		"options": func(e *idem.Engine, cfg grpcidem.Config) { grpcidem.ServerOptions(e, cfg) },
	}
	for name, c := range map[string]struct {
		engine *idem.Engine
		cfg    grpcidem.Config
	}{
		"negative wait": {engine, grpcidem.Config{Wait: -time.Second}},
		"bad code":      {engine, grpcidem.Config{KeyReusedCode: 99}},
		"no engine":     {nil, grpcidem.Config{}},
	} {
		for kind, build := range constructors {
			t.Run(name+"/"+kind, func(t *testing.T) {
				defer func() {
					if recover() == nil {
						t.Error("no panic")
					}
				}()
				build(c.engine, c.cfg)
			})
		}
	}
}

func TestCommittedInHandlerTransaction(t *testing.T) {
	t.Parallel()
	st := openSQLite(t, filepath.Join(t.TempDir(), "idem.db")).(*sqlite.Store)
	f := newFixture(t, st, grpcidem.Config{})
	f.health.check = func(ctx context.Context, _ *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
		resp := &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}
		answer, err := grpcidem.Encode(resp, nil)
		if err != nil {
			return nil, err
		}
		x := idem.FromContext(ctx)
		err = st.InTx(ctx, func(tx *sql.Tx) error {
			// ... the business write goes here ...
			return st.CompleteTx(ctx, tx, x.CompleteParams(answer))
		})
		if err != nil {
			return nil, err
		}
		idem.FromContext(ctx).Committed()
		return resp, nil
	}
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, false)
	if n := len(f.store.settled); n != 0 {
		t.Errorf("the interceptor recorded the answer again (%s)", <-f.store.settled)
	}
	wantOK(t, f.check(ctx, "k", "db"), hpb.HealthCheckResponse_SERVING, true)
	wantCalls(t, f, 1)
}
