package payments

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/phase"
	"github.com/idem-go/idem/store"
)

// The routes, as the mux matches them: the engine scopes keys by them, and
// the resolver recognises a record's route by them.
const (
	routePayments = "POST /v1/payments"
	routeRefunds  = "POST /v1/refunds"
	routePayment  = "GET /v1/payments/{id}"
)

// Outbox message kinds, and the namespace of the provider keys derived with
// outbox.KeyFor.
const (
	kindCharge = "charge"
	kindRefund = "refund"
)

// The refund's atomic phases, in order; each name becomes the record's
// recovery point when its phase commits.
const (
	phaseRefundCreated    = "refund_created"
	phaseProviderRefunded = "provider_refunded"
	phasePaymentUpdated   = "payment_updated"
)

// requestTimeout bounds the work of one request once started. The work is
// detached from the client's connection: a client that hangs up does not
// stop a transaction or a phase half-way.
const requestTimeout = 30 * time.Second

// txStore is what the service needs of idem's SQL store: the store, its
// transactions and its transactional forms.
type txStore[TTx any] interface {
	store.Store
	phase.Store[TTx]
	CompleteTx(ctx context.Context, tx TTx, p store.CompleteParams) error
}

// app is the service over one database whose transactions are TTx.
type app[TTx any] struct {
	cfg  Config
	log  *slog.Logger
	st   txStore[TTx]
	db   conn[TTx]
	ob   *outbox.Outbox[TTx]
	prov *providerClient

	// payments is the engine of the write-first route, refunds the one of
	// the atomic phases (policy resume); both share the store and metrics.
	payments, refunds *idem.Engine
	maint             *maintenance.Maintainer
	closers           []func() error
}

