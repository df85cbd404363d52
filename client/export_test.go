package client

import "time"

// SetAttemptTimer makes t start the timers of AttemptTimeout with after
// instead of time.AfterFunc; after returns the timer's Stop.
func SetAttemptTimer(t *Transport, after func(d time.Duration, f func()) (stop func() bool)) {
	t.afterFunc = after
}
