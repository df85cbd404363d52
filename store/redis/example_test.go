package redis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/redis"
)

// Open a store on one Redis node (use redis+cluster://h1:p1,h2:p2 for a
// Redis Cluster), reserve a key and complete it.
func ExampleOpen() {
	ctx := context.Background()
	s, err := redis.Open(ctx, "redis://127.0.0.1:6379/0", redis.Config{Prefix: "payments:"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	res, err := s.Reserve(ctx, store.ReserveParams{
		Scope: "tenant-42 POST /charges", Key: "order-1001", Fingerprint: "sha256:...",
		Lease: 30 * time.Second, TTL: 24 * time.Hour, LeasePolicy: store.LeaseUnknown,
	})
	if err != nil {
		log.Fatal(err)
	}
	if res.Outcome.Acquired() {
		// ... run the request, then store its response.
		err = s.Complete(ctx, store.CompleteParams{
			FenceParams: store.FenceParams{Scope: res.Record.Scope, Key: res.Record.Key, Fence: res.Record.Fence},
			Response:    store.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)},
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(res.Outcome)
}
