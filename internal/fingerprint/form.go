package fingerprint

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
)

// pair is one form or query pair: key and value are spans of state.scratch.
// raw marks a query pair kept as sent (see parsePairs).
type pair struct {
	key, value span
	raw        bool
}

type span struct{ start, end int32 }

// maxPairsLen bounds what parsePairs accepts, so spans fit in int32.
const maxPairsLen = 1 << 30

// form writes the canonical form of an application/x-www-form-urlencoded
// body: every pair as uvarint(len(key)) key uvarint(len(value)) value, with
// keys and values decoded (so '+' and %20 agree), sorted by key bytes and,
// within one key, in body order. Decoded bytes need not be UTF-8: handlers
// see bytes, and length prefixes keep the encoding injective.
func (s *state) form(body []byte, fields []string) error {
	if len(body) > maxPairsLen {
		return fmt.Errorf("%w: body too large", ErrInvalidForm)
	}
	if err := parsePairs(s, body, false); err != nil {
		return err
	}
	if len(fields) == 0 || !s.anyFormKey(fields) {
		// Without a selected key present, the body is not what the route
		// expects (a JSON document sent as a form, say): fingerprint all of
		// it, or every such body would look the same.
		s.begin(kindForm)
		for _, p := range s.pairs {
			s.writeSpan(p.key)
			s.writeSpan(p.value)
		}
		return nil
	}
	// For each field: its name, the number of values, then each value.
	s.begin(kindFormFields)
	for _, f := range fields {
		s.writeUvarint(len(f))
		s.writeString(f)
		lo, _ := slices.BinarySearchFunc(s.pairs, f, func(p pair, f string) int {
			return compareBytesString(s.bytes(p.key), f)
		})
		hi := lo
		for hi < len(s.pairs) && string(s.bytes(s.pairs[hi].key)) == f {
			hi++
		}
		s.writeUvarint(hi - lo)
		for _, p := range s.pairs[lo:hi] {
			s.writeSpan(p.value)
		}
	}
	return nil
}

// Target query pair markers; their values are part of the hash input.
const (
	pairDecoded byte = 0
	pairRaw     byte = 1 // a segment with an invalid escape or ';', as sent
	queryWhole  byte = 2 // a query too large to split, as sent
)

// appendTarget appends the canonical form of a request target (escaped path,
// then '?' and the raw query) to dst; the package comment describes it.
func (s *state) appendTarget(dst []byte, target string) []byte {
	path, query, _ := strings.Cut(target, "?")
	t := binary.AppendUvarint(dst, uint64(len(path)))
	t = append(t, path...)
	if len(query) > maxPairsLen {
		t = append(t, queryWhole)
		t = binary.AppendUvarint(t, uint64(len(query)))
		return append(t, query...)
	}
	parsePairs(s, query, true) // lenient: never fails
	for _, p := range s.pairs {
		flag := pairDecoded
		if p.raw {
			flag = pairRaw
		}
		t = append(t, flag)
		for _, sp := range [2]span{p.key, p.value} {
			t = binary.AppendUvarint(t, uint64(sp.end-sp.start))
			t = append(t, s.bytes(sp)...)
		}
	}
	return t
}

// anyFormKey reports whether one of fields is a key of the parsed form.
func (s *state) anyFormKey(fields []string) bool {
	for _, f := range fields {
		if _, found := slices.BinarySearchFunc(s.pairs, f, func(p pair, f string) int {
			return compareBytesString(s.bytes(p.key), f)
		}); found {
			return true
		}
	}
	return false
}

func (s *state) bytes(sp span) []byte { return s.scratch[sp.start:sp.end] }

func (s *state) writeSpan(sp span) {
	s.writeUvarint(int(sp.end - sp.start))
	s.write(s.bytes(sp))
}

// parsePairs decodes src, at most maxPairsLen bytes, into s.pairs, sorted
// stably by key, with the rules of net/url's ParseQuery: pairs are separated
// by '&', empty ones are skipped, a pair without '=' has an empty value and
// '+' is a space. A segment with a ';' or an invalid percent escape is an
// ErrInvalidForm, unless lenient, when it is kept undecoded and marked raw.
func parsePairs[T string | []byte](s *state, src T, lenient bool) error {
	s.pairs = s.pairs[:0]
	s.scratch = s.scratch[:0]
	for rest := src; len(rest) > 0; {
		seg := rest
		if i := indexByte(rest, '&'); i >= 0 {
			seg, rest = rest[:i], rest[i+1:]
		} else {
			rest = rest[len(rest):]
		}
		if len(seg) == 0 {
			continue
		}
		k, v := seg, seg[len(seg):]
		if i := indexByte(seg, '='); i >= 0 {
			k, v = seg[:i], seg[i+1:]
		}
		start := len(s.scratch)
		var p pair
		var bad int // offset in seg of the first ';' or invalid escape, or -1
		if bad = indexByte(seg, ';'); bad < 0 {
			var ok bool
			if p.key, ok = unescapePair(s, k); !ok {
				bad = badEscape(k)
			} else if p.value, ok = unescapePair(s, v); !ok {
				bad = len(k) + 1 + badEscape(v)
			}
		}
		if bad >= 0 {
			if !lenient {
				if seg[bad] == ';' {
					return fmt.Errorf("%w: ';' in form body", ErrInvalidForm)
				}
				return fmt.Errorf("%w: invalid percent escape %.3q", ErrInvalidForm, string(seg[bad:min(bad+3, len(seg))]))
			}
			s.scratch = s.scratch[:start]
			p = pair{key: appendSpan(s, k), value: appendSpan(s, v), raw: true}
		}
		s.pairs = append(s.pairs, p)
	}
	slices.SortStableFunc(s.pairs, func(a, b pair) int {
		return bytes.Compare(s.bytes(a.key), s.bytes(b.key))
	})
	return nil
}

func indexByte[T string | []byte](b T, c byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func appendSpan[T string | []byte](s *state, b T) span {
	start := len(s.scratch)
	s.scratch = append(s.scratch, b...)
	return span{int32(start), int32(len(s.scratch))}
}

// unescapePair appends the query-unescaped form of b to s.scratch; false if b
// holds an invalid percent escape.
func unescapePair[T string | []byte](s *state, b T) (span, bool) {
	start := len(s.scratch)
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '+':
			s.scratch = append(s.scratch, ' ')
		case '%':
			hi, ok1 := unhex(b, i+1)
			lo, ok2 := unhex(b, i+2)
			if !ok1 || !ok2 {
				return span{}, false
			}
			s.scratch = append(s.scratch, hi<<4|lo)
			i += 2
		default:
			s.scratch = append(s.scratch, c)
		}
	}
	return span{int32(start), int32(len(s.scratch))}, true
}

// badEscape returns the offset of the first invalid percent escape in b.
func badEscape[T string | []byte](b T) int {
	for i := 0; i < len(b); i++ {
		if b[i] == '%' {
			_, ok1 := unhex(b, i+1)
			_, ok2 := unhex(b, i+2)
			if !ok1 || !ok2 {
				return i
			}
			i += 2
		}
	}
	return -1
}

func unhex[T string | []byte](b T, i int) (byte, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func compareBytesString(b []byte, s string) int {
	for i := 0; i < len(b) && i < len(s); i++ {
		if b[i] != s[i] {
			if b[i] < s[i] {
				return -1
			}
			return 1
		}
	}
	return len(b) - len(s)
}
