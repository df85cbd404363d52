package payments

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store"
)

// resolve is the maintainer's Resolver: it settles a record whose outcome
// is unknown by looking for what the request would have left behind,
// under the provider key derived from the record (outbox.KeyFor of its
// scope and key), locally and at the provider.
func (a *app[TTx]) resolve(ctx context.Context, rec store.Record) (maintenance.Resolution, error) {
	_, method, route, _ := idem.ParseScope(rec.Scope)
	switch method + " " + route {
	case routePayments:
		return a.resolvePayment(ctx, rec)
	case routeRefunds:
		return a.resolveRefund(ctx, rec)
	}
	return maintenance.Resolution{}, fmt.Errorf("no resolver for the route of scope %q", rec.Scope)
}

// resolvePayment settles a payment request that died before its answer,
// or whose commit failed. The payment, the key's completion and the charge
// message commit together, so a payment row means the request happened;
// without one nothing was committed and no charge was enqueued, which the
// provider confirms.
func (a *app[TTx]) resolvePayment(ctx context.Context, rec store.Record) (maintenance.Resolution, error) {
	key := outbox.KeyFor(rec.Scope, rec.Key, kindCharge)
	p, err := scanPayment(a.db.read(ctx, qPaymentByChargeKey, key))
	switch {
	case err == nil:
		resp := paymentResponse(p)
		return maintenance.Resolution{Outcome: maintenance.Happened, Response: &resp}, nil
	case !isNotFound(err):
		return maintenance.Resolution{}, err
	}
	ch, found, err := a.prov.find(ctx, "charges", key)
	if err != nil {
		return maintenance.Resolution{}, err
	}
	if found {
		// A charge without a payment: the ledgers disagree. Leave it to
		// an operator (it is dead-lettered after the last attempt).
		a.log.Error("the provider has a charge for a payment this service never recorded",
			"key", rec.Key, "charge", ch.ID)
		return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
	}
	a.log.Info("payment never happened; its key is released", "key", rec.Key)
	return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
}

// resolveRefund settles a refund whose provider call went unanswered. If
// the provider made the refund, the resolver finishes what the phases
// would have done (records the provider's refund, credits the payment) and
// answers the 201 they would have; if not, the key is released and a retry
// resumes at the provider call.
func (a *app[TTx]) resolveRefund(ctx context.Context, rec store.Record) (maintenance.Resolution, error) {
	key := outbox.KeyFor(rec.Scope, rec.Key, kindRefund)
	obj, found, err := a.prov.find(ctx, "refunds", key)
	if err != nil {
		return maintenance.Resolution{}, err
	}
	if !found {
		a.log.Info("refund never reached the provider; its key is released", "key", rec.Key,
			"recovery_point", rec.RecoveryPoint)
		return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
	}
	var f Refund
	err = a.st.InTx(ctx, func(tx TTx) error {
		if err := recordRefund(ctx, a.db, tx, key, obj); err != nil {
			return err
		}
		if err := applyRefund(ctx, a.db, tx, key); err != nil {
			return err
		}
		var err error
		f, err = scanRefund(a.db.queryRow(ctx, tx, qRefundByKey, key))
		return err
	})
	if isNotFound(err) {
		// The provider call happens only after the refund's row commits.
		a.log.Error("the provider has a refund this service never recorded", "key", rec.Key, "refund", obj.ID)
		return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
	}
	if err != nil {
		return maintenance.Resolution{}, err
	}
	a.log.Info("refund happened at the provider; finished by reconciliation", "refund", f.ID, "key", rec.Key)
	resp := refundResponse(f)
	return maintenance.Resolution{Outcome: maintenance.Happened, Response: &resp}, nil
}
