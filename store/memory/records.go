package memory

import "iter"

// records holds the records of one scope by key. The store keeps a map of
// them by scope: a key is then one string, whose hash and comparison are
// quicker than those of a pair, and whose map slot is smaller and has one
// pointer fewer for the garbage collector to trace. Every record of the
// scope shares its one copy of the scope string.
type records struct {
	scope string
	byKey map[string]*entry
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

// find returns the record k, nil if there is none.
func (s *Store) find(k id) *entry {
	if rs := s.in(k.scope, false); rs != nil {
		return rs.byKey[k.key]
	}
	return nil
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
	delete(rs.byKey, k.key)
	if len(rs.byKey) == 0 {
		delete(s.scopes, rs.scope)
		s.last = nil
	}
}

// all visits every record.
func (s *Store) all() iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		for _, rs := range s.scopes {
			for _, e := range rs.byKey {
				if !yield(e) {
					return
				}
			}
		}
	}
}

// count is the number of records.
func (s *Store) count() int {
	n := 0
	for _, rs := range s.scopes {
		n += len(rs.byKey)
	}
	return n
}
