package payments

import (
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"strings"
)

// ProblemBase prefixes the type URI of the service's own problems; the
// README lists them.
const ProblemBase = "https://github.com/idem-go/idem/blob/main/examples/payments/README.md#problem-"

type accountKey struct{}

// accountOf returns the authenticated account, "" outside authenticate.
func accountOf(ctx context.Context) string {
	s, _ := ctx.Value(accountKey{}).(string)
	return s
}

// authenticate takes the account from "Authorization: Bearer <account>"
// (a stand-in for real authentication: a token would be verified and
// mapped to its account). The account is the idempotency tenant, so two
// accounts never share keys, and the only owner of its payments.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || !validAccount(token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
			problem(w, http.StatusUnauthorized, "unauthenticated", "Authorization: Bearer <account> is required",
				"an account is 1 to 64 letters, digits, '_' or '-'")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, token)))
	})
}

func validAccount(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// requireJSON refuses a body that is not declared JSON with 415, before
// the engine sees it. The engine reads the body by its Content-Type: with
// Fields set, a JSON body sent as a form (curl -d without -H) would be
// fingerprinted by form keys it does not have, so every such body would
// look the same, and a key reused with another amount would replay the
// first answer. Refusing before the engine also leaves the key unspent, so
// the client can fix the header and retry with it.
func requireJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			problem(w, http.StatusUnsupportedMediaType, "not-json", "The request body must be application/json",
				"send Content-Type: application/json")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// problem answers with an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, slug, title, detail string) {
	doc := map[string]any{"type": ProblemBase + slug, "title": title, "status": status}
	if detail != "" {
		doc["detail"] = detail
	}
	b, _ := json.Marshal(doc)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	w.Write(append(b, '\n')) //nolint:errcheck // the client may be gone
}