func newApp[TTx any](ctx context.Context, cfg Config, st txStore[TTx], db conn[TTx], schema []string,
	newOutbox func(outbox.Config) (*outbox.Outbox[TTx], error)) (*app[TTx], error) {
	a := &app[TTx]{
		cfg: cfg, log: cfg.Logger, st: st, db: db,
		prov: &providerClient{
			base: cfg.ProviderURL, timeout: cfg.ProviderTimeout,
			// A transport of its own, whose idle connections Close ends.
			http: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		},
	}
	err := st.InTx(ctx, func(tx TTx) error {
		for _, q := range schema {
			if _, err := db.exec(ctx, tx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("payments: schema: %w", err)
	}

	base, err := idem.New(st, idem.Config{
		// The tenant comes from authentication, never from the body.
		Tenant: func(r *http.Request) string { return accountOf(r.Context()) },
		Lease:  cfg.Lease,
		Wait:   cfg.Wait,
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	a.payments, err = base.With(func(c *idem.Config) {
		// The fingerprint covers what the handler reads, nothing else.
		c.Fields = paymentFields
	})
	if err != nil {
		return nil, err
	}
	a.refunds, err = base.With(func(c *idem.Config) {
		// A retry after a crash continues from the last committed phase.
		c.LeasePolicy = store.LeaseResume
	})
	if err != nil {
		return nil, err
	}
	a.maint, err = maintenance.New(st, maintenance.Config{
		SweepInterval:     cfg.SweepInterval,
		ReconcileInterval: cfg.ReconcileInterval,
		ReconcileBackoff:  cfg.ReconcileInterval,
		Resolver:          maintenance.ResolverFunc(a.resolve),
		Logger:            cfg.Logger,
	})
	if err != nil {
		return nil, err
	}

	backoff := cfg.OutboxBackoff
	a.ob, err = newOutbox(outbox.Config{
		Deliverers: map[string]outbox.Deliverer{kindCharge: outbox.DelivererFunc(a.deliverCharge)},
		OnDead:     a.chargeDead,
		Backoff: func(attempt int) time.Duration {
			return min(time.Duration(attempt)*backoff, time.Minute)
		},
		PollInterval:    cfg.OutboxPollInterval,
		DeliveryTimeout: 2 * cfg.ProviderTimeout,
		Logger:          cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	if err := a.ob.Migrate(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *app[TTx]) routes() http.Handler {
	mux := http.NewServeMux()
	// Authentication runs first, so that the engine has a tenant, and
	// requireJSON before the engine, so that a mislabelled body is refused
	// without spending the key (see requireJSON).
	mux.Handle(routePayments, authenticate(requireJSON(a.payments.Middleware(http.HandlerFunc(a.createPayment)))))
	mux.Handle(routeRefunds, authenticate(requireJSON(a.refunds.Middleware(http.HandlerFunc(a.createRefund)))))
	mux.Handle(routePayment, authenticate(http.HandlerFunc(a.getPayment)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.st.Ping(r.Context()); err != nil {
			problem(w, http.StatusServiceUnavailable, "unavailable", "The database is unreachable", "")
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return mux
}

// paymentRequest is the body of POST /v1/payments.
type paymentRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
}

// paymentFields are the members of a paymentRequest: the payment engine's
// fingerprint covers them, and the handler reads nothing else.
var paymentFields = []string{"amount", "currency", "customer"}

// decodeMembers decodes the JSON object in r into v from the members
// named exactly as in names, ignoring the others. encoding/json alone
// would also fill a field from a member whose name differs only in case
// ("Amount", "AMOUNT"), which a fingerprint over names does not see: two
// bodies with one fingerprint could then be read as two different
// requests.
func decodeMembers(r io.Reader, v any, names []string) error {
	var members map[string]json.RawMessage
	if err := json.NewDecoder(r).Decode(&members); err != nil {
		return err
	}
	maps.DeleteFunc(members, func(name string, _ json.RawMessage) bool { return !slices.Contains(names, name) })
	b, err := json.Marshal(members)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

const maxAmount = 99_999_999

func (in *paymentRequest) invalid() string {
	switch {
	case in.Amount <= 0 || in.Amount > maxAmount:
		return "amount must be a whole number of minor units from 1 to 99999999"
	case !isCurrency(in.Currency):
		return "currency must be three lowercase letters (ISO 4217), e.g. eur"
	case in.Customer == "" || len(in.Customer) > 64:
		return "customer must be 1 to 64 characters"
	}
	return ""
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range []byte(s) {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// createPayment is the write-first handler: it never calls the provider.
// One transaction inserts the pending payment, completes the idempotency
// key with the 201 it is about to send, and enqueues the charge; the
// outbox worker charges the card after the commit. Either all three exist
// or none does, so no crash can charge a card for a payment the service
// does not know, nor lose a payment whose 201 a client received.
func (a *app[TTx]) createPayment(w http.ResponseWriter, r *http.Request) {
	x := idem.FromContext(r.Context())
	var in paymentRequest
	if err := decodeMembers(r.Body, &in, paymentFields); err != nil {
		problem(w, http.StatusBadRequest, "invalid-request", "The request body is not a valid payment", err.Error())
		return
	}
	if msg := in.invalid(); msg != "" {
		problem(w, http.StatusBadRequest, "invalid-request", "The request body is not a valid payment", msg)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), requestTimeout)
	defer cancel()
	if h := a.cfg.hooks.beforePayment; h != nil {
		if err := h(x); err != nil {
			problem(w, http.StatusServiceUnavailable, "unavailable", "The payment could not be recorded", err.Error())
			return
		}
	}

	p := Payment{
		ID: newID("pay_"), Amount: in.Amount, Currency: in.Currency, Customer: in.Customer,
		Status: "pending", Created: a.now().Unix(), account: accountOf(ctx),
		// The provider deduplicates on this key: stable across the
		// client's retries, distinct across tenants and across kinds.
		chargeKey: outbox.KeyFor(x.Scope(), x.Key(), kindCharge),
	}
	resp := paymentResponse(p)
	charge, err := json.Marshal(chargeRequest{Amount: p.Amount, Currency: p.Currency, Customer: p.Customer, Payment: p.ID})
	if err != nil {
		panic(err) // a struct of strings and numbers always marshals
	}
	committing := false
	err = a.st.InTx(ctx, func(tx TTx) error {
		if _, err := a.db.exec(ctx, tx, qInsertPayment, p.ID, p.account, p.Amount, p.Currency, p.Customer,
			p.Status, p.chargeKey, p.Created); err != nil {
			return err
		}
		if err := a.st.CompleteTx(ctx, tx, x.CompleteParams(resp)); err != nil {
			return err
		}
		err := a.ob.EnqueueTx(ctx, tx, outbox.Message{
			Kind: kindCharge, Key: p.chargeKey, Fence: x.Fence(), Payload: charge,
		})
		committing = err == nil
		return err
	})
	switch {
	case err != nil && committing:
		// The commit failed, and a failed commit may still have committed
		// (the connection broke after the server received COMMIT). The
		// record goes to unknown; the reconciler looks for the payment.
		x.Uncertain("commit outcome unknown: " + err.Error())
		a.log.Error("payment commit failed; outcome unknown until reconciled", "key", x.Key(), "err", err)
		problem(w, http.StatusServiceUnavailable, "outcome-unknown",
			"The payment may or may not have been recorded", "retry with the same Idempotency-Key to learn the outcome")
		return
	case err != nil:
		// Nothing was committed: the 503 releases the key and a retry runs
		// the request again.
		a.log.Error("payment transaction failed; nothing recorded", "key", x.Key(), "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The payment could not be recorded", "")
		return
	}
	// The response is stored already: the engine must not store it again.
	x.Committed()
	a.log.Info("payment created", "payment", p.ID, "account", p.account, "amount", p.Amount,
		"currency", p.Currency, "key", x.Key(), "fence", x.Fence())
	writeResponse(w, resp)
}

// paymentResponse is the answer to the request that created p, for the
// handler and for the reconciler alike.
func paymentResponse(p Payment) store.Response {
	body, err := json.Marshal(p.asCreated())
	if err != nil {
		panic(err)
	}
	return store.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/" + p.ID}},
		Body:   append(body, '\n'),
	}
}

// deliverCharge is the outbox's Deliverer: it charges the card with the
// key derived for the payment, then records the provider's answer on the
// payment. It runs at least once per payment; the provider's deduplication
// on the key and the guarded update make every run after the first free of
// effect.
func (a *app[TTx]) deliverCharge(ctx context.Context, msg outbox.Message) (string, error) {
	var req chargeRequest
	if err := json.Unmarshal(msg.Payload, &req); err != nil {
		return "", fmt.Errorf("charge message: %w", err)
	}
	ch, err := a.prov.charge(ctx, msg.Key, msg.Fence, req)
	if err != nil {
		return "", err // retried with backoff, with the same key
	}
	if err := a.recordCharge(ctx, msg.Key, ch); err != nil {
		return "", err
	}
	a.log.Info("payment charged", "payment", req.Payment, "charge", ch.ID, "status", ch.Status)
	return ch.ID, nil
}

// recordCharge stores the provider's charge on the payment whose charge
// key is key: succeeded or failed, with the charge id and the failure
// code. It is the one write of a charge's result, for a delivery and for a
// dead charge that the provider turns out to have made.
func (a *app[TTx]) recordCharge(ctx context.Context, key string, ch providerObject) error {
	err := a.st.InTx(ctx, func(tx TTx) error {
		_, err := a.db.exec(ctx, tx, qChargeResult, key, ch.Status, ch.ID, ch.FailureCode)
		return err
	})
	if err != nil {
		return fmt.Errorf("record charge %s: %w", ch.ID, err)
	}
	return nil
}

// chargeDead is the outbox's OnDead: the last allowed attempt to charge a
// payment failed or crashed. Failing the payment would be wrong: an
// attempt that went unanswered may have charged the card, and a client
// that pays again would then pay twice. The provider is asked for the
// charge made with the payment's key (the lookup of reconciliation); if it
// has one, its answer is recorded as deliverCharge records it. If it has
// none, or cannot be asked, the payment goes to requires_review with the
// reason, for an operator to settle (see Payment.Status). A charge
// recorded later still settles it. The outbox calls it at least once per
// dead charge, again after an error: each of these steps is idempotent.
func (a *app[TTx]) chargeDead(ctx context.Context, msg outbox.Message, lastErr error) error {
	if msg.Kind != kindCharge {
		// Nothing of this service waits on it: an error would only have
		// the outbox call again, for ever.
		a.log.Error("dead outbox message of a kind no payment waits on", "kind", msg.Kind, "key", msg.Key, "err", lastErr)
		return nil
	}
	var req chargeRequest
	_ = json.Unmarshal(msg.Payload, &req) // for the log only: the key finds the payment
	ch, found, err := a.prov.find(ctx, "charges", msg.Key)
	if found {
		if err := a.recordCharge(ctx, msg.Key, ch); err != nil {
			return err
		}
		a.log.Warn("charge dead-lettered, but the provider made it; its answer is recorded", "payment", req.Payment,
			"charge", ch.ID, "status", ch.Status, "key", msg.Key)
		return nil
	}
	reason := "charge dead-lettered: " + lastErr.Error()
	if err != nil {
		reason += "; asking the provider for it failed: " + err.Error()
	} else {
		reason += "; the provider has no charge with its key"
	}
	// The last error may carry a deliverer's stack, or bytes a text
	// column refuses (NUL): kept as a record's LastError is.
	reason = store.ErrorText(reason)
	err = a.st.InTx(ctx, func(tx TTx) error {
		_, err := a.db.exec(ctx, tx, qChargeReview, msg.Key, reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("payment %s to requires_review: %w", req.Payment, err)
	}
	a.log.Error("payment requires review: its charge was dead-lettered and the provider did not confirm it",
		"payment", req.Payment, "key", msg.Key, "reason", reason)
	return nil
}

// refundBody is the body of POST /v1/refunds.
type refundBody struct {
	Payment string `json:"payment"`
	Amount  int64  `json:"amount"`
}

// refusal is a definite answer to a refund that was not made: a 4xx.
type refusal struct {
	status              int
	slug, title, detail string
}

func (r *refusal) Error() string { return r.title + ": " + r.detail }

// createRefund is the atomic-phases handler (Brandur Leach's pattern):
// three phases, each committing its local writes with its recovery point,
// the provider call alone in the middle one. After a crash, a retry takes
// the lease over (policy resume) and continues after the last committed
// phase: a refund is created once, sent to the provider once, and
// credited to its payment once.
func (a *app[TTx]) createRefund(w http.ResponseWriter, r *http.Request) {
	x := idem.FromContext(r.Context())
	var in refundBody
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		problem(w, http.StatusBadRequest, "invalid-request", "The request body is not a valid refund", err.Error())
		return
	}
	if in.Payment == "" || in.Amount <= 0 || in.Amount > maxAmount {
		problem(w, http.StatusBadRequest, "invalid-request", "The request body is not a valid refund",
			"payment is required and amount must be a whole number of minor units from 1 to 99999999")
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), requestTimeout)
	defer cancel()
	account := accountOf(ctx)
	key := outbox.KeyFor(x.Scope(), x.Key(), kindRefund)
	if x.Resumed() {
		a.log.Warn("refund resumed after its holder died", "key", x.Key(), "recovery_point", x.RecoveryPoint(),
			"fence", x.Fence())
	}
	hook := func(x *idem.Execution, phase string) error {
		if h := a.cfg.hooks.beforePhase; h != nil {
			return h(x, phase)
		}
		return nil
	}

	err := phase.Run(ctx, x, a.st,
		phase.Phase[TTx]{Name: phaseRefundCreated, Run: func(ctx context.Context, tx TTx) error {
			if err := hook(x, phaseRefundCreated); err != nil {
				return err
			}
			return a.insertRefund(ctx, tx, account, in, key)
		}},
		phase.Phase[TTx]{Name: phaseProviderRefunded, Run: func(ctx context.Context, tx TTx) error {
			if err := hook(x, phaseProviderRefunded); err != nil {
				return err
			}
			return a.refundAtProvider(ctx, tx, key, x.Fence())
		}},
		phase.Phase[TTx]{Name: phasePaymentUpdated, Run: func(ctx context.Context, tx TTx) error {
			if err := hook(x, phasePaymentUpdated); err != nil {
				return err
			}
			return applyRefund(ctx, a.db, tx, key)
		}},
	)
	var (
		ref *refusal
		pe  *ProviderError
	)
	switch {
	case err == nil:
	case errors.As(err, &ref):
		// Phase one refused: nothing was written, the 4xx is the answer.
		problem(w, ref.status, ref.slug, ref.title, ref.detail)
		return
	case errors.Is(err, errNoAnswer):
		// The provider may have refunded: never run this again blindly.
		// The record goes to unknown and the reconciler asks the provider.
		x.Uncertain("refund call unanswered: " + err.Error())
		a.log.Warn("refund outcome unknown; left to reconciliation", "key", x.Key(), "err", err)
		problem(w, http.StatusGatewayTimeout, "provider-timeout",
			"The card provider did not answer; the refund may have happened",
			"retry with the same Idempotency-Key: you get 409 until the outcome is reconciled, then the refund")
		return
	case errors.As(err, &pe), errors.Is(err, errNotSent):
		// The provider answered that it did nothing (or was never
		// reached): the 502 releases the key, and a retry resumes at the
		// provider call with the same provider key.
		a.log.Warn("refund failed at the provider; a retry resumes", "key", x.Key(), "err", err)
		problem(w, http.StatusBadGateway, "provider-unavailable", "The card provider refused the call", "retry with the same Idempotency-Key")
		return
	default:
		a.log.Error("refund failed; a retry resumes after the last committed phase", "key", x.Key(),
			"recovery_point", x.RecoveryPoint(), "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The refund could not be completed", "retry with the same Idempotency-Key")
		return
	}
	f, err := scanRefund(a.db.read(ctx, qRefundByKey, key))
	if err != nil {
		// Every phase committed: the 503 releases the key, and a retry
		// resumes after the last phase with nothing left but this answer.
		problem(w, http.StatusServiceUnavailable, "unavailable", "The refund could not be read back", "")
		return
	}
	a.log.Info("refund created", "refund", f.ID, "payment", f.Payment, "amount", f.Amount, "status", f.Status,
		"key", x.Key(), "fence", x.Fence())
	writeResponse(w, refundResponse(f))
}

// insertRefund is phase refund_created: check the payment is the
// caller's and has enough left to refund, and insert the pending refund.
func (a *app[TTx]) insertRefund(ctx context.Context, tx TTx, account string, in refundBody, key string) error {
	p, err := scanPayment(a.db.queryRow(ctx, tx, a.db.paymentForRefund(), in.Payment, account))
	if isNotFound(err) {
		return &refusal{http.StatusNotFound, "payment-not-found", "No such payment", in.Payment}
	}
	if err != nil {
		return err
	}
	if p.Status != "succeeded" {
		return &refusal{http.StatusUnprocessableEntity, "payment-not-refundable", "The payment cannot be refunded",
			"its status is " + p.Status}
	}
	var held int64
	if err := a.db.queryRow(ctx, tx, qRefundsHeld, p.ID).Scan(&held); err != nil {
		return err
	}
	if in.Amount > p.Amount-held {
		return &refusal{http.StatusUnprocessableEntity, "amount-too-large", "The refund exceeds what is left of the payment",
			fmt.Sprintf("at most %d can still be refunded", p.Amount-held)}
	}
	_, err = a.db.exec(ctx, tx, qInsertRefund, newID("re_"), account, p.ID, in.Amount, key, a.now().Unix())
	return err
}

// refundAtProvider is phase provider_refunded: its one foreign call, with
// the refund's provider key and the execution's fence, and the local write
// of the answer. The refund is read back from the database because the
// phase that created it may have run in a process that died since.
//
// The call runs inside the phase's transaction, as RunPhases has it. On
// SQLite that transaction holds the database's only writer for as long as
// the provider takes (other writes wait), which ProviderTimeout bounds.
func (a *app[TTx]) refundAtProvider(ctx context.Context, tx TTx, key string, fence int64) error {
	f, err := scanRefund(a.db.queryRow(ctx, tx, qRefundByKey, key))
	if err != nil {
		return err
	}
	p, err := scanPayment(a.db.queryRow(ctx, tx, qPaymentByID, f.Payment))
	if err != nil {
		return err
	}
	obj, err := a.prov.refund(ctx, key, fence, refundRequest{Charge: p.Charge, Amount: f.Amount})
	var pe *ProviderError
	if errors.As(err, &pe) && (pe.Status == http.StatusUnprocessableEntity || pe.Status == http.StatusNotFound) {
		// A refusal on the merits: nothing was refunded and nothing will
		// be; the refund is answered as failed.
		obj, err = providerObject{Status: "failed", FailureCode: pe.Code}, nil
	}
	if err != nil {
		return err
	}
	return recordRefund(ctx, a.db, tx, key, obj)
}

func refundResponse(f Refund) store.Response {
	body, err := json.Marshal(f)
	if err != nil {
		panic(err)
	}
	return store.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   append(body, '\n'),
	}
}

// getPayment reads a payment's current state. GET is not protected by the
// engine: it changes nothing.
func (a *app[TTx]) getPayment(w http.ResponseWriter, r *http.Request) {
	p, err := scanPayment(a.db.read(r.Context(), qPayment, r.PathValue("id"), accountOf(r.Context())))
	switch {
	case isNotFound(err):
		problem(w, http.StatusNotFound, "payment-not-found", "No such payment", r.PathValue("id"))
	case err != nil:
		a.log.Error("payment read failed", "err", err)
		problem(w, http.StatusServiceUnavailable, "unavailable", "The payment could not be read", "")
	default:
		writeJSON(w, http.StatusOK, p)
	}
}

func (a *app[TTx]) now() time.Time {
	if a.cfg.Clock != nil {
		return a.cfg.Clock()
	}
	return time.Now()
}

func (a *app[TTx]) start(ctx context.Context) error {
	if err := a.ob.Start(ctx); err != nil {
		return err
	}
	if !a.cfg.hooks.manualMaintenance {
		return a.maint.Start(ctx)
	}
	return nil
}

func (a *app[TTx]) stop(ctx context.Context) error {
	return errors.Join(a.maint.Stop(ctx), a.ob.Stop(ctx))
}

func (a *app[TTx]) close() error {
	a.prov.http.CloseIdleConnections()
	var errs []error
	for _, c := range a.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

func (a *app[TTx]) maintainer() *maintenance.Maintainer { return a.maint }
func (a *app[TTx]) store() store.Store                  { return a.st }

func (a *app[TTx]) refundCount(ctx context.Context, paymentID string) (int, error) {
	var n int
	err := a.db.read(ctx, qCountRefunds, paymentID).Scan(&n)
	return n, err
}

// writeResponse writes a response exactly as it was stored.
func writeResponse(w http.ResponseWriter, resp store.Response) {
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body) //nolint:errcheck // the client may be gone; the record keeps the answer
}

// newID returns prefix and 16 random hex digits.
func newID(prefix string) string {
	var b [8]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
