package fingerprint

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// The JSON canonicaliser works in two passes over pooled scratch space.
// parse validates the document strictly and records every value as a node in
// document order; emit then writes the RFC 8785 form, sorting the members of
// each object through a stack of node indices. Nothing is copied out of the
// document: strings and numbers are re-encoded from the source as they are
// written, so each output byte is produced once whatever the nesting, and a
// typical small object costs no allocation at all. gowebpki/jcs builds a tree
// of Go strings instead (about fifty allocations for a 100-byte object); it
// remains the reference the tests compare against.

type nodeKind uint8

const (
	nNull nodeKind = iota
	nFalse
	nTrue
	nNumber
	nString
	nArray
	nObject
)

const (
	fEscaped  uint8 = 1 << iota // string holds a backslash escape
	fNonASCII                   // string holds a byte >= 0x80
)

// node is one JSON value. For strings, start and end bound the text between
// the quotes; for numbers, the number. next is the index of the first node
// after this value's subtree, so an object's members are the pairs (key,
// value) from index+1 up to next. An object's key nodes are strings.
type node struct {
	kind  nodeKind
	flags uint8
	start int32
	end   int32
	next  int32
}

type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("%s at byte %d", e.msg, e.off)
}

func (e *syntaxError) Unwrap() error { return ErrInvalidJSON }

func (s *state) json(body []byte, fields []string) error {
	if err := s.parse(body); err != nil {
		return err
	}
	if len(fields) == 0 && s.verbatim() {
		// The body is its own canonical form: emit would write it byte for
		// byte, so it is hashed as sent.
		s.begin(kindJSON)
		s.write(body)
		return nil
	}
	kind := kindJSON
	// Selecting needs an object with at least one selected member; anything
	// else is fingerprinted whole, so that bodies of another shape never
	// all look alike.
	selecting := len(fields) > 0 && s.nodes[0].kind == nObject && s.anyField(fields)
	if selecting {
		kind = kindJSONFields
	}
	s.begin(kind)
	var err error
	if selecting {
		err = s.emitFields(fields)
	} else {
		_, err = s.emitValue(0, true)
	}
	if err != nil {
		return err
	}
	if s.guarded {
		s.begin(kindJSONRaw)
		s.write(body)
	}
	return nil
}

// parse validates src as one RFC 8259 JSON text and fills s.nodes.
func (s *state) parse(src []byte) error {
	if len(src) > math.MaxInt32 {
		return &syntaxError{0, "document too large"}
	}
	s.src = src
	s.nodes = s.nodes[:0]
	s.guarded = false
	s.slowNumbers, s.parsedNumbers = 0, 0
	p := parser{src: src, nodes: s.nodes}
	err := p.value(0)
	if err == nil {
		p.skipSpace()
		if p.pos != len(src) {
			err = p.fail("unexpected data after the JSON value")
		}
	}
	s.nodes, s.spaced = p.nodes, p.spaced
	return err
}

// verbatim reports whether the parsed document is already in RFC 8785
// form, so that emitting it would reproduce it byte for byte: no
// whitespace between tokens, no escape in any string (an escape that RFC
// 8785 keeps, such as \n, still takes the long way), every number
// canonical as it stands, and the members of every object in strictly
// ascending order (which also rules out a repeated name). Clients that
// serialise a sorted map compactly (Go's encoding/json, most signing
// schemes) send such bodies; for them the second pass costs nothing.
func (s *state) verbatim() bool {
	if s.spaced {
		return false
	}
	for i, n := range s.nodes {
		switch n.kind {
		case nString:
			if n.flags&fEscaped != 0 {
				return false
			}
		case nNumber:
			if !isCanonicalNumber(s.src[n.start:n.end]) {
				return false
			}
		case nObject:
			prev := int32(-1)
			for k := int32(i) + 1; k < n.next; k = s.nodes[k+1].next {
				if prev >= 0 && s.compareNames(prev, k) >= 0 {
					return false
				}
				prev = k
			}
		}
	}
	return true
}

type parser struct {
	src   []byte
	pos   int
	nodes []node
	// spaced: whitespace was skipped somewhere between tokens.
	spaced bool
}

