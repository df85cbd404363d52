// Package header parses the Idempotency-Key request header field.
//
// The IETF draft (draft-ietf-httpapi-idempotency-key-header) defines the
// field as an Item Structured Field (RFC 8941, RFC 9651) whose value is a
// String:
//
//	Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
//
// Stripe and the clients written against it send the bare value instead:
//
//	Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324
//
// Parse accepts both spellings and maps them to the same key, so a client
// that switches spelling between retries still hits its own record.
//
// # Quoted spelling
//
// A value that starts with '"' is parsed as an sf-string Item. Parameters on
// the Item are ignored, as RFC 8941 requires of a recipient that does not
// know them. The common case, a quoted string without escapes or parameters,
// is parsed without allocating: the key is a substring of the field value.
// Anything else goes through github.com/dunglas/httpsfv.
//
// # Bare spelling
//
// Any other value is taken whole as the key: it must consist of visible
// ASCII (0x21-0x7E) after leading and trailing spaces and tabs are trimmed,
// so it cannot contain whitespace. A bare value cannot contain ',' either:
// an intermediary may join repeated field lines with commas, so "a, b" is
// reported as ErrRepeated and a lone comma as ErrMalformed.
package header

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dunglas/httpsfv"
)

// MaxLen is the longest key accepted, in characters (keys are ASCII, so
// also in bytes), counted after the quoted spelling is decoded.
const MaxLen = 255

// Errors returned by Parse. Each describes a client error (HTTP 400); the
// error returned may wrap one of them with detail, so test with errors.Is.
var (
	// ErrMissing means the request has no Idempotency-Key field.
	ErrMissing = errors.New("idempotency-key: field is missing")
	// ErrRepeated means the field appears on more than one line, or one
	// line holds a list of several members (as a proxy that joins repeated
	// lines would produce).
	ErrRepeated = errors.New("idempotency-key: field is repeated")
	// ErrEmpty means the field value, or the quoted string, is empty.
	ErrEmpty = errors.New("idempotency-key: key is empty")
	// ErrTooLong means the key is longer than MaxLen characters.
	ErrTooLong = errors.New("idempotency-key: key is longer than 255 characters")
	// ErrMalformed means the value is neither an sf-string nor a bare
	// token of visible ASCII.
	ErrMalformed = errors.New("idempotency-key: malformed key")
)

// Parse parses the values of the Idempotency-Key field, as returned by
// r.Header.Values("Idempotency-Key"), and returns the key.
func Parse(values []string) (key string, err error) {
	switch len(values) {
	case 0:
		return "", ErrMissing
	case 1:
	default:
		return "", ErrRepeated
	}
	v := trimOWS(values[0])
	if v == "" {
		return "", ErrEmpty
	}
	if v[0] != '"' {
		return parseBare(v)
	}
	if k, ok := parseQuotedFast(v); ok {
		return checkLen(k)
	}
	return parseStructured(v)
}

// parseQuotedFast handles a quoted string of printable ASCII without
// escapes, with nothing after the closing quote. It reports false for
// anything else, which the caller hands to the full parser; on true its
// result must equal what httpsfv decodes (FuzzQuotedFastPath checks this).
func parseQuotedFast(v string) (string, bool) {
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"':
			if i != len(v)-1 {
				return "", false // parameters or a list follow
			}
			return v[1:i], true
		case c == '\\' || c < 0x20 || c > 0x7e:
			return "", false
		}
	}
	return "", false // unterminated
}

func parseStructured(v string) (string, error) {
	item, err := httpsfv.UnmarshalItem([]string{v})
	if err != nil {
		// A proxy may have joined two field lines into one: that is a
		// repeated key, not a malformed one, and deserves the clearer error.
		if list, lerr := httpsfv.UnmarshalList([]string{v}); lerr == nil && len(list) > 1 {
			return "", ErrRepeated
		}
		return "", fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	s, ok := item.Value.(string)
	if !ok {
		return "", fmt.Errorf("%w: not a string", ErrMalformed)
	}
	return checkLen(s)
}

func parseBare(v string) (string, error) {
	if strings.IndexByte(v, ',') >= 0 {
		return "", splitList(v)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e {
			return "", ErrMalformed
		}
	}
	return checkLen(v)
}

// splitList classifies a bare value holding a comma: several non-empty
// members are joined field lines (ErrRepeated); otherwise the comma is just
// a character a bare key may not contain.
func splitList(v string) error {
	members := 0
	for part := range strings.SplitSeq(v, ",") {
		if trimOWS(part) != "" {
			members++
		}
	}
	if members > 1 {
		return ErrRepeated
	}
	return ErrMalformed
}

func checkLen(k string) (string, error) {
	switch {
	case k == "":
		return "", ErrEmpty
	case len(k) > MaxLen:
		return "", ErrTooLong
	}
	return k, nil
}

// trimOWS removes the optional whitespace (spaces and tabs) of RFC 9110
// around a field value; net/http already does this for values it parsed,
// but not for headers set by code.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
