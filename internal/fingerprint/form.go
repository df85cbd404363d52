package fingerprint

import (
	"bytes"
	"fmt"
	"slices"
)

// pair is one decoded form pair: key and value are spans of state.scratch.
type pair struct {
	key, value span
}

type span struct{ start, end int32 }

// form writes the canonical form of an application/x-www-form-urlencoded
// body: every pair as uvarint(len(key)) key uvarint(len(value)) value, with
// keys and values decoded (so '+' and %20 agree), sorted by key bytes and,
// within one key, in body order. Decoded bytes need not be UTF-8: handlers
// see bytes, and length prefixes keep the encoding injective.
func (s *state) form(method, route string, body []byte, fields []string) error {
	if err := s.parseForm(body); err != nil {
		return err
	}
	if len(fields) == 0 || !s.anyFormKey(fields) {
		// Without a selected key present, the body is not what the route
		// expects (a JSON document sent as a form, say): fingerprint all of
		// it, or every such body would look the same.
		s.begin(method, route, kindForm)
		for _, p := range s.pairs {
			s.writeSpan(p.key)
			s.writeSpan(p.value)
		}
		return nil
	}
	// For each field: its name, the number of values, then each value.
	s.begin(method, route, kindFormFields)
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

// parseForm decodes body into s.pairs, sorted, with the rules of net/url's
// ParseQuery: pairs are separated by '&', empty ones are skipped, a pair
// without '=' has an empty value, '+' is a space, and a ';' or an invalid
// percent escape is an error.
func (s *state) parseForm(body []byte) error {
	if len(body) > 1<<30 {
		return fmt.Errorf("%w: body too large", ErrInvalidForm)
	}
	s.pairs = s.pairs[:0]
	s.scratch = s.scratch[:0]
	for rest := body; len(rest) > 0; {
		seg := rest
		if i := bytes.IndexByte(rest, '&'); i >= 0 {
			seg, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if len(seg) == 0 {
			continue
		}
		if bytes.IndexByte(seg, ';') >= 0 {
			return fmt.Errorf("%w: ';' in form body", ErrInvalidForm)
		}
		k, v := seg, []byte(nil)
		if i := bytes.IndexByte(seg, '='); i >= 0 {
			k, v = seg[:i], seg[i+1:]
		}
		var p pair
		var err error
		if p.key, err = s.unescape(k); err != nil {
			return err
		}
		if p.value, err = s.unescape(v); err != nil {
			return err
		}
		s.pairs = append(s.pairs, p)
	}
	slices.SortStableFunc(s.pairs, func(a, b pair) int {
		return bytes.Compare(s.bytes(a.key), s.bytes(b.key))
	})
	return nil
}

// unescape appends the query-unescaped form of b to s.scratch.
func (s *state) unescape(b []byte) (span, error) {
	start := len(s.scratch)
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '+':
			s.scratch = append(s.scratch, ' ')
		case '%':
			hi, ok1 := unhex(b, i+1)
			lo, ok2 := unhex(b, i+2)
			if !ok1 || !ok2 {
				return span{}, fmt.Errorf("%w: invalid percent escape %.3q", ErrInvalidForm, b[i:])
			}
			s.scratch = append(s.scratch, hi<<4|lo)
			i += 2
		default:
			s.scratch = append(s.scratch, c)
		}
	}
	return span{int32(start), int32(len(s.scratch))}, nil
}

func unhex(b []byte, i int) (byte, bool) {
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
