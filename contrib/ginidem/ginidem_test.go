package ginidem_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/ginidem"
	"github.com/idem-go/idem/internal/testkit/adaptertest"
	"github.com/idem-go/idem/store/memory"
)

func init() { gin.SetMode(gin.ReleaseMode) }

// app is an ordinary gin application: recovery outermost, the middleware
// on a group and on single routes, handlers in gin's own idioms.
func app(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard))
	mw := ginidem.Middleware(e)

	d := r.Group("/d", mw)
	d.POST("/charges", func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"op": "charge", "n": h.Count("/d/charges")})
	})
	d.POST("/refunds", func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"op": "refund", "n": h.Count("/d/refunds")})
	})

	p := r.Group("/", mw)
	p.POST("/orders/:id", func(c *gin.Context) {
		c.JSON(http.StatusOK, gin.H{"order": c.Param("id"), "n": h.Count("/orders/{id}")})
	})
	p.POST("/fail/:status", func(c *gin.Context) {
		n := h.Count("/fail/{status}")
		status, _ := strconv.Atoi(c.Param("status"))
		c.AbortWithStatusJSON(status, gin.H{"error": "refused", "n": n})
	})
	p.POST("/panic", func(c *gin.Context) {
		h.Count("/panic")
		panic("boom")
	})
	p.POST("/slow", func(c *gin.Context) {
		n := h.Count("/slow")
		h.Block()
		c.JSON(http.StatusOK, gin.H{"op": "slow", "n": n})
	})
	p.POST("/nocontent", func(c *gin.Context) {
		h.Count("/nocontent")
		c.Status(http.StatusNoContent)
	})
	return r
}

func TestAdapter(t *testing.T) { adaptertest.Run(t, app) }

// A handler under a key that asks gin's writer to hijack the connection is
// refused with idem.ErrHijack (the engine could neither record nor replay
// what it would send on it), and can still answer.
func TestHijackIsRefused(t *testing.T) {
	e, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/upgrade", ginidem.Middleware(e), func(c *gin.Context) {
		_, _, err := c.Writer.Hijack()
		if !errors.Is(err, idem.ErrHijack) {
			t.Errorf("hijack under a key: %v, want idem.ErrHijack", err)
		}
		c.String(http.StatusCreated, "answered")
	})
	for _, replayed := range []string{"", "true"} {
		req := httptest.NewRequest("POST", "/upgrade", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"g1"`)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code != http.StatusCreated || w.Body.String() != "answered" || w.Header().Get("Idempotent-Replayed") != replayed {
			t.Fatalf("%d %q %v", w.Code, w.Body, w.Header())
		}
	}
}

// gin's idiom for errors: a handler attaches its error with c.Error and
// writes nothing; middleware renders c.Errors once the chain returned.
// Placed before this middleware, it writes that answer outside the
// protocol, where it cannot be recorded: the record goes to outcome
// unknown, and a retry gets 409, not an empty 200 replayed as if it were
// the answer the first client got. Placed after it, its answer is written
// inside the protocol and recorded: the 402 is replayed.
func TestErrorRenderedByMiddleware(t *testing.T) {
	render := func(c *gin.Context) {
		c.Next()
		if len(c.Errors) > 0 {
			c.JSON(http.StatusPaymentRequired, gin.H{"error": c.Errors.Last().Error()})
		}
	}
	for name, inside := range map[string]bool{"before the middleware": false, "after the middleware": true} {
		t.Run(name, func(t *testing.T) {
			app := adaptertest.Start(t, func(t *testing.T, e *idem.Engine, h *adaptertest.Hooks) http.Handler {
				r := gin.New()
				if !inside {
					r.Use(render)
				}
				v1 := r.Group("/v1", ginidem.Middleware(e))
				if inside {
					v1.Use(render)
				}
				v1.POST("/charges", func(c *gin.Context) {
					h.Count("/v1/charges")
					c.Error(errors.New("card declined"))
				})
				return r
			})
			first := app.Post(t, "/v1/charges", "k", `{}`)
			again := app.Post(t, "/v1/charges", "k", `{}`)
			if first.Status != http.StatusPaymentRequired || string(first.Body) != `{"error":"card declined"}` {
				t.Fatalf("first: %d %q", first.Status, first.Body)
			}
			if n := app.Hooks.Runs("/v1/charges"); n != 1 {
				t.Fatalf("handler ran %d times", n)
			}
			switch {
			case inside && (!again.Replayed() || again.Status != first.Status || string(again.Body) != string(first.Body)):
				t.Fatalf("retry: %d replayed=%v %q; want the first answer replayed", again.Status, again.Replayed(), again.Body)
			case !inside && (again.Status != http.StatusConflict || again.ProblemType() != "outcome-unknown"):
				t.Fatalf("retry: %d replayed=%v %q; want 409 outcome-unknown", again.Status, again.Replayed(), again.Body)
			}
		})
	}
}
