// Package fingerprint computes the request fingerprint that tells a retry of
// a request (same key, same fingerprint) from a different request sent with
// a reused key (same key, different fingerprint: 422).
//
// # What is hashed
//
// The fingerprint is SHA-256, or HMAC-SHA-256 keyed with a server secret, of
//
//	"idem fingerprint v1\n"
//	uvarint(len(method)) method
//	uvarint(len(route)) route
//	one byte: the body kind (raw, json, json-fields, json-raw, form, form-fields)
//	the canonical body
//
// Method and route are length-prefixed and the kind is one fixed-width byte,
// so the prefix is self-delimiting: no two (method, route, body) triples map
// to the same hash input, and the canonical forms of different kinds never
// equal each other. The canonical body is the rest of the input.
//
// # Bodies
//
// The Content-Type header chooses the canonical form:
//
//   - application/json and any +json type: RFC 8785 (JCS) canonical JSON. The
//     body must be valid RFC 8259 JSON in UTF-8, nested at most MaxDepth
//     deep, with no member name repeated in an object (names are compared
//     after unescaping). Otherwise Sum returns ErrInvalidJSON or
//     ErrDuplicateKey. An empty body is not JSON.
//   - application/x-www-form-urlencoded: the decoded pairs, sorted by key;
//     the values of a repeated key keep their order, because r.FormValue and
//     r.Form[key][0] read the first one, so a=1&a=2 and a=2&a=1 are different
//     requests. '+' and %20 are the same byte. Empty segments (a=1&&b=2) are
//     skipped and a key without '=' has the empty value, as net/url does. An
//     invalid percent escape or a ';' (a separator to some frameworks, part
//     of the value to others) is ErrInvalidForm.
//   - anything else, including no Content-Type and multipart: the raw bytes.
//
// # Meaning guards
//
// Canonicalisation must never make two requests equal whose meaning differs.
// RFC 8785 formats every number through an IEEE-754 double, which loses
// information: 12345678901234567890 and 12345678901234567891 both become
// 12345678901234567000, 0.1000000000000000055511151231257827 becomes 0.1,
// 1e-400 becomes 0 and -0 becomes 0. So a number is canonicalised only when
// the decimal value of its canonical text is exactly the decimal value of the
// input (1.50, 1.5e0 and 15E-1 all keep the value 1.5; -0 is kept apart from
// 0 because a float64 handler sees them differently). When any canonicalised
// number fails that test, or does not fit in a double at all (1e400), the
// whole body is hashed as raw bytes under the json-raw kind. Two spellings of
// such a document are then different requests: a retry must resend the same
// bytes, which every real client does. That is the safe direction: a false
// mismatch is a 422 the client can see, a false match would replay another
// request's response.
//
// JSON text that is not valid UTF-8, and \u escapes that are lone UTF-16
// surrogates (which many decoders silently turn into U+FFFD, merging distinct
// inputs), are ErrInvalidJSON.
//
// # Selected fields
//
// With fields, a JSON object body is fingerprinted by those top-level members
// only, in the order given: for each field its name, then whether it is
// present, then its canonical value, so a missing member differs from null.
// The whole body must still be valid. Only selected values are subject to the
// number guard. A JSON body that is not an object is fingerprinted whole. A
// form body is fingerprinted by the values of the named keys (a missing key
// has no values, which differs from one empty value). A JSON object or form
// with none of the selected members is fingerprinted whole, like a body of
// any other shape, so that requests the route did not expect (a JSON
// document labelled as a form) never share a fingerprint. Raw bodies ignore
// fields.
package fingerprint

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"strings"
	"sync"
)

// MaxDepth is the deepest nesting of JSON arrays and objects accepted.
const MaxDepth = 1000

// Errors returned by Sum; they may be wrapped with detail, so test with
// errors.Is. Each is a client error (HTTP 400).
var (
	// ErrInvalidJSON means a body declared JSON is not valid RFC 8259 JSON,
	// is not UTF-8, holds a lone surrogate escape, or nests too deep.
	ErrInvalidJSON = errors.New("fingerprint: invalid JSON body")
	// ErrDuplicateKey means a JSON object repeats a member name.
	ErrDuplicateKey = errors.New("fingerprint: duplicate member name in JSON body")
	// ErrInvalidForm means a form body has an invalid percent escape or a
	// ';' separator.
	ErrInvalidForm = errors.New("fingerprint: invalid form body")
)

// The body kinds; their byte values are part of the hash input, never
// renumber them.
const (
	kindRaw        byte = 1
	kindJSON       byte = 2
	kindJSONFields byte = 3
	kindJSONRaw    byte = 4 // JSON whose numbers would lose meaning: raw bytes
	kindForm       byte = 5
	kindFormFields byte = 6
)

const domain = "idem fingerprint v1\n"

// Hasher computes fingerprints. It is safe for concurrent use.
type Hasher struct {
	pool sync.Pool
}

