package grpcidem_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/store/memory"
	"google.golang.org/grpc"
	hpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
)

// counter is a Health service that counts how often Check and Watch really
// run.
type counter struct {
	hpb.UnimplementedHealthServer
	runs atomic.Int64
}

func (c *counter) Check(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
	c.runs.Add(1)
	return &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}, nil
}

func (c *counter) Watch(_ *hpb.HealthCheckRequest, stream hpb.Health_WatchServer) error {
	c.runs.Add(1)
	return stream.Send(&hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING})
}

func ExampleUnaryServerInterceptor() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(grpcidem.UnaryServerInterceptor(engine, grpcidem.Config{
		Required: []string{"/grpc.health.v1.Health/Check"},
	})))
	svc := &counter{}
	hpb.RegisterHealthServer(srv, svc)
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := dial(lis)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := hpb.NewHealthClient(conn)

	// A client retries with the same key: the second call is a replay.
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		grpcidem.KeyMetadata, "8e03978e-40d5-43e8-bc93-6894a57f9324")
	for range 2 {
		var header metadata.MD
		resp, err := client.Check(ctx, &hpb.HealthCheckRequest{Service: "payments"}, grpc.Header(&header))
		fmt.Println(resp.GetStatus(), err, header.Get(grpcidem.ReplayedMetadata))
	}
	_, err = client.Check(context.Background(), &hpb.HealthCheckRequest{})
	fmt.Println(err)
	fmt.Println("runs:", svc.runs.Load())
	// Output:
	// SERVING <nil> []
	// SERVING <nil> [true]
	// rpc error: code = InvalidArgument desc = idempotency: this method requires idempotency-key metadata
	// runs: 1
}

func ExampleServerOptions() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpcidem.ServerOptions(engine, grpcidem.Config{
		Required: []string{"/grpc.health.v1.Health/Check"},
	})...)
	svc := &counter{}
	hpb.RegisterHealthServer(srv, svc)
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := dial(lis)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := hpb.NewHealthClient(conn)

	// Unary calls are protected: a retry with the same key is a replay.
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		grpcidem.KeyMetadata, "8e03978e-40d5-43e8-bc93-6894a57f9324")
	for range 2 {
		var header metadata.MD
		resp, err := client.Check(ctx, &hpb.HealthCheckRequest{Service: "payments"}, grpc.Header(&header))
		fmt.Println(resp.GetStatus(), err, header.Get(grpcidem.ReplayedMetadata))
	}
	// A stream cannot be: a streaming call with a key is refused, and one
	// without runs as usual.
	for _, ctx := range []context.Context{ctx, context.Background()} {
		stream, err := client.Watch(ctx, &hpb.HealthCheckRequest{Service: "payments"})
		if err != nil {
			panic(err)
		}
		if resp, err := stream.Recv(); err != nil {
			fmt.Println(err)
		} else {
			fmt.Println(resp.GetStatus())
		}
	}
	fmt.Println("runs:", svc.runs.Load())
	// Output:
	// SERVING <nil> []
	// SERVING <nil> [true]
	// rpc error: code = Unimplemented desc = idempotency: /grpc.health.v1.Health/Watch is a streaming method, which idempotency keys cannot protect; the call was not executed (call it without idempotency-key metadata)
	// SERVING
	// runs: 2
}
