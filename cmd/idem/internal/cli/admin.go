package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// limitedServer is an HTTP server with the proxy's limits on slow and
// large clients: the main listener and the admin server share them.
// Bodies are bounded by each server's handler (guard, adminLimits).
func (cfg ProxyConfig) limitedServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
}

// maxAdminBody bounds a request body on the admin server: the largest
// it takes is a webhook delivery.
const maxAdminBody = maxWebhookBody + 1

// adminLimits gives an admin request's body bodyTimeout to arrive (none
// when not positive) and at most maxAdminBody bytes, as guard bounds the
// main listener's.
func adminLimits(h http.Handler, bodyTimeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bodyTimeout > 0 {
			r = limitBodyTime(w, r, bodyTimeout)
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, maxAdminBody)
		}
		h.ServeHTTP(w, r)
	})
}

// readyTimeout bounds the readiness check: a store slower than this is
// treated as unavailable.
const readyTimeout = time.Second

// AdminMux builds the admin server's handler:
//
//	/healthz  200 "ok" while the process runs (liveness)
//	/readyz   200 "ready" when ready succeeds within 1s, else 503 (readiness)
//
// The body of a 503 says only why in general terms (idem.PublicReason):
// the admin server may be reachable by callers that must not learn the
// store's host, port, user or database, which a driver's error names.
// ready logs the detail.
//
// extra mounts more handlers by ServeMux pattern; the metrics endpoint is
// added this way (extra["/metrics"]), so the admin server stays one place.
func AdminMux(ready func(context.Context) error, extra map[string]http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		plain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			plain(w, http.StatusServiceUnavailable, "not ready: "+idem.PublicReason(err))
			return
		}
		plain(w, http.StatusOK, "ready")
	})
	for _, pattern := range sortedKeys(extra) {
		mux.Handle(pattern, extra[pattern])
	}
	return mux
}

func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

// mountsMetrics reports whether the caller brought its own /metrics.
func mountsMetrics(handlers map[string]http.Handler) bool {
	for pattern := range handlers {
		if _, path, _ := strings.Cut(pattern, " "); pattern == "/metrics" || path == "/metrics" {
			return true
		}
	}
	return false
}

func adminString(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// AdminAddr returns the admin server's bound address, or nil without one.
func (p *Proxy) AdminAddr() net.Addr {
	if p.adminLn == nil {
		return nil
	}
	return p.adminLn.Addr()
}

// ready is the readiness check: not while draining, and only when the
// store is open and the engine would serve (idem.Engine.Ready: the
// circuit breaker closed, a real read of the store answered). Each change
// of readiness, and of its reason, is logged once with the detail that
// /readyz does not show.
func (p *Proxy) ready(ctx context.Context) error {
	if p.draining.Load() {
		return &idem.NotReady{Reason: idem.ReasonShuttingDown}
	}
	p.mu.Lock()
	e, openErr := p.engine, p.openErr
	p.mu.Unlock()
	var err error
	if e == nil {
		err = &idem.NotReady{Reason: idem.ReasonStoreNotOpen, Err: openErr}
	} else {
		err = e.Ready(ctx)
	}
	reason := ""
	if err != nil {
		reason = idem.PublicReason(err)
	}
	if prev := p.readyReason.Swap(&reason); prev == nil || *prev != reason {
		switch {
		case err == nil && prev != nil:
			p.log.Info("idem proxy: ready again; the store answers")
		case err != nil && e != nil:
			p.log.Warn("idem proxy: not ready; protected requests may get 503", "reason", reason, "err", err)
		}
	}
	return err
}
