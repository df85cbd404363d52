package payments

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Provider is a fake card provider, served over HTTP so that the service
// reaches it the way it would reach a real one: through a network call that
// can fail, time out, or succeed without the caller hearing about it.
//
// It honours Idempotency-Key as real providers do: the first call with a
// key has the effect, every later call with the same key and the same
// parameters gets the same object back (200, Idempotent-Replayed: true) and
// has no effect, and the same key with other parameters is refused (422).
// It keeps the highest Idempotency-Fence seen per key and refuses a call
// with a lower one (409), so a zombie that lost its lease cannot act.
//
// Endpoints:
//
//	POST /v1/charges   {"amount":1000,"currency":"eur","customer":"cus_1","payment":"pay_..."}
//	POST /v1/refunds   {"charge":"ch_...","amount":500}
//	GET  /v1/charges?idempotency_key=K    the charge made with key K, or 404
//	GET  /v1/refunds?idempotency_key=K    the refund made with key K, or 404
//	POST /admin/faults {"fail":2,"timeout":1,"latency":"2s"}   inject failures
//	GET  /admin/stats  calls received and effects made
//
// A charge for customer "cus_declined" is declined: it is created with
// status "failed" and failure_code "card_declined".
type Provider struct {
	mu      sync.Mutex
	objects map[string]*providerObject // by kind + " " + idempotency key
	byID    map[string]*providerObject // charges by id, for refunds
	fences  map[string]int64           // highest fence seen per key
	seq     int
	faults  Faults
	latency time.Duration
	stats   ProviderStats
	closing chan struct{}
	closed  sync.Once
	mux     *http.ServeMux
}

// Faults are failures the provider injects into its next POST calls.
type Faults struct {
	// Fail: the next Fail calls answer 503 without any effect.
	Fail int `json:"fail"`
	// Timeout: the next Timeout calls take effect and then do not answer
	// until the caller gives up: the caller cannot know what happened.
	Timeout int `json:"timeout"`
	// Latency delays every call, e.g. "2s". Empty or "0s" for none.
	Latency string `json:"latency,omitempty"`
}

// ProviderStats counts what the provider received and did.
type ProviderStats struct {
	Calls    int `json:"calls"`     // POST calls received
	Charges  int `json:"charges"`   // charges created: the effects that cost money
	Refunds  int `json:"refunds"`   // refunds created
	Replayed int `json:"replayed"`  // calls answered with the object of an earlier call with the same key
	Failed   int `json:"failed"`    // calls refused by an injected failure
	TimedOut int `json:"timed_out"` // calls held by an injected timeout
	Stale    int `json:"stale"`     // calls refused for a stale fence
}

// providerObject is a charge or a refund, as the provider answers it.
type providerObject struct {
	ID          string `json:"id"`
	Object      string `json:"object"` // "charge" or "refund"
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency,omitempty"`
	Customer    string `json:"customer,omitempty"`
	Charge      string `json:"charge,omitempty"` // a refund's charge
	Status      string `json:"status"`           // "succeeded" or "failed"
	FailureCode string `json:"failure_code,omitempty"`
	Refunded    int64  `json:"amount_refunded,omitempty"`

	params string // the request's parameters, to refuse a reused key
}

// chargeRequest is the body of POST /v1/charges.
type chargeRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
	Payment  string `json:"payment"`
}

// refundRequest is the body of POST /v1/refunds.
type refundRequest struct {
	Charge string `json:"charge"`
	Amount int64  `json:"amount"`
}

// hangLimit bounds an injected timeout, for callers that never give up.
const hangLimit = time.Minute

// NewProvider returns a provider with no object and no fault.
func NewProvider() *Provider {
	p := &Provider{
		objects: map[string]*providerObject{},
		byID:    map[string]*providerObject{},
		fences:  map[string]int64{},
		closing: make(chan struct{}),
		mux:     http.NewServeMux(),
	}
	p.mux.HandleFunc("POST /v1/charges", p.createCharge)
	p.mux.HandleFunc("POST /v1/refunds", p.createRefund)
	p.mux.HandleFunc("GET /v1/charges", func(w http.ResponseWriter, r *http.Request) { p.find(w, r, "charge") })
	p.mux.HandleFunc("GET /v1/refunds", func(w http.ResponseWriter, r *http.Request) { p.find(w, r, "refund") })
	p.mux.HandleFunc("POST /admin/faults", p.setFaults)
	p.mux.HandleFunc("GET /admin/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.Stats())
	})
	return p
}

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

// Close releases the calls held by an injected timeout, so that a server
// shutting down does not wait for them.
func (p *Provider) Close() { p.closed.Do(func() { close(p.closing) }) }

// Stats returns the counters.
func (p *Provider) Stats() ProviderStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// SetFaults replaces the injected faults.
func (p *Provider) SetFaults(f Faults) error {
	var latency time.Duration
	if f.Latency != "" {
		d, err := time.ParseDuration(f.Latency)
		if err != nil || d < 0 {
			return fmt.Errorf("latency %q is not a duration", f.Latency)
		}
		latency = d
	}
	if f.Fail < 0 || f.Timeout < 0 {
		return fmt.Errorf("fail and timeout must not be negative")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults, p.latency = f, latency
	return nil
}

func (p *Provider) setFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
		providerError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	if err := p.SetFaults(f); err != nil {
		providerError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, f)
}

