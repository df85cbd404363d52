package idem_test

import (
	"testing"

	"github.com/idem-go/idem"
)

func TestParseScope(t *testing.T) {
	for _, req := range []idem.Request{
		{Tenant: "", Method: "POST", Route: "/v1/charges"},
		{Tenant: "acct:7 x", Method: "PATCH", Route: "/v1/a b/{id}"},
		{Tenant: "12:34", Method: "POST", Route: ""},
	} {
		tenant, method, route, ok := idem.ParseScope(req.Scope())
		if !ok || tenant != req.Tenant || method != req.Method || route != req.Route {
			t.Fatalf("ParseScope(%q) = %q %q %q %v", req.Scope(), tenant, method, route, ok)
		}
	}
	for _, bad := range []string{"", "x", "5:ab", "-1:", "3:abcPOST", "0: /x"} {
		if _, _, _, ok := idem.ParseScope(bad); ok {
			t.Fatalf("ParseScope(%q) accepted", bad)
		}
	}
}
