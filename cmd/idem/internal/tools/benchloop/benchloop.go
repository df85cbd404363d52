// Package benchloop runs the closed-loop load the benchmark commands
// measure: clients that each start a call as soon as their last one ends.
package benchloop

import (
	"sync"
	"time"
)

// Run runs clients closed loops of do for d: a client starts no call once
// d has passed, and a call is never cut. It returns the latency of every
// call and the time from the start until the last call ended. A call's
// error ends its client; Run then returns the first such error, with the
// latencies of the calls that succeeded.
func Run(clients int, d time.Duration, do func(client int) error) (lat []time.Duration, elapsed time.Duration, err error) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	t0 := time.Now()
	end := t0.Add(d)
	for client := range clients {
		wg.Go(func() {
			mine := make([]time.Duration, 0, 4096)
			var failed error
			for time.Now().Before(end) {
				s := time.Now()
				if failed = do(client); failed != nil {
					break
				}
				mine = append(mine, time.Since(s))
			}
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, mine...)
			if err == nil {
				err = failed
			}
		})
	}
	wg.Wait()
	return lat, time.Since(t0), err
}
