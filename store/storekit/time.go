package storekit

import (
	"time"

	"github.com/idem-go/idem/store"
)

// Micros converts a duration given to a store (a lease, a TTL, a delay, a
// grace) to whole microseconds, rounding up: a lease of 1ns is a lease of
// 1µs, never an empty one, and a lease is never cut short by the store's
// precision. Every store converts durations through it (or rounds the same
// way in its own language), so one duration means the same instant on every
// store. Zero and negative durations give 0.
func Micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	us := int64(d / store.Resolution)
	if d%store.Resolution != 0 {
		us++ // (d + store.Resolution - 1) would overflow near the largest duration
	}
	return us
}

// RoundUp is d rounded up to the store resolution, as Micros rounds it.
func RoundUp(d time.Duration) time.Duration { return time.Duration(Micros(d)) * store.Resolution }
