package maintenance_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// worker stands for another background worker of the instance, such as an
// outbox.Outbox.
type worker struct{}

func (worker) Start(context.Context) error { fmt.Println("worker started"); return nil }
func (worker) Stop(context.Context) error  { fmt.Println("worker stopped"); return nil }

// Every instance of a service runs the background services over the store
// its engine uses.
func ExampleNew() {
	ctx := context.Background()
	st := memory.New(memory.Config{})
	askProvider := func(ctx context.Context, rec store.Record) (maintenance.Resolution, error) {
		// Ask the payment provider what became of the request with key
		// rec.Key (and fence rec.Fence).
		return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
	}
	ob := worker{}

	m, err := maintenance.New(st, maintenance.Config{
		Resolver: maintenance.ResolverFunc(askProvider), // settles unknown outcomes
		Services: []maintenance.Service{ob},             // e.g. the outbox worker: one Start and Stop for all background work
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer m.Stop(context.Background())
	// Output:
	// worker started
	// worker stopped
}

// A webhook from the provider (or an operator) settles a request whose
// outcome was unknown: every retry then replays the provider's answer.
func ExampleMaintainer_Settle() {
	ctx := context.Background()
	st := memory.New(memory.Config{})
	engine, _ := idem.New(st, idem.Config{})
	m, _ := maintenance.New(st, maintenance.Config{TTL: engine.Config().TTL})

	req := idem.Request{Method: "POST", Route: "/v1/charges", Key: "order-7", Fingerprint: "fp"}
	d, _ := engine.Begin(ctx, req)
	d.Exec.MarkUnknown(ctx, "gateway timeout") // the charge may or may not have happened
	d, _ = engine.Begin(ctx, req)
	fmt.Println("retry:", d.Verdict)

	// The provider's webhook: the charge went through.
	err := m.Settle(ctx, req.Scope(), req.Key, maintenance.Resolution{
		Outcome: maintenance.Happened,
		Response: &store.Response{Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_7"}`)},
	})
	if err != nil {
		log.Fatal(err)
	}
	d, _ = engine.Begin(ctx, req)
	fmt.Println("retry:", d.Verdict, d.Record.Response.Status, string(d.Record.Response.Body))
	// Output:
	// retry: unknown
	// retry: replay 201 {"id":"ch_7"}
}
