package grpcidem_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	hpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
)

// counter is a Health service that counts how often Check really runs.
type counter struct {
	hpb.UnimplementedHealthServer
	runs atomic.Int64
}

func (c *counter) Check(context.Context, *hpb.HealthCheckRequest) (*hpb.HealthCheckResponse, error) {
	c.runs.Add(1)
	return &hpb.HealthCheckResponse{Status: hpb.HealthCheckResponse_SERVING}, nil
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

	conn, err := grpc.NewClient("passthrough:///example",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
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