func (p *parser) fail(msg string) error {
	return &syntaxError{p.pos, msg}
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
			p.spaced = true
		default:
			return
		}
	}
}

func (p *parser) value(depth int) error {
	p.skipSpace()
	if p.pos >= len(p.src) {
		return p.fail("unexpected end of JSON")
	}
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		return p.str()
	case c == 't':
		return p.literal("true", nTrue)
	case c == 'f':
		return p.literal("false", nFalse)
	case c == 'n':
		return p.literal("null", nNull)
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return p.fail("unexpected character")
}

func (p *parser) push(kind nodeKind, start int) int {
	p.nodes = append(p.nodes, node{kind: kind, start: int32(start)})
	return len(p.nodes) - 1
}

func (p *parser) close(i int) {
	p.nodes[i].end = int32(p.pos)
	p.nodes[i].next = int32(len(p.nodes))
}

func (p *parser) literal(word string, kind nodeKind) error {
	if len(p.src)-p.pos < len(word) || string(p.src[p.pos:p.pos+len(word)]) != word {
		return p.fail("invalid literal")
	}
	i := p.push(kind, p.pos)
	p.pos += len(word)
	p.close(i)
	return nil
}

// number consumes the RFC 8259 grammar exactly:
// [ "-" ] ( "0" / digit1-9 *DIGIT ) [ "." 1*DIGIT ] [ ( "e" / "E" ) [ "+" / "-" ] 1*DIGIT ].
// What follows is checked by the caller, so "01" fails there on the "1".
func (p *parser) number() error {
	i := p.push(nNumber, p.pos)
	if p.src[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.src) && p.src[p.pos] == '0':
		p.pos++
	case p.pos < len(p.src) && p.src[p.pos] >= '1' && p.src[p.pos] <= '9':
		p.digits()
	default:
		return p.fail("invalid number")
	}
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return p.fail("invalid number")
		}
	}
	if p.pos < len(p.src) && (p.src[p.pos] == 'e' || p.src[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.src) && (p.src[p.pos] == '+' || p.src[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return p.fail("invalid number")
		}
	}
	p.close(i)
	return nil
}

func (p *parser) digits() int {
	start := p.pos
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		p.pos++
	}
	return p.pos - start
}

// str consumes a string starting at its opening quote. It rejects what
// RFC 8259 leaves undefined and decoders disagree on: invalid UTF-8 and lone
// surrogate escapes.
func (p *parser) str() error {
	p.pos++ // opening quote
	i := p.push(nString, p.pos)
	var flags uint8
	for p.pos < len(p.src) {
		// The common bytes in a tight loop on locals; the others below.
		src, pos := p.src, p.pos
		for pos < len(src) && plainByte[src[pos]] {
			pos++
		}
		p.pos = pos
		if pos == len(src) {
			break
		}
		switch c := src[pos]; {
		case c == '"':
			p.nodes[i].flags = flags
			p.close(i)
			p.pos++
			return nil
		case c < 0x20:
			return p.fail("control character in string")
		case c == '\\':
			flags |= fEscaped
			if err := p.escape(); err != nil {
				return err
			}
		default:
			flags |= fNonASCII
			r, size := utf8.DecodeRune(src[pos:])
			if r == utf8.RuneError && size <= 1 {
				return p.fail("invalid UTF-8 in string")
			}
			p.pos += size
		}
	}
	return p.fail("unterminated string")
}

// plainByte marks the bytes a string holds as they are: ASCII other than
// control characters, the quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func (p *parser) escape() error {
	if p.pos+1 >= len(p.src) {
		return p.fail("unterminated string")
	}
	switch p.src[p.pos+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		p.pos += 2
		return nil
	case 'u':
	default:
		return p.fail("invalid escape")
	}
	r, ok := hex4(p.src, p.pos+2)
	if !ok {
		return p.fail("invalid \\u escape")
	}
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return p.fail("lone low surrogate escape")
	case r >= 0xD800 && r <= 0xDBFF:
		lo, ok := hex4(p.src, p.pos+8)
		if !ok || p.src[p.pos+6] != '\\' || p.src[p.pos+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
			return p.fail("lone high surrogate escape")
		}
		p.pos += 12
	default:
		p.pos += 6
	}
	return nil
}

