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
	m, _ := maintenance.New(st, maintenance.Config{TTL: engine.TTL()})

	call := idem.Call{Method: "POST", Route: "/v1/charges", Target: "/v1/charges", Keys: []string{"order-7"}}
	charge := func(ctx context.Context) idem.Result {
		idem.FromContext(ctx).Uncertain("gateway timeout") // the charge may or may not have happened
		return idem.Result{Response: store.Response{Status: http.StatusGatewayTimeout}}
	}
	engine.Run(ctx, call, charge)
	fmt.Println("retry:", engine.Run(ctx, call, charge).Verdict)

	// The provider's webhook: the charge went through. It is about the
	// execution with this fence, and settles nothing once the record ran
	// again.
	scope := (&idem.Request{Method: call.Method, Route: call.Route}).Scope()
	rec, _ := st.Get(ctx, scope, "order-7")
	err := m.Settle(ctx, scope, "order-7", rec.Fence, maintenance.Resolution{
		Outcome: maintenance.Happened,
		Response: &store.Response{Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_7"}`)},
	})
	if err != nil {
		log.Fatal(err)
	}
	a := engine.Run(ctx, call, charge)
	fmt.Println("retry:", a.Verdict, a.Response.Status, string(a.Response.Body))
	// Output:
	// retry: unknown
	// retry: replayed 201 {"id":"ch_7"}
}
