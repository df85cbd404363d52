package memory

import (
	"iter"

	"github.com/idem-go/idem/store"
)

// records holds the records of one scope by key. The store keeps a map of
// them by scope: a key is then one string, whose hash and comparison are
// quicker than those of a pair, and whose map slot is smaller and has one
// pointer fewer for the garbage collector to trace. Every record of the
// scope shares its one copy of the scope string.
//
// A record is either an entry in byKey or a cold record (see cold), found
// through the scope's index of cold records by the hash of its key.
type records struct {
	scope  string
	byKey  map[string]*entry
	cold   map[uint64]int32 // hash of a key: the first slot of its chain
	frozen int              // the cold records
}

// in returns the records of scope, created if create and absent; nil if
// absent otherwise. Consecutive calls of one operation find the scope of
// the last call without a lookup.
func (s *Store) in(scope string, create bool) *records {
	if l := s.last; l != nil && l.scope == scope {
		return l
	}
	rs := s.scopes[scope]
	if rs == nil {
		if !create {
			return nil
		}
		rs = &records{scope: scope, byKey: make(map[string]*entry)}
		s.scopes[scope] = rs
	}
	s.last = rs
	return rs
}

// lookup finds the record k for reading: its entry, or else its scope's
// records and its cold slot (-1 when it is not cold). Neither when there is
// no such record.
func (s *Store) lookup(k id) (e *entry, rs *records, slot int32) {
	if rs = s.in(k.scope, false); rs == nil {
		return nil, nil, -1
	}
	if e = rs.byKey[k.key]; e != nil {
		return e, rs, -1
	}
	return nil, rs, s.cold.find(rs, k.key)
}

// read returns the record lookup found, and whether it found one.
func (s *Store) read(e *entry, rs *records, slot int32) (store.Record, bool) {
	switch {
	case e != nil:
		return e.record(), true
	case slot >= 0:
		return s.cold.record(rs, slot), true
	}
	return store.Record{}, false
}

// hot returns the entry of the record k, nil if it is cold or absent.
// Records in progress are never cold.
func (s *Store) hot(k id) *entry {
	if rs := s.in(k.scope, false); rs != nil {
		return rs.byKey[k.key]
	}
	return nil
}

// find returns the record k as an entry, to be changed: a cold record is
// made an entry again (see thaw). Nil if there is no such record.
func (s *Store) find(k id) *entry {
	e, rs, i := s.lookup(k)
	if e == nil && i >= 0 {
		e = s.thaw(rs, i)
	}
	return e
}

// thaw makes the cold record in slot i of rs an entry, with its text
// copied out of the chunk, which it would otherwise keep alive.
func (s *Store) thaw(rs *records, i int32) *entry {
	e := new(entry)
	s.cold.entry(rs, i, e, true)
	e.packed = false
	e.pack()
	s.cold.remove(rs, i)
	rs.byKey[e.key] = e
	if s.tenants != nil {
		s.index(id{e.scope, e.key}, e)
	}
	return e
}

// freeze makes e, just completed, a cold record if it is of a kind kept
// cold (see cold.freeze), and reports whether it did.
func (s *Store) freeze(e *entry) bool {
	rs := s.in(e.scope, false)
	if !s.cold.freeze(rs, e) {
		return false
	}
	delete(rs.byKey, e.key)
	s.unindex(id{e.scope, e.key}, e.tenant)
	return true
}

// insert stores e under k, over any record there, keyed by e.key (the
// same string as k.key, or a copy of it): a map assignment to an equal key
// replaces the key the map holds.
func (s *Store) insert(k id, e *entry) {
	rs := s.in(k.scope, true)
	e.scope = rs.scope
	rs.byKey[e.key] = e
}

// remove deletes the record k, and its scope once that has no record.
func (s *Store) remove(k id) {
	rs := s.in(k.scope, false)
	if rs == nil {
		return
	}
	if _, ok := rs.byKey[k.key]; ok {
		delete(rs.byKey, k.key)
	} else if i := s.cold.find(rs, k.key); i >= 0 {
		s.cold.remove(rs, i)
	}
	if len(rs.byKey) == 0 && rs.frozen == 0 {
		delete(s.scopes, rs.scope)
		s.last = nil
	}
}

// all visits every record. A cold record is visited as an entry marked
// frozen that is valid only until the next one: a caller that keeps it
// copies it, and one that changes it first makes it an entry (find).
// Without header, a cold record's header kept in its text is not read
// (see cold.entry).
func (s *Store) all(header bool) iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		var c entry
		for _, rs := range s.scopes {
			for _, e := range rs.byKey {
				if !yield(e) {
					return
				}
			}
			for _, head := range rs.cold {
				for i := head; i >= 0; i = s.cold.at(i).next {
					s.cold.entry(rs, i, &c, header)
					c.frozen = true
					if !yield(&c) {
						return
					}
				}
			}
		}
	}
}

// count is the number of records.
func (s *Store) count() int {
	n := 0
	for _, rs := range s.scopes {
		n += len(rs.byKey) + rs.frozen
	}
	return n
}