// call is what every POST shares: the key and fence checks, the injected
// faults, the replay of an earlier call. create builds the new object under
// the provider's lock, or refuses with a status, a code and a message.
func (p *Provider) call(w http.ResponseWriter, r *http.Request, kind, params string,
	create func() (*providerObject, int, string, string)) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		providerError(w, http.StatusBadRequest, "missing_idempotency_key", "Idempotency-Key is required")
		return
	}
	var fence int64
	if f := r.Header.Get("Idempotency-Fence"); f != "" {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 1 {
			providerError(w, http.StatusBadRequest, "invalid_fence", "Idempotency-Fence must be a positive integer")
			return
		}
		fence = n
	}

	p.mu.Lock()
	latency := p.latency
	p.mu.Unlock()
	if latency > 0 && !p.pause(r, latency) {
		return
	}

	p.mu.Lock()
	p.stats.Calls++
	if p.faults.Fail > 0 {
		p.faults.Fail--
		p.stats.Failed++
		p.mu.Unlock()
		providerError(w, http.StatusServiceUnavailable, "unavailable", "injected failure: nothing was done")
		return
	}
	id := kind + " " + key
	if fence < p.fences[id] {
		p.stats.Stale++
		p.mu.Unlock()
		providerError(w, http.StatusConflict, "stale_fence",
			fmt.Sprintf("fence %d is older than fence %d already seen for this key", fence, p.fences[id]))
		return
	}
	p.fences[id] = max(p.fences[id], fence)
	if obj := p.objects[id]; obj != nil {
		if obj.params != params {
			p.mu.Unlock()
			providerError(w, http.StatusUnprocessableEntity, "idempotency_key_reused",
				"this Idempotency-Key was used with other parameters")
			return
		}
		p.stats.Replayed++
		out := *obj
		p.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, out)
		return
	}
	obj, status, code, msg := create()
	if obj == nil {
		p.mu.Unlock()
		providerError(w, status, code, msg)
		return
	}
	obj.params = params
	p.objects[id] = obj
	hang := p.faults.Timeout > 0
	if hang {
		p.faults.Timeout--
		p.stats.TimedOut++
	}
	out := *obj
	p.mu.Unlock()

	if hang {
		// The effect is made; the answer never reaches a caller with a
		// deadline. This is the case only reconciliation can settle.
		if !p.pause(r, hangLimit) {
			return
		}
	}
	writeJSON(w, http.StatusCreated, out)
}

// pause waits d; it reports false if the caller left or the provider is
// closing.
func (p *Provider) pause(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
	case <-p.closing:
	}
	return false
}

func (p *Provider) createCharge(w http.ResponseWriter, r *http.Request) {
	var req chargeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		providerError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	params := fmt.Sprintf("%d %q %q %q", req.Amount, req.Currency, req.Customer, req.Payment)
	p.call(w, r, "charge", params, func() (*providerObject, int, string, string) {
		if req.Amount <= 0 || req.Currency == "" || req.Customer == "" {
			return nil, http.StatusBadRequest, "invalid_request", "amount, currency and customer are required"
		}
		p.seq++
		obj := &providerObject{ID: fmt.Sprintf("ch_%06d", p.seq), Object: "charge", Amount: req.Amount,
			Currency: req.Currency, Customer: req.Customer, Status: "succeeded"}
		if req.Customer == "cus_declined" {
			obj.Status, obj.FailureCode = "failed", "card_declined"
		}
		p.byID[obj.ID] = obj
		p.stats.Charges++
		return obj, 0, "", ""
	})
}

func (p *Provider) createRefund(w http.ResponseWriter, r *http.Request) {
	var req refundRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		providerError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	params := fmt.Sprintf("%q %d", req.Charge, req.Amount)
	p.call(w, r, "refund", params, func() (*providerObject, int, string, string) {
		ch := p.byID[req.Charge]
		switch {
		case ch == nil:
			return nil, http.StatusNotFound, "no_such_charge", "no charge " + req.Charge
		case ch.Status != "succeeded":
			return nil, http.StatusUnprocessableEntity, "charge_not_refundable", "the charge did not succeed"
		case req.Amount <= 0 || req.Amount > ch.Amount-ch.Refunded:
			return nil, http.StatusUnprocessableEntity, "amount_too_large", "the amount exceeds what is left of the charge"
		}
		ch.Refunded += req.Amount
		p.seq++
		p.stats.Refunds++
		return &providerObject{ID: fmt.Sprintf("re_%06d", p.seq), Object: "refund", Amount: req.Amount,
			Charge: ch.ID, Status: "succeeded"}, 0, "", ""
	})
}

// find answers the object made with an idempotency key: what a
// reconciler asks after a call whose answer it never got.
func (p *Provider) find(w http.ResponseWriter, r *http.Request, kind string) {
	key := r.URL.Query().Get("idempotency_key")
	p.mu.Lock()
	obj := p.objects[kind+" "+key]
	var out providerObject
	if obj != nil {
		out = *obj
	}
	p.mu.Unlock()
	if obj == nil {
		providerError(w, http.StatusNotFound, "not_found", "no "+kind+" with this idempotency key")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func providerError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n')) //nolint:errcheck // the caller may be gone
}
