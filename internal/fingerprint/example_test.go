package fingerprint_test

import (
	"fmt"

	"github.com/idem-go/idem/internal/fingerprint"
)

func ExampleHasher_Sum() {
	h := fingerprint.New(nil)
	charge := func(target, contentType, body string) string {
		sum, err := h.Sum(fingerprint.Input{
			Method:      "POST",
			Route:       "/v1/orders/{id}/charge",
			Target:      target, // r.URL.RequestURI()
			ContentType: contentType,
			Body:        []byte(body),
		})
		if err != nil {
			panic(err)
		}
		return sum
	}
	a := charge("/v1/orders/1/charge?notify=yes&expand=customer", "application/json", `{"amount": 2000, "currency": "usd"}`)
	// Another spelling of the same request: query order, escapes, JSON
	// whitespace, member order and number notation do not count.
	b := charge("/v1/orders/1/charge?expand=customer&notify=%79es", "application/json; charset=utf-8", `{"currency":"usd","amount":2.0e3}`)
	// Another order, or another amount, is another request.
	c := charge("/v1/orders/2/charge?notify=yes&expand=customer", "application/json", `{"amount": 2000, "currency": "usd"}`)
	d := charge("/v1/orders/1/charge?notify=yes&expand=customer", "application/json", `{"amount": 2001, "currency": "usd"}`)
	fmt.Println(a == b, a == c, a == d)
	// Output: true false false
}
