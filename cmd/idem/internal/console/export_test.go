package console

import "time"

// SetNow replaces the clock sessions and sign-in throttling read.
func SetNow(h *Handler, now func() time.Time) { h.now = now }
