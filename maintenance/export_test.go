package maintenance

// SetRand replaces the random source of m's jitter: draw(n) must return a
// value in [0, n).
func SetRand(m *Maintainer, draw func(n int64) int64) { m.randN = draw }

// ConfigOf returns m's configuration with its defaults applied.
func ConfigOf(m *Maintainer) Config { return m.cfg }
