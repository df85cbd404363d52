package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"
)

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
	return decodeRoutes(path, raw)
}

// decodeRoutes decodes the "routes" member of the config file at path.
func decodeRoutes(path string, raw json.RawMessage) ([]RouteConfig, error) {
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