// hex4 decodes the four hex digits at src[i:]; false if they are not there.
func hex4(src []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(src) {
		return 0, false
	}
	var r rune
	for _, c := range src[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func (p *parser) array(depth int) error {
	if depth > MaxDepth {
		return p.fail("JSON nested too deep")
	}
	i := p.push(nArray, p.pos)
	p.pos++
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		p.close(i)
		return nil
	}
	for {
		if err := p.value(depth); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.src) {
			return p.fail("unterminated array")
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			p.close(i)
			return nil
		default:
			return p.fail("expected ',' or ']'")
		}
	}
}

func (p *parser) object(depth int) error {
	if depth > MaxDepth {
		return p.fail("JSON nested too deep")
	}
	i := p.push(nObject, p.pos)
	p.pos++
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		p.close(i)
		return nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != '"' {
			return p.fail("expected member name")
		}
		if err := p.str(); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			return p.fail("expected ':'")
		}
		p.pos++
		if err := p.value(depth); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.src) {
			return p.fail("unterminated object")
		}
		switch p.src[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			p.close(i)
			return nil
		default:
			return p.fail("expected ',' or '}'")
		}
	}
}

// emitValue writes the canonical form of node i when emit is set, and in any
// case checks its objects for duplicate names. It returns the index after
// the subtree. Recursion is bounded by MaxDepth, enforced by parse.
func (s *state) emitValue(i int32, emit bool) (int32, error) {
	n := s.nodes[i]
	switch n.kind {
	case nObject:
		return n.next, s.emitObject(i, emit)
	case nArray:
		if emit {
			s.writeByte('[')
		}
		for j := i + 1; j < n.next; {
			if emit && j > i+1 {
				s.writeByte(',')
			}
			var err error
			if j, err = s.emitValue(j, emit); err != nil {
				return 0, err
			}
		}
		if emit {
			s.writeByte(']')
		}
	case nString:
		if emit {
			s.emitString(n)
		}
	case nNumber:
		if emit {
			s.emitNumber(s.src[n.start:n.end])
		}
	case nTrue:
		if emit {
			s.writeString("true")
		}
	case nFalse:
		if emit {
			s.writeString("false")
		}
	case nNull:
		if emit {
			s.writeString("null")
		}
	}
	return n.next, nil
}

// sortMembers pushes the key indices of object i onto s.stack sorted by
// name in UTF-16 code units (RFC 8785 §3.2.3) and reports a duplicate name.
// The caller pops them by truncating the stack to base.
func (s *state) sortMembers(i int32) (base int, err error) {
	base = len(s.stack)
	end := s.nodes[i].next
	for j := i + 1; j < end; j = s.nodes[j+1].next {
		s.stack = append(s.stack, j)
	}
	members := s.stack[base:]
	slices.SortFunc(members, s.compareNames)
	for m := 1; m < len(members); m++ {
		if s.compareNames(members[m-1], members[m]) == 0 {
			return base, fmt.Errorf("%w: %.64q", ErrDuplicateKey, s.decodedName(members[m]))
		}
	}
	return base, nil
}

func (s *state) emitObject(i int32, emit bool) error {
	base, err := s.sortMembers(i)
	defer func() { s.stack = s.stack[:base] }()
	if err != nil {
		return err
	}
	if emit {
		s.writeByte('{')
	}
	for m := base; m < len(s.stack); m++ {
		k := s.stack[m]
		if emit {
			if m > base {
				s.writeByte(',')
			}
			s.emitString(s.nodes[k])
			s.writeByte(':')
		}
		// s.stack may be reallocated by nested objects: index it afresh.
		if _, err := s.emitValue(k+1, emit); err != nil {
			return err
		}
	}
	if emit {
		s.writeByte('}')
	}
	return nil
}

// How a field path ends; the byte values are part of the hash input.
const (
	pathMissing   byte = 0 // a member on the path is absent
	pathFound     byte = 1 // the whole path resolves
	pathNotObject byte = 2 // a value on the path is not an object
)

