// Package ginidem puts idem's idempotency-key protocol in front of gin
// routes.
//
//	r := gin.Default()
//	r.Use(ginidem.Middleware(engine))
//	r.POST("/v1/charges/:id/capture", capture)
//
// The route of a request is its gin pattern (c.FullPath(), "/v1/charges/:id/capture"),
// so every route has records of its own, in groups as at the top level. The
// rest of the handler chain runs inside the protocol, and what it writes
// through c.Writer (c.JSON, c.String, c.Status, c.AbortWithStatusJSON...) is
// the answer that is stored and replayed. When the engine answers by itself
// (a replay, 409 while the first request runs, 422 for a reused key, 400
// for a missing or malformed key, 503 when the store is down) the chain is
// aborted: no later handler runs.
//
// Errors attached with c.Error are answered by middleware that renders
// c.Errors after the chain returned: put it after this middleware, so that
// the error's answer is written inside the protocol and recorded under the
// response policy. A chain that attaches an error and writes nothing
// leaves its answer to middleware outside the protocol, which cannot be
// recorded: the record goes to "outcome unknown" (a retry gets 409, never
// an answer the first client did not get, nor a second execution).
//
// Order: put gin.Recovery() (or gin.Default()) before the middleware. A
// panicking handler leaves its record "outcome unknown" (a retry gets 409,
// never a second execution); the panic goes on up to gin's recovery, which
// answers the client.
package ginidem

import (
	"bufio"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem"
)

// Middleware returns gin middleware that serves each request through e,
// with c.FullPath() as its route. Requests that matched no route (404, 405)
// and methods e does not protect pass through untouched.
//
// Register it with Use on the engine or a group, before the handlers it
// protects; the handlers registered after it in the chain run inside the
// protocol.
func Middleware(e *idem.Engine) gin.HandlerFunc {
	if e == nil {
		panic("ginidem: Middleware needs an engine")
	}
	return func(c *gin.Context) {
		route := c.FullPath()
		if route == "" {
			// No route matched: gin answers 404 or 405, there is nothing to
			// protect, and a key must not be spent on it.
			c.Next()
			return
		}
		orig, origReq := c.Writer, c.Request
		ran := e.Handle(orig, origReq, route, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Restored on the way out, a panic's included: gin's recovery
			// must answer on the client's writer, not into the recorder.
			defer func() { c.Writer, c.Request = orig, origReq }()
			c.Request = r
			if idem.FromContext(r.Context()) == nil {
				// Passed through (not an execution under a key): the
				// chain writes to the client as usual.
				c.Next()
				return
			}
			gw := &writer{ResponseWriter: orig, w: w, status: http.StatusOK, size: -1}
			c.Writer = gw
			errs := len(c.Errors)
			c.Next()
			if !gw.Written() && len(c.Errors) > errs {
				// gin's idiom for an error that middleware before this one
				// renders once the chain returned (c.Error, then nothing
				// written): that answer is written after the protocol and
				// cannot be recorded, and the empty 200 recorded instead
				// would be replayed to every retry. Nor is the key released:
				// the handler may have taken effect before its error.
				idem.FromContext(r.Context()).Uncertain("the handler chain attached an error (c.Error) and wrote no answer: " +
					"middleware outside the protocol answers it, so the answer cannot be recorded")
			}
			// A handler that only set a status (c.Status(204)) leaves gin
			// to send it after the chain, outside the protocol: send it
			// here so that it is the recorded answer.
			gw.WriteHeaderNow()
		}))
		if !ran {
			c.Abort()
		}
	}
}

// writer is the gin.ResponseWriter handlers see during an execution: it
// keeps gin's lazy status (WriteHeader records, the first write sends) and
// writes through the engine's recorder w. CloseNotify and Pusher are
// those of the client's writer; Hijack is the recorder's, which refuses.
type writer struct {
	gin.ResponseWriter // the client's, for what is not the answer
	w                  http.ResponseWriter
	status             int
	size               int // -1 until the header is sent
}

var _ gin.ResponseWriter = (*writer)(nil)

func (gw *writer) Header() http.Header { return gw.w.Header() }

func (gw *writer) WriteHeader(code int) {
	if code > 0 && !gw.Written() {
		gw.status = code
	}
}

func (gw *writer) WriteHeaderNow() {
	if !gw.Written() {
		gw.size = 0
		gw.w.WriteHeader(gw.status)
	}
}

func (gw *writer) Write(b []byte) (int, error) {
	gw.WriteHeaderNow()
	n, err := gw.w.Write(b)
	gw.size += n
	return n, err
}

func (gw *writer) WriteString(s string) (int, error) {
	gw.WriteHeaderNow()
	n, err := io.WriteString(gw.w, s)
	gw.size += n
	return n, err
}

func (gw *writer) Status() int   { return gw.status }
func (gw *writer) Size() int     { return gw.size }
func (gw *writer) Written() bool { return gw.size != -1 }

func (gw *writer) Flush() {
	gw.WriteHeaderNow()
	http.NewResponseController(gw.w).Flush()
}

// Hijack is refused by the engine's recorder (idem.ErrHijack): a
// connection taken over mid-execution has no answer it could record or
// replay.
func (gw *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(gw.w).Hijack()
}

// Unwrap lets http.ResponseController reach the recorder.
func (gw *writer) Unwrap() http.ResponseWriter { return gw.w }