// New returns a Hasher. A nil or empty secret gives plain SHA-256; any other
// secret gives HMAC-SHA-256 keyed with it, so fingerprints stored in a shared
// database reveal nothing about request bodies without the secret.
func New(secret []byte) *Hasher {
	key := append([]byte(nil), secret...)
	h := &Hasher{}
	h.pool.New = func() any {
		s := &state{buf: make([]byte, 0, bufSize)}
		if len(key) == 0 {
			s.h = sha256.New()
		} else {
			s.h = hmac.New(sha256.New, key)
		}
		return s
	}
	return h
}

// Sum returns the lowercase hex fingerprint of method, route and the
// canonical body. contentType is the request's Content-Type header; fields,
// when non-empty, selects top-level JSON members (or form keys) to
// fingerprint instead of the whole body.
func (h *Hasher) Sum(method, route, contentType string, body []byte, fields []string) (string, error) {
	s := h.pool.Get().(*state)
	defer h.put(s)
	var err error
	switch mediaKind(contentType) {
	case kindJSON:
		err = s.json(method, route, body, fields)
	case kindForm:
		err = s.form(method, route, body, fields)
	default:
		s.begin(method, route, kindRaw)
		s.write(body)
	}
	if err != nil {
		return "", err
	}
	s.flush()
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], s.h.Sum(s.sum[:0]))
	return string(out[:]), nil
}

// Large requests grow the scratch slices; they are dropped rather than kept
// in the pool so one big body does not pin its memory for ever.
const maxPooledItems = 1 << 14

func (h *Hasher) put(s *state) {
	s.src = nil // do not keep the request body alive
	if cap(s.nodes) > maxPooledItems {
		s.nodes = nil
	}
	if cap(s.stack) > maxPooledItems {
		s.stack = nil
	}
	if cap(s.pairs) > maxPooledItems {
		s.pairs = nil
	}
	if cap(s.scratch) > 16*maxPooledItems {
		s.scratch = nil
	}
	h.pool.Put(s)
}

// bufSize is the size of the buffer that batches small writes to the hash;
// hash.Write has a fixed cost per call that dominates for tiny pieces.
const bufSize = 2048

// state is one pooled set of scratch space: the hash and everything the JSON
// and form canonicalisers need, so a Sum allocates only its result.
type state struct {
	h       hash.Hash
	sum     [sha256.Size]byte // kept here: passed to h.Sum it would escape
	buf     []byte            // pending bytes not yet written to h
	nodes   []node            // JSON: the parsed document
	stack   []int32           // JSON: member indices of the objects being written
	pairs   []pair            // form: decoded pairs
	scratch []byte            // form: decoded keys and values
	w       sink              // where canonical bytes go; nil means h
	guarded bool              // JSON: a written number failed the meaning guard
	src     []byte            // JSON: the document
}

// sink receives canonical bytes; tests use it to capture them.
type sink interface{ Write([]byte) (int, error) }

// begin resets the hash and writes the prefix for one kind of body.
func (s *state) begin(method, route string, kind byte) {
	s.h.Reset()
	s.buf = s.buf[:0]
	s.buf = append(s.buf, domain...)
	s.buf = binary.AppendUvarint(s.buf, uint64(len(method)))
	s.buf = append(s.buf, method...)
	s.buf = binary.AppendUvarint(s.buf, uint64(len(route)))
	s.buf = append(s.buf, route...)
	s.buf = append(s.buf, kind)
}

func (s *state) flush() {
	if len(s.buf) > 0 {
		if s.w != nil {
			s.w.Write(s.buf)
		} else {
			s.h.Write(s.buf)
		}
		s.buf = s.buf[:0]
	}
}

func (s *state) write(p []byte) {
	if len(s.buf)+len(p) > bufSize {
		s.flush()
		if len(p) > bufSize {
			if s.w != nil {
				s.w.Write(p)
			} else {
				s.h.Write(p)
			}
			return
		}
	}
	s.buf = append(s.buf, p...)
}

func (s *state) writeString(p string) {
	if len(s.buf)+len(p) > bufSize {
		s.flush()
	}
	s.buf = append(s.buf, p...)
}

func (s *state) writeByte(c byte) {
	if len(s.buf) >= bufSize {
		s.flush()
	}
	s.buf = append(s.buf, c)
}

func (s *state) writeUvarint(n int) {
	if len(s.buf)+binary.MaxVarintLen64 > bufSize {
		s.flush()
	}
	s.buf = binary.AppendUvarint(s.buf, uint64(n))
}

// mediaKind maps a Content-Type value to the kind of canonical form.
func mediaKind(contentType string) byte {
	mt := contentType
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = mt[:i]
	}
	mt = strings.Trim(mt, " \t")
	slash := strings.IndexByte(mt, '/')
	if slash <= 0 {
		return kindRaw
	}
	sub := mt[slash+1:]
	switch {
	case strings.EqualFold(mt, "application/json"):
		return kindJSON
	case len(sub) > len("+json") && strings.EqualFold(sub[len(sub)-len("+json"):], "+json"):
		return kindJSON
	case strings.EqualFold(mt, "application/x-www-form-urlencoded"):
		return kindForm
	}
	return kindRaw
}