// resolve follows a field path from the object at node 0. It returns how the
// path ends, the level (index of the path segment) where it stopped, and the
// value node reached: the selected value, or the value that is not an
// object. A field that is not a valid path matches nothing.
func (s *state) resolve(field string) (end byte, level int, value int32) {
	if validateField(field) != nil {
		return pathMissing, 0, 0
	}
	for rest := field; ; level++ {
		seg, tail, more := strings.Cut(rest, ".")
		if s.nodes[value].kind != nObject {
			return pathNotObject, level, value
		}
		k, ok := s.member(value, seg)
		if !ok {
			return pathMissing, level, 0
		}
		value = k + 1
		if !more {
			return pathFound, level, value
		}
		rest = tail
	}
}

// member finds the member of object obj named by the path segment seg (in
// which ~0 and ~1 stand for '~' and '.'). Objects hold no duplicate names
// once validated, so the first match is the only one.
func (s *state) member(obj int32, seg string) (int32, bool) {
	plain := strings.IndexByte(seg, '~') < 0
	for k, end := obj+1, s.nodes[obj].next; k < end; k = s.nodes[k+1].next {
		n := s.nodes[k]
		if plain && n.flags&fEscaped == 0 {
			// UTF-8 on both sides, nothing to decode: bytes decide.
			if string(s.src[n.start:n.end]) == seg {
				return k, true
			}
			continue
		}
		if compareUTF16(s.nameRunes(k), segmentRunes(seg)) == 0 {
			return k, true
		}
	}
	return 0, false
}

// anyField reports whether one of fields resolves in the object at node 0.
func (s *state) anyField(fields []string) bool {
	for _, f := range fields {
		if end, _, _ := s.resolve(f); end == pathFound {
			return true
		}
	}
	return false
}

