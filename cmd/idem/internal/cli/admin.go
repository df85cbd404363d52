package cli

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idem-go/idem"
)

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
