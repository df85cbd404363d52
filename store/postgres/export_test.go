package postgres

// ReserveReruns counts Reserve statements run again after a race (snapshot
// gap or lost transition), for tests that provoke those races.
func (s *Store) ReserveReruns() int64 { return s.reserveRe.Load() }

// Exported so the ceiling benchmark can run the store's own statements
// with no store code around them.
const (
	SQLReserve  = sqlReserve
	SQLComplete = sqlComplete
)
