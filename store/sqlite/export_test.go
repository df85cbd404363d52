package sqlite

// GroupQueue reports the free writer slot and the calls waiting for it.
func (s *Store) GroupQueue() (free, pending int) { return s.group.Queue() }

// GroupBatched reports the calls that ran in batches of two or more.
func (s *Store) GroupBatched() int64 { return s.group.Batched() }
