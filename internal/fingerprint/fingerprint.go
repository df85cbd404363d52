// Package fingerprint computes the request fingerprint that tells a retry of
// a request (same key, same fingerprint) from a different request sent with
// a reused key (same key, different fingerprint: 422).
//
// # What is hashed
//
// The fingerprint is SHA-256, or HMAC-SHA-256 keyed with a server secret, of
//
//	"idem fingerprint v2\n"
//	uvarint(len(method)) method
//	uvarint(len(route)) route
//	uvarint(len(target)) target   (the canonical target, below)
//	one byte: the body kind (raw, json, json-fields, json-raw, form, form-fields, encoded)
//	the canonical body
//
// Method, route and target are length-prefixed and the kind is one
// fixed-width byte, so the prefix is self-delimiting: no two (method, route,
// target, body) inputs map to the same hash input, and the canonical forms of
// different kinds never equal each other. The canonical body is the rest of
// the input.
//
// The route is the pattern (/v1/orders/{id}/pay) and the target the concrete
// request (/v1/orders/2/pay?notify=1): with the route alone, the same key
// sent for order 1 and then for order 2 would replay order 1's answer.
// Input.Target is the request target in origin form, the escaped path then,
// if there is a query, '?' and the raw query: what (*url.URL).RequestURI
// returns for a server request. Sum canonicalises it itself, so callers
// cannot forget to; the canonical target is
//
//	uvarint(len(path)) path
//	for each query pair, sorted by key, the values of a repeated key in their order:
//	  one byte: 0 decoded, 1 kept as sent
//	  uvarint(len(key)) key uvarint(len(value)) value
//
// The path is everything before the first '?' (an escaped path has no raw
// '?'), taken byte for byte: routers disagree on what %2F means in a path,
// so no two spellings of a path are merged. The query is split and decoded
// as net/url's ParseQuery does and as forms are below: pairs are separated
// by '&', empty segments are skipped, a pair without '=' has the empty value,
// '+' is a space and %41 is A, so a=%41 and a=A are one request while
// a=1&b=2 and a=12 are not, and an empty query equals no query. A segment
// with an invalid percent escape or a ';' is never an error (the server
// already accepted the request) but is kept as sent, split at its first '=',
// and marked so that it never equals a decoded pair: Go's handlers drop such
// a pair, other frameworks keep it raw, and neither reading may merge two
// requests.
//
// # Versions
//
// The first line names the layout version. A change to anything hashed
// (what is covered, how it is canonicalised) takes a new version, so the
// old and new fingerprints of one request always differ. Version 1 covered
// method, route and body, not the target, and read a field as one
// top-level member name; version 2 adds the target and field paths. A
// record written under version 1 therefore never matches a version 2
// fingerprint: a retry of such a record after an upgrade is answered 422
// (key reused), never executed a second time, and such records age out
// with their keys.
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
// A body sent in a content coding (Content-Encoding) is canonicalised as
// its decoded content when the caller decodes it first (idem's engine
// decodes gzip and deflate): a retry whose compressor wrote other bytes for
// the same content, or that sends it unencoded, is the same request. A
// body left in a coding the caller cannot decode is hashed as its raw
// bytes under a kind of its own, after the length-prefixed coding names
// (Input.ContentEncoding), whatever its Content-Type, and fields are
// ignored: a retry must send the same bytes.
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
// Deciding is cheap for almost every number: the digits alone settle a
// number of more than 17 significant digits (no double needs more) or out
// of the double range. Subnormal values (below about 2.2e-308) are the
// exception, as converting them exactly costs some thousand times more than
// a normal number; past 64 of them in one body the body is hashed raw, the
// safe direction, so that no body of a given size costs much more to
// fingerprint than the same size of small integers.
//
// JSON text that is not valid UTF-8, and \u escapes that are lone UTF-16
// surrogates (which many decoders silently turn into U+FFFD, merging distinct
// inputs), are ErrInvalidJSON.
//
// # Selected fields
//
// With fields, a JSON object body is fingerprinted by the selected members
// only, in the order the fields are given. A field is a path of member
// names separated by '.': payment.amount selects member amount of the
// object that is member payment of the body. In a name, '~' is written ~0
// and '.' is written ~1 (a~1b selects the member named "a.b"; a~0b the
// member "a~b"); a path is compared with member names after their JSON
// escapes are decoded. A field that is not UTF-8 or has another '~'
// sequence selects nothing (ValidateFields reports it). Paths never index
// arrays.
//
// For each field the hash input holds its text, then how its path ends:
//
//   - found: the canonical value, null included;
//   - missing: the level (0 for the first name) of the member that is
//     absent, so for payment.amount {} and {"payment":{}} differ, and both
//     differ from {"payment":{"amount":null}};
//   - not an object: the level and the canonical value found where an
//     object was needed (an array, a string, null ...), whole, so two
//     bodies that differ there are two requests.
//
// The whole body must still be valid, with no name repeated in any object.
// Only the values written are subject to the number guard. A JSON body that
// is not an object, or in which no field's path is found, is fingerprinted
// whole, like a body of any other shape, so that requests the route did not
// expect never share a fingerprint.
//
// A form body is fingerprinted by the values of the named keys: a field is
// a key compared byte for byte, '.' and '~' included (forms have no nesting).
// A missing key has no values, which differs from one empty value; a form
// with none of the keys is fingerprinted whole. Raw bodies ignore fields.
package fingerprint

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
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
	kindEncoded    byte = 7 // in a content coding not decoded: the codings, then raw bytes
)

