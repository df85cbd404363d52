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
