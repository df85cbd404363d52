package cli

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// RouteConfig is the settings of the proxy's requests that match one
// route. Zero fields keep the proxy's settings.
type RouteConfig struct {
	// Pattern is a net/http ServeMux pattern: "POST /v1/charges/{id}",
	// "/v1/refunds/", "POST api.example.com/login". With a method, that
	// method is the one protected on the route (whatever --methods says);
	// without one, the --methods are.
	Pattern string
	// Unprotected routes pass straight to the upstream: no key is read,
	// no record kept, whatever the method.
	Unprotected bool
	// KeyRequired overrides whether a protected request needs a key (an
	// optional key: false).
	KeyRequired *bool
	// Fields, when not nil, are the fields fingerprinted on the route; an
	// empty, non-nil list fingerprints the whole body.
	Fields []string
	// TTL, Lease and LeasePolicy override the engine's settings of the
	// same name. An asynchronous route takes no TTL or Lease: the
	// workers, which serve every asynchronous route, run its requests
	// under the proxy's lease and keep their answers for its TTL.
	TTL         time.Duration
	Lease       time.Duration
	LeasePolicy string
	// Async makes the route asynchronous, as ProxyConfig.Async does for
	// its pattern (which must then name a method and a path): a keyed
	// request is recorded and answered 202 at once, and a worker forwards
	// it. KeyRequired, Fields and LeasePolicy apply to it, as they are
	// decided when the request is accepted. A pattern both in
	// ProxyConfig.Async and here is one route, with these settings.
	Async bool
}

// routeTable matches requests to the proxy's routes.
type routeTable struct {
	mux    *http.ServeMux
	routes []route
}

// route is a RouteConfig ready to serve.
type route struct {
	RouteConfig
	method string // of the pattern; empty: any
}

// routeIndex is the handler a route is registered with in the table's
// mux: the mux only matches, it never serves.
type routeIndex int

func (routeIndex) ServeHTTP(http.ResponseWriter, *http.Request) {}

// newRouteTable checks the routes and builds their table; nil without
// routes. A route whose pattern is one of the --async patterns (async) is
// asynchronous. A pattern the mux refuses, two that conflict, or a setting
// an asynchronous route cannot take is an error naming the route.
func newRouteTable(routes []RouteConfig, async []string) (*routeTable, error) {
	if len(routes) == 0 {
		return nil, nil
	}
	flagged := map[string]bool{}
	for _, pat := range async {
		flagged[canonPattern(pat)] = true
	}
	t := &routeTable{mux: http.NewServeMux()}
	for i, rc := range routes {
		if err := t.handle(rc.Pattern, routeIndex(i)); err != nil {
			return nil, fmt.Errorf("route %q: %w", rc.Pattern, err)
		}
		rc.Async = rc.Async || flagged[canonPattern(rc.Pattern)]
		if err := rc.checkAsync(); err != nil {
			return nil, fmt.Errorf("route %q: %w", rc.Pattern, err)
		}
		r := route{RouteConfig: rc}
		if f := strings.Fields(rc.Pattern); len(f) == 2 {
			r.method = f[0]
		}
		if r.method != "" && !upperToken(r.method) {
			// The guard refuses such methods before any route is matched.
			return nil, fmt.Errorf("route %q: the method must be upper case", rc.Pattern)
		}
		if rc.Unprotected && (rc.KeyRequired != nil || rc.Fields != nil || rc.TTL != 0 || rc.Lease != 0 || rc.LeasePolicy != "") {
			return nil, fmt.Errorf("route %q: an unprotected route takes no other setting", rc.Pattern)
		}
		t.routes = append(t.routes, r)
	}
	return t, nil
}

// checkAsync refuses what an asynchronous route cannot be or take.
func (rc *RouteConfig) checkAsync() error {
	switch {
	case !rc.Async:
		return nil
	case rc.Unprotected:
		return errors.New(`an asynchronous route ("async": true or --async) must be protected: it cannot also be "protected": false`)
	case rc.TTL != 0 || rc.Lease != 0:
		return errors.New("ttl and lease do not apply to an asynchronous route: the workers run every asynchronous request " +
			"under --lease and keep its answer for --ttl (key-required, fields and lease-policy do apply)")
	}
	_, _, err := asyncPattern(rc.Pattern)
	return err
}

// handle registers pattern, turning the mux's panic on a bad or
// conflicting pattern into an error.
func (t *routeTable) handle(pattern string, h http.Handler) error {
	if strings.TrimSpace(pattern) == "" {
		return errors.New("empty pattern")
	}
	return register(t.mux, pattern, h)
}

// match returns the index of the route r matches, if any. A request whose
// path the mux would redirect (not clean, or missing a trailing slash)
// matches no route: the upstream may not read its path as the mux does.
// Nor does one with a dot-segment the mux leaves alone because it is
// percent-encoded or hidden by a backslash or ";params": an upstream that
// decodes or drops those first reads /webhooks/%2e%2e/charges as /charges.
func (t *routeTable) match(r *http.Request) (int, bool) {
	if t == nil || hasDotSegment(r.URL.Path) {
		return 0, false
	}
	h, _ := t.mux.Handler(r)
	i, ok := h.(routeIndex)
	return int(i), ok
}

// hasAsync reports whether a route is asynchronous.
func (t *routeTable) hasAsync() bool {
	if t == nil {
		return false
	}
	for i := range t.routes {
		if t.routes[i].Async {
			return true
		}
	}
	return false
}

// modify applies the route's settings to a copy of the proxy's engine
// configuration (Engine.With).
func (r *route) modify(c *idem.Config) {
	if r.method != "" {
		c.Methods = []string{r.method}
	}
	if r.KeyRequired != nil {
		c.KeyRequired = r.KeyRequired
	}
	if r.Fields != nil {
		c.Fields = r.Fields
	}
	if r.TTL != 0 {
		c.TTL = r.TTL
	}
	if r.Lease != 0 {
		c.Lease = r.Lease
	}
	if r.LeasePolicy != "" {
		c.LeasePolicy = store.LeasePolicy(r.LeasePolicy)
	}
}

// routeEngines derives the engine of every protected route from e, of
// every asynchronous route from the asynchronous engine ae; an unprotected
// route gets nil. An invalid setting is an error naming the route.
func (t *routeTable) routeEngines(e, ae *idem.Engine) ([]*idem.Engine, error) {
	if t == nil {
		return nil, nil
	}
	engines := make([]*idem.Engine, len(t.routes))
	for i := range t.routes {
		r := &t.routes[i]
		if r.Unprotected {
			continue
		}
		base := e
		if r.Async {
			base = ae
		}
		d, err := base.With(r.modify)
		if err != nil {
			return nil, fmt.Errorf("route %q: %w", r.Pattern, err)
		}
		engines[i] = d
	}
	return engines, nil
}
