package fingerprint_test

import (
	"fmt"

	"github.com/idem-go/idem/internal/fingerprint"
)

func ExampleHasher_Sum() {
	h := fingerprint.New(nil)
	a, _ := h.Sum(fingerprint.Input{Method: "POST", Route: "/v1/charges", ContentType: "application/json", Body: []byte(`{"amount": 2000, "currency": "usd"}`)})
	b, _ := h.Sum(fingerprint.Input{Method: "POST", Route: "/v1/charges", ContentType: "application/json; charset=utf-8", Body: []byte(`{"currency":"usd","amount":2.0e3}`)})
	c, _ := h.Sum(fingerprint.Input{Method: "POST", Route: "/v1/charges", ContentType: "application/json", Body: []byte(`{"currency":"usd","amount":2001}`)})
	fmt.Println(a == b, a == c)
	// Output: true false
}
