package idem

import "net/http"

// Clock and Timer let tests step the engine's time.
type (
	Clock = clock
	Timer = timer
)

// SetClock makes e (and the engines later derived from it) read c.
func SetClock(e *Engine, c Clock) { e.clk = c }

// Protected reports whether e puts requests with method m through the
// protocol, and under which spelling.
func (e *Engine) Protected(m string) (string, bool) { return e.cfg.protected(m) }

// ReadBody is the middleware's body reader.
func ReadBody(r *http.Request, limit int64) ([]byte, error) { return new(bodyReader).read(r, limit) }

// WaitLost waits for the sweeps of the reservations whose answer was lost
// that e (or an engine sharing its list) started, and returns how many it
// still remembers.
func WaitLost(e *Engine) int {
	e.lost.sweeps.Wait()
	return e.LostReservations()
}
