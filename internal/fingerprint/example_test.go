package fingerprint_test

import (
	"fmt"

	"github.com/idem-go/idem/internal/fingerprint"
)

func ExampleHasher_Sum() {
	h := fingerprint.New(nil)
	a, _ := h.Sum("POST", "/v1/charges", "application/json", []byte(`{"amount": 2000, "currency": "usd"}`), nil)
	b, _ := h.Sum("POST", "/v1/charges", "application/json; charset=utf-8", []byte(`{"currency":"usd","amount":2.0e3}`), nil)
	c, _ := h.Sum("POST", "/v1/charges", "application/json", []byte(`{"currency":"usd","amount":2001}`), nil)
	fmt.Println(a == b, a == c)
	// Output: true false
}
