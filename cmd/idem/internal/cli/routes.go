package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"reflect"
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
func (t *routeTable) match(r *http.Request) (int, bool) {
	if t == nil {
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

// configHelp is the help of --config, part of idem proxy's.
const configHelp = `Config file (--config FILE or $IDEM_CONFIG): a JSON object. Its members
other than "routes" are flags of this command, by name, with the value the
flag takes (a string, number or boolean; a list as an array): the command
line and the environment win over them. "routes" lists per-route settings,
matched like net/http's ServeMux patterns; a request no route matches takes
the flags' settings:
  {
    "upstream": "http://127.0.0.1:3000",
    "tenant-from": ["authorization"],
    "ttl": "24h",
    "routes": [
      {"route": "POST /login", "protected": false},
      {"route": "POST /v1/charges", "fields": ["amount", "payment.currency"]},
      {"route": "POST /v1/exports", "ttl": "1h", "lease-policy": "retry"},
      {"route": "PATCH /v1/profile/{id}", "key-required": false},
      {"route": "POST /v1/reports", "async": true, "fields": ["month"]}
    ]
  }
A route's members: route (the pattern; with a method, that method is the
one protected there), protected (false: straight to the upstream, no key
read), key-required, fields (an empty list: the whole body), ttl, lease,
lease-policy, async (true: as --async for the pattern, which must then be
METHOD /path; it takes key-required, fields and lease-policy, not ttl or
lease, and cannot be unprotected). An unknown member is an error.`

// routeJSON is a route in the config file.
type routeJSON struct {
	Route       string    `json:"route"`
	Protected   *bool     `json:"protected"`
	KeyRequired *bool     `json:"key-required"`
	Fields      []string  `json:"fields"`
	TTL         *duration `json:"ttl"`
	Lease       *duration `json:"lease"`
	LeasePolicy string    `json:"lease-policy"`
	Async       bool      `json:"async"`
}

// duration is a time.Duration written as Go writes it ("90s", "1h30m").
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf(`%s: want a duration string such as "90s" or "24h"`, b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf(`%q: want a duration such as "90s" or "24h"`, s)
	}
	if v <= 0 {
		return fmt.Errorf("duration %q must be positive", s)
	}
	*d = duration(v)
	return nil
}

// loadConfig reads the proxy's config file at path: its flag members are
// set on fs where neither the command line nor the environment set them,
// and its routes are returned.
func loadConfig(fs *flag.FlagSet, path string) ([]RouteConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: want a JSON object: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: more than one JSON value", path)
	}
	values := map[string]string{}
	for name, raw := range doc {
		if name == "routes" {
			continue
		}
		if fs.Lookup(name) == nil || name == "config" {
			return nil, fmt.Errorf("%s: unknown setting %q: want a flag of idem %s or \"routes\"", path, name, fs.Name())
		}
		v, err := flagValue(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, name, err)
		}
		values[name] = v
	}
	origin := "config file " + path
	err = setFrom(fs, func(name string) (string, string, bool) {
		v, ok := values[name]
		return v, origin, ok
	})
	if err != nil {
		return nil, err
	}
	raw, ok := doc["routes"]
	if !ok {
		return nil, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%s: routes: %s", path, jsonReason(err, "a list of route objects"))
	}
	out := make([]RouteConfig, 0, len(list))
	for i, raw := range list {
		var r routeJSON
		rdec := json.NewDecoder(bytes.NewReader(raw))
		rdec.DisallowUnknownFields()
		if err := rdec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s: routes[%d]: %s", path, i, jsonReason(err, "an object"))
		}
		if r.Route == "" {
			return nil, fmt.Errorf("%s: routes[%d]: no \"route\" pattern", path, i)
		}
		rc := RouteConfig{Pattern: r.Route, KeyRequired: r.KeyRequired, Fields: r.Fields, LeasePolicy: r.LeasePolicy,
			Unprotected: r.Protected != nil && !*r.Protected, Async: r.Async}
		if r.TTL != nil {
			rc.TTL = time.Duration(*r.TTL)
		}
		if r.Lease != nil {
			rc.Lease = time.Duration(*r.Lease)
		}
		out = append(out, rc)
	}
	return out, nil
}

// jsonReason says why a config file member was refused without the Go
// types encoding/json names: what was found, in which member, and want
// (what the member holds) when the error does not say it.
func jsonReason(err error, want string) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("%q: got a JSON %s, want %s", te.Field, te.Value, jsonKind(te.Type))
		}
		return fmt.Sprintf("got a JSON %s, want %s", te.Value, want)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// jsonKind says what a JSON member of Go type t holds, in JSON's words.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Int, reflect.Int64, reflect.Float64:
		return "a number"
	}
	return "another JSON type"
}

// flagValue turns a config file member into a flag's text: a string as
// it is, a number or boolean as written, an array as a comma list.
func flagValue(raw json.RawMessage) (string, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	scalar := func(v any) (string, bool) {
		switch v := v.(type) {
		case string:
			return v, true
		case json.Number:
			return v.String(), true
		case bool:
			return fmt.Sprint(v), true
		}
		return "", false
	}
	if s, ok := scalar(v); ok {
		return s, nil
	}
	if list, ok := v.([]any); ok {
		items := make([]string, len(list))
		for i, e := range list {
			s, ok := scalar(e)
			if !ok {
				return "", errors.New("a list holds strings, numbers or booleans")
			}
			items[i] = s
		}
		return strings.Join(items, ","), nil
	}
	return "", errors.New("want a string, number, boolean or list")
}
