package cli

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/store"
)

// hiddenValue stands for the value of a header that may hold a credential.
const hiddenValue = "(hidden: may hold a credential)"

// requestView is the request an unknown record keeps, in inspect --json.
type requestView struct {
	// Whole is true for an asynchronous request (kept whole), false for
	// the summary kept when the outcome became unknown.
	Whole  bool        `json:"whole"`
	Method string      `json:"method"`
	Target string      `json:"target"`
	Header http.Header `json:"header,omitempty"`
	// BodyLength is the whole body's size; Body (text) or BodyBase64 hold
	// what was kept of it.
	BodyLength int     `json:"body_length"`
	Body       *string `json:"body,omitempty"`
	BodyBase64 string  `json:"body_base64,omitempty"`
}

// viewRequest fills the request fields of an unknown record's view.
func viewRequest(v *recordView, r *store.Record) {
	q, why := console.KeptRequest(r)
	if q == nil {
		v.RequestNotRecorded = why
		return
	}
	rv := &requestView{Whole: q.Queue != "", Method: q.Method, Target: q.Target, Header: shownHeader(q.Header),
		BodyLength: console.BodySize(q)}
	if text, ok := requestText(q.Body); ok {
		rv.Body = &text
	} else if len(q.Body) > 0 {
		rv.BodyBase64 = base64.StdEncoding.EncodeToString(q.Body)
	}
	v.Request = rv
}

// shownHeader is h with the values of headers that may hold a credential
// hidden (an asynchronous request keeps those its worker needs).
func shownHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		if idem.MayHoldCredential(k) {
			out[k] = []string{hiddenValue}
			continue
		}
		out[k] = vs
	}
	return out
}

func requestText(b []byte) (string, bool) {
	return string(b), len(b) > 0 && utf8.Valid(b) && !strings.ContainsRune(string(b), 0)
}

// printRequest prints the request an unknown record keeps, or why none is
// known, as the console's record page shows it.
func printRequest(w io.Writer, r *store.Record) error {
	q, why := console.KeptRequest(r)
	if q == nil {
		_, err := fmt.Fprintf(w, "\nrequest: not recorded: %s\n", why)
		return err
	}
	kind := "a summary kept when the outcome became unknown, without credentials"
	if q.Queue != "" {
		kind = "asynchronous, kept whole"
	}
	fmt.Fprintf(w, "\nrequest (%s): %s %s\n", kind, printable(q.Method, false), printable(q.Target, false))
	printHeader(w, shownHeader(q.Header))
	size := console.BodySize(q)
	var err error
	switch shown, ok := console.ShownText(q.Body); {
	case size == 0:
		_, err = fmt.Fprintln(w, "\n(no body)")
	case ok:
		_, err = fmt.Fprintf(w, "\n%s\n", printable(shown, true))
		if err == nil && len(shown) < size {
			_, err = fmt.Fprintf(w, "(the first %d of %d bytes)\n", len(shown), size)
		}
	default:
		fmt.Fprintf(w, "\n(binary body: %d bytes)\n", size)
		_, err = io.WriteString(w, hex.Dump(q.Body[:min(len(q.Body), previewBytes)]))
	}
	return err
}
