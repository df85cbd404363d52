package maintenance

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

// op names a store operation of the services in metrics and errors.
type op int

const (
	opSweep op = iota
	opReap
	opListUnknown
	opResolve
	opDefer
	opExpirePending
	numOps
)

// opNames sit beside the engine's store operations under the same op
// attribute: an application that runs both exports one set of metrics.
var opNames = [numOps]string{"sweep", "reap", "list_unknown", "resolve", "defer", "expire_pending"}

func (o op) String() string { return opNames[o] }

// observer reports to the configured idem.Observer, if any.
type observer struct{ o idem.Observer }

func newObserver(o idem.Observer) *observer { return &observer{o: o} }

func (o *observer) storeOp(ctx context.Context, op op, d time.Duration, failed bool) {
	if o.o != nil {
		o.o.StoreCall(ctx, opNames[op], d, failed)
	}
}

// count reports n events named event (zombies_swept, ttl_pruned,
// abandoned, reconcile_*); none when n is 0.
func (o *observer) count(ctx context.Context, event string, n int) {
	if o.o != nil && n > 0 {
		o.o.Event(ctx, event, int64(n))
	}
}