// emitFields writes the selected members of the object at node 0: for each
// field its length-prefixed text, then how its path ends: pathFound and the
// canonical value, pathMissing and the level of the absent member, or
// pathNotObject, the level and the canonical value found instead of an
// object. The whole document is still checked for duplicate names.
func (s *state) emitFields(fields []string) error {
	if _, err := s.emitValue(0, false); err != nil {
		return err
	}
	for _, f := range fields {
		s.writeUvarint(len(f))
		s.writeString(f)
		end, level, value := s.resolve(f)
		s.writeByte(end)
		if end != pathFound {
			s.writeUvarint(level)
		}
		if end != pathMissing {
			if _, err := s.emitValue(value, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// ValidateFields reports the first field that is not a valid path: a path
// is UTF-8, its segments separated by '.', with '~' written ~0 and '.' in a
// member name written ~1. Sum does not fail on an invalid field, which
// selects nothing; a caller should reject it when it is configured.
func ValidateFields(fields []string) error {
	for _, f := range fields {
		if err := validateField(f); err != nil {
			return err
		}
	}
	return nil
}

func validateField(f string) error {
	if !utf8.ValidString(f) {
		return fmt.Errorf("fingerprint: field %q is not UTF-8", f)
	}
	for i := 0; i < len(f); i++ {
		if f[i] == '~' {
			if i+1 == len(f) || (f[i+1] != '0' && f[i+1] != '1') {
				return fmt.Errorf("fingerprint: field %q: '~' must be followed by 0 or 1", f)
			}
			i++
		}
	}
	return nil
}

// emitString writes a string node with RFC 8785 §3.2.2.2 escaping: only '"',
// '\' and control characters are escaped, the latter as \b \t \n \f \r or
// \u00xx in lowercase; everything else, '/' and non-ASCII included, is
// written as UTF-8.
func (s *state) emitString(n node) {
	raw := s.src[n.start:n.end]
	s.writeByte('"')
	if n.flags&fEscaped == 0 {
		// parse guarantees no '"', '\' or control character is left.
		s.write(raw)
		s.writeByte('"')
		return
	}
	for i := 0; i < len(raw); {
		j := i
		for j < len(raw) && raw[j] != '\\' {
			j++
		}
		s.write(raw[i:j])
		if j == len(raw) {
			break
		}
		r, size := unescape(raw, j)
		i = j + size
		s.emitRune(r)
	}
	s.writeByte('"')
}

func (s *state) emitRune(r rune) {
	switch r {
	case '"':
		s.writeString(`\"`)
	case '\\':
		s.writeString(`\\`)
	case '\b':
		s.writeString(`\b`)
	case '\f':
		s.writeString(`\f`)
	case '\n':
		s.writeString(`\n`)
	case '\r':
		s.writeString(`\r`)
	case '\t':
		s.writeString(`\t`)
	default:
		if r < 0x20 {
			const hexDigits = "0123456789abcdef"
			s.writeString(`\u00`)
			s.writeByte(hexDigits[r>>4])
			s.writeByte(hexDigits[r&0xF])
			return
		}
		if len(s.buf)+utf8.UTFMax > bufSize {
			s.flush()
		}
		s.buf = utf8.AppendRune(s.buf, r)
	}
}

// unescape decodes the escape sequence at raw[i] (a '\'), already validated
// by parse, and returns the rune and the length of the sequence.
func unescape(raw []byte, i int) (rune, int) {
	switch raw[i+1] {
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r, _ := hex4(raw, i+2)
		if utf16.IsSurrogate(r) {
			lo, _ := hex4(raw, i+8)
			return utf16.DecodeRune(r, lo), 12
		}
		return r, 6
	}
	return rune(raw[i+1]), 2 // '"', '\\', '/'
}

// runeIter yields the decoded runes of a member name or of a field path
// segment, for comparing names without building them.
type runeIter struct {
	raw     []byte
	str     string
	escaped bool // raw holds JSON escapes; str holds ~0 and ~1
	i       int
}

func (s *state) nameRunes(k int32) runeIter {
	n := s.nodes[k]
	return runeIter{raw: s.src[n.start:n.end], escaped: n.flags&fEscaped != 0}
}

func segmentRunes(seg string) runeIter {
	return runeIter{str: seg, escaped: strings.IndexByte(seg, '~') >= 0}
}

func (it *runeIter) next() (rune, bool) {
	if it.raw == nil {
		if it.i >= len(it.str) {
			return 0, false
		}
		if it.escaped && it.str[it.i] == '~' {
			// Checked by ValidateFields: ~0 or ~1.
			it.i += 2
			if it.str[it.i-1] == '0' {
				return '~', true
			}
			return '.', true
		}
		r, size := utf8.DecodeRuneInString(it.str[it.i:])
		it.i += size
		return r, true
	}
	if it.i >= len(it.raw) {
		return 0, false
	}
	c := it.raw[it.i]
	switch {
	case c == '\\' && it.escaped:
		r, size := unescape(it.raw, it.i)
		it.i += size
		return r, true
	case c < utf8.RuneSelf:
		it.i++
		return rune(c), true
	}
	r, size := utf8.DecodeRune(it.raw[it.i:])
	it.i += size
	return r, true
}

// compareNames orders member names by their UTF-16 code units.
func (s *state) compareNames(a, b int32) int {
	na, nb := s.nodes[a], s.nodes[b]
	switch (na.flags | nb.flags) &^ fNonASCII {
	case 0:
		if na.flags|nb.flags == 0 {
			// Plain ASCII: bytes are code units.
			return bytes.Compare(s.src[na.start:na.end], s.src[nb.start:nb.end])
		}
		return compareUTF8AsUTF16(s.src[na.start:na.end], s.src[nb.start:nb.end])
	}
	return compareUTF16(s.nameRunes(a), s.nameRunes(b))
}

// compareUTF8AsUTF16 orders two valid UTF-8 strings by their UTF-16 code
// units without decoding them. Byte order is code point order; the two
// differ only where a supplementary character (lead byte F0-F4, first unit
// a high surrogate) meets one in U+E000-U+FFFF (lead byte EE or EF). The
// first differing byte is at the same offset in one character of each, so
// it is either a lead byte in both or a continuation byte after equal leads.
func compareUTF8AsUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return cmp.Compare(len(a), len(b))
	}
	ca, cb := a[i], b[i]
	switch {
	case ca >= 0xF0 && (cb == 0xEE || cb == 0xEF):
		return -1
	case cb >= 0xF0 && (ca == 0xEE || ca == 0xEF):
		return 1
	}
	return cmp.Compare(ca, cb)
}

// compareUTF16 compares two rune sequences as RFC 8785 sorts names: by UTF-16
// code units. That differs from code point order only between a supplementary
// character (first unit a high surrogate, 0xD800-0xDBFF) and one in
// U+E000-U+FFFF, so comparing first units, then code points, is exact.
func compareUTF16(a, b runeIter) int {
	for {
		ra, okA := a.next()
		rb, okB := b.next()
		switch {
		case !okA && !okB:
			return 0
		case !okA:
			return -1
		case !okB:
			return 1
		case ra == rb:
			continue
		}
		ua, ub := firstUnit(ra), firstUnit(rb)
		if ua == ub {
			ua, ub = ra, rb // both supplementary: surrogate pairs sort as code points
		}
		if ua < ub {
			return -1
		}
		return 1
	}
}

func firstUnit(r rune) rune {
	if r >= 0x10000 {
		r1, _ := utf16.EncodeRune(r)
		return r1
	}
	return r
}

func (s *state) decodedName(k int32) string {
	it := s.nameRunes(k)
	var b []byte
	for r, ok := it.next(); ok; r, ok = it.next() {
		b = utf8.AppendRune(b, r)
	}
	return string(b)
}

// Limits that let emitNumber decide most numbers from their decimal digits
// alone. A number is 0.d1d2...dn × 10^point (see decimal).
const (
	// maxShortestDigits: the shortest decimal that round-trips a double
	// has at most 17 significant digits, so a number with more can never
	// equal its canonical form.
	maxShortestDigits = 17
	// maxPoint: 10^309 exceeds every double.
	maxPoint = 309
	// minPoint: a value below 10^-324 is less than half the smallest
	// subnormal and rounds to zero.
	minPoint = -323
	// subnormalPoint: a value below 10^-307 may be subnormal, which
	// strconv parses with arbitrary-precision decimal arithmetic, some
	// thousand times slower than a normal double.
	subnormalPoint = -307
	// maxSlowNumbers bounds the subnormal candidates parsed per body; past
	// it the body is hashed raw, which is always safe, so a megabyte of
	// 5e-324 costs what a megabyte of integers does.
	maxSlowNumbers = 64
)

// emitNumber writes the RFC 8785 form of a number, or marks the document
// guarded when that form would not denote exactly the same decimal value.
func (s *state) emitNumber(num []byte) {
	if s.guarded {
		return // the body is hashed raw: its numbers need no more work
	}
	if isCanonicalNumber(num) {
		s.write(num)
		return
	}
	d := parseDecimal(num)
	switch {
	case d.n == 0:
		if d.neg {
			s.guarded = true // -0: a float64 handler tells it from 0
		} else {
			s.writeByte('0')
		}
		return
	case d.n > maxShortestDigits || d.point > maxPoint || d.point < minPoint:
		s.guarded = true
		return
	case d.point <= subnormalPoint:
		if s.slowNumbers++; s.slowNumbers > maxSlowNumbers {
			s.guarded = true
			return
		}
	}
	s.parsedNumbers++
	// At most 17 digits and a short exponent: strconv never sees a long
	// text, and the conversion needs no allocation.
	var short [32]byte
	f, err := strconv.ParseFloat(string(d.appendShort(short[:0])), 64)
	if err != nil {
		// Above the largest double; the grammar was checked by parse.
		s.guarded = true
		return
	}
	canon, err := jcs.NumberToJSON(f)
	if err != nil || !equalDecimal(d, parseDecimal(canon)) {
		s.guarded = true
		return
	}
	s.writeString(canon)
}

// isCanonicalNumber reports whether num is already the RFC 8785 (ECMAScript)
// form of its own value, which then needs no float64 round trip: an optional
// '-', no exponent, no trailing zero in the fraction, at most 15 significant
// digits, and a magnitude of at least 1e-6 (or exactly 0). Every decimal of at
// most 15 significant digits in the normal double range converts to a
// distinct double, and the shortest decimal that converts back to that double
// is then the input itself, so formatting would reproduce it byte for byte;
// FuzzCanonicalNumber checks this against jcs.NumberToJSON.
func isCanonicalNumber(num []byte) bool {
	if len(num) == 0 || len(num) > 24 {
		return false
	}
	i := 0
	neg := num[0] == '-'
	if neg {
		i++
	}
	intStart := i
	for i < len(num) && num[i] >= '0' && num[i] <= '9' {
		i++
	}
	intDigits := num[intStart:i]
	var frac []byte
	if i < len(num) {
		if num[i] != '.' {
			return false // exponent
		}
		frac = num[i+1:]
		for _, c := range frac {
			if c < '0' || c > '9' {
				return false
			}
		}
		if len(frac) == 0 || frac[len(frac)-1] == '0' {
			return false
		}
	}
	if len(intDigits) == 1 && intDigits[0] == '0' {
		if len(frac) == 0 {
			return !neg // "0"; "-0" is guarded
		}
		lead := 0
		for lead < len(frac) && frac[lead] == '0' {
			lead++
		}
		return lead <= 5 && len(frac)-lead <= 15
	}
	return len(intDigits)+len(frac) <= 15
}

// sameDecimal reports whether two JSON number texts denote exactly the same
// decimal value, sign of zero included. It compares normalised digit strings
// and exponents, so it costs O(len) with no allocation whatever the exponent
// (1e99999999 never expands).
func sameDecimal[A, B string | []byte](a A, b B) bool {
	return equalDecimal(parseDecimal(a), parseDecimal(b))
}

func equalDecimal[A, B string | []byte](da decimal[A], db decimal[B]) bool {
	if da.neg != db.neg || da.n != db.n {
		return false
	}
	if da.n == 0 {
		return true
	}
	if da.point != db.point {
		return false
	}
	for k := 0; k < da.n; k++ {
		if da.digit(k) != db.digit(k) {
			return false
		}
	}
	return true
}

// decimal is the value 0.d1d2...dn × 10^point, where the digits d are
// intDigits followed by frac with sigStart leading zeros skipped and n
// significant digits kept (trailing zeros dropped). n == 0 means zero.
type decimal[T string | []byte] struct {
	neg       bool
	intDigits T
	frac      T
	sigStart  int
	n         int
	point     int64
}

func (d *decimal[T]) digit(k int) byte {
	k += d.sigStart
	if k < len(d.intDigits) {
		return d.intDigits[k]
	}
	return d.frac[k-len(d.intDigits)]
}

// appendShort appends the value as its significant digits and an exponent
// (123e-5), the shortest text strconv needs; the point is saturated, so it
// is meant for the normal range.
func (d *decimal[T]) appendShort(b []byte) []byte {
	if d.n == 0 {
		return append(b, '0')
	}
	if d.neg {
		b = append(b, '-')
	}
	for k := 0; k < d.n; k++ {
		b = append(b, d.digit(k))
	}
	b = append(b, 'e')
	return strconv.AppendInt(b, d.point-int64(d.n), 10)
}

// parseDecimal normalises a number in the JSON grammar (a '+' in the
// exponent allowed, as jcs.NumberToJSON writes).
func parseDecimal[T string | []byte](s T) decimal[T] {
	var d decimal[T]
	i := 0
	if i < len(s) && s[i] == '-' {
		d.neg = true
		i++
	}
	start := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	d.intDigits = s[start:i]
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		d.frac = s[start:i]
	}
	var exp int64
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			expNeg = s[i] == '-'
			i++
		}
		for ; i < len(s); i++ {
			// Saturate: any exponent this large makes a non-zero value
			// unrepresentable, so the exact figure no longer matters.
			if exp < 1<<40 {
				exp = exp*10 + int64(s[i]-'0')
			}
		}
		if expNeg {
			exp = -exp
		}
	}
	total := len(d.intDigits) + len(d.frac)
	for d.sigStart < total && d.digit(0) == '0' {
		d.sigStart++
	}
	end := total
	for end > d.sigStart {
		if k := end - 1; (k < len(d.intDigits) && d.intDigits[k] == '0') ||
			(k >= len(d.intDigits) && d.frac[k-len(d.intDigits)] == '0') {
			end--
			continue
		}
		break
	}
	d.n = end - d.sigStart
	d.point = int64(len(d.intDigits)-d.sigStart) + exp
	return d
}