// domain is the layout version; see "Versions" in the package comment.
const domain = "idem fingerprint v2\n"

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

// Input is one request as the fingerprint sees it.
type Input struct {
	// Method is the request method, compared byte for byte.
	Method string
	// Route is the route pattern the request matched (/v1/orders/{id}).
	Route string
	// Target is the concrete request target in origin form: the escaped
	// path, then '?' and the raw query when there is one, as returned by
	// (*url.URL).RequestURI. Sum canonicalises the query; see the package
	// comment. A protocol without one (gRPC) passes what names the call,
	// the full method name, or nothing, the same way on every retry.
	Target string
	// ContentType is the request's Content-Type header; it chooses how the
	// body is canonicalised.
	ContentType string
	// ContentEncoding names the content codings Body is still in, as the
	// Content-Encoding header lists them (normalised by the caller: one
	// spelling per coding), or is empty when Body is the content itself.
	// An encoded body is hashed raw; see Bodies in the package comment.
	ContentEncoding string
	// Body is the whole request body.
	Body []byte
	// Fields, when non-empty, selects the JSON members (by path: a.b) or
	// the form keys to fingerprint instead of the whole body; see "Selected
	// fields" and ValidateFields.
	Fields []string
}

// Sum returns the lowercase hex fingerprint of in: method, route, canonical
// target and canonical body. Its errors are the client errors listed above;
// the target never causes one.
func (h *Hasher) Sum(in Input) (string, error) {
	s := h.pool.Get().(*state)
	defer h.put(s)
	s.prepare(in.Method, in.Route, in.Target)
	var err error
	kind := mediaKind(in.ContentType)
	if in.ContentEncoding != "" {
		kind = kindEncoded
	}
	switch kind {
	case kindEncoded:
		s.begin(kindEncoded)
		s.writeUvarint(len(in.ContentEncoding))
		s.writeString(in.ContentEncoding)
		s.write(in.Body)
	case kindJSON:
		err = s.json(in.Body, in.Fields)
	case kindForm:
		err = s.form(in.Body, in.Fields)
	default:
		s.begin(kindRaw)
		s.write(in.Body)
	}
	if err != nil {
		return "", err
	}
	s.flush()
	var out [2 * sha256.Size]byte
	for i, b := range s.h.Sum(s.sum[:0]) {
		out[2*i], out[2*i+1] = hexPairs[2*int(b)], hexPairs[2*int(b)+1]
	}
	return string(out[:]), nil
}

// hexPairs holds the two lowercase hex digits of every byte value in turn:
// a fingerprint is written with one lookup per byte.
var hexPairs = func() (t [512]byte) {
	const digits = "0123456789abcdef"
	for b := range 256 {
		t[2*b], t[2*b+1] = digits[b>>4], digits[b&0xf]
	}
	return t
}()

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
	if cap(s.prefix) > 16*maxPooledItems {
		s.prefix, s.target = nil, nil
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
	spaced  bool              // JSON: the document has whitespace between tokens
	// JSON: work done on numbers, bounded per body (see maxSlowNumbers)
	slowNumbers, parsedNumbers int
	src                        []byte // JSON: the document
	prefix                     []byte // the hash input before the kind: domain, method, route, target
	target                     []byte // the canonical target
}

// sink receives canonical bytes; tests use it to capture them.
type sink interface{ Write([]byte) (int, error) }

// prepare builds the part of the hash input that precedes the body kind.
// The body parsers reuse s.pairs and s.scratch, so the canonical target is
// built first and copied into the prefix.
func (s *state) prepare(method, route, target string) {
	p := append(s.prefix[:0], domain...)
	p = binary.AppendUvarint(p, uint64(len(method)))
	p = append(p, method...)
	p = binary.AppendUvarint(p, uint64(len(route)))
	p = append(p, route...)
	s.target = s.appendTarget(s.target[:0], target)
	p = binary.AppendUvarint(p, uint64(len(s.target)))
	s.prefix = append(p, s.target...)
}

// begin resets the hash and writes the prefix for one kind of body.
func (s *state) begin(kind byte) {
	s.h.Reset()
	s.buf = s.buf[:0]
	s.write(s.prefix)
	s.writeByte(kind)
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
	if contentType == "application/json" {
		return kindJSON // by far the most common value, as sent
	}
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
