package compat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v85"
)

// stripe-go through the relay that loses answers, on the profiles it
// meets: stripe (its own dialect: a key in use is 429 lock_timeout, the
// one Stripe-shaped error it retries) and ietf (problem+json bodies, which
// it does not parse as Stripe errors and so retries). The proxy runs with
// its default flags but the profile, and in the full run (make compat)
// also with --wait 0, where every duplicate in flight is refused and must
// be retried.
func TestStripeGo(t *testing.T) {
	mock := stripeMock(t)
	for _, profile := range []string{"stripe", "ietf"} {
		for _, wait := range []string{"default", "0"} {
			if wait != "default" && !full() {
				continue
			}
			t.Run(profile+"/wait="+wait, func(t *testing.T) {
				args := []string{"--profile", profile}
				if wait != "default" {
					args = append(args, "--wait", wait)
				}
				stores(t, func(t *testing.T, dsn string) {
					s := newStack(t, mock, dsn, 20*time.Millisecond, args...)
					outcomes := stripeGoCalls(t, s.relayURL, calls(t, 80))
					s.verify(t, outcomes)
					// A replay names its original request, on the
					// stripe profile, as Stripe's API does.
					var replays int
					for _, o := range outcomes {
						if !o.replayed {
							continue
						}
						replays++
						if want := map[string]string{"stripe": o.requestID}[profile]; o.original != want {
							t.Errorf("%s: a replay with Original-Request %q, want %q", o.call, o.original, want)
						}
					}
					// The stripe profile echoes the key, which stripe-go
					// hands its caller (verify compared it with the
					// execution's).
					for _, o := range outcomes {
						if profile == "stripe" && o.err == "" && o.key == "" {
							t.Errorf("%s: no Idempotency-Key in stripe-go's LastResponse", o.call)
						}
					}
					t.Logf("%d calls ended with a replay", replays)
				})
			})
		}
	}
}

// stripeGoCalls makes n customer creations with stripe-go on 16
// goroutines, each call under the key stripe-go makes for it.
func stripeGoCalls(t *testing.T, base string, n int) []outcome {
	t.Helper()
	sc := stripe.NewClient("sk_test_compat", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(base),
		MaxNetworkRetries: stripe.Int64(5),
		HTTPClient:        &http.Client{Timeout: time.Minute},
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
	return run(n, func(i int) outcome {
		call := fmt.Sprintf("call-%d", i)
		c, err := sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{Description: stripe.String(call)})
		switch {
		case err != nil:
			var se *stripe.Error
			if errors.As(err, &se) {
				return outcome{call: call, err: fmt.Sprintf("%d %s %s: %s", se.HTTPStatusCode, se.Type, se.Code, se.Msg)}
			}
			return outcome{call: call, err: err.Error()}
		case c.ID == "":
			return outcome{call: call, err: "an answer without an id: " + string(c.LastResponse.RawJSON)}
		}
		h := c.LastResponse.Header
		return outcome{call: call, id: c.ID, requestID: c.LastResponse.RequestID, original: h.Get("Original-Request"),
			replayed: h.Get("Idempotent-Replayed") == "true", key: c.LastResponse.IdempotencyKey}
	})
}
