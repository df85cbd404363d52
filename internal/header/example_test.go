package header_test

import (
	"fmt"
	"net/http"

	"github.com/idem-go/idem/internal/header"
)

func ExampleParse() {
	r, _ := http.NewRequest("POST", "/v1/charges", nil)
	r.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	key, err := header.Parse(r.Header.Values("Idempotency-Key"))
	fmt.Println(key, err)

	r.Header.Add("Idempotency-Key", "another")
	_, err = header.Parse(r.Header.Values("Idempotency-Key"))
	fmt.Println(err)
	// Output:
	// 8e03978e-40d5-43e8-bc93-6894a57f9324 <nil>
	// idempotency-key: field is repeated
}
