// Package compat runs clients that idem's authors did not write against the
// idem proxy, through a relay that loses answers, and checks that every
// logical call ran exactly once and got its own answer.
//
// The clients: stripe-go (its current release), in front of Stripe's
// stripe-mock, and Python's requests with urllib3's Retry. Each variant
// runs on SQLite and PostgreSQL, under the profiles the client suits. The
// module is apart so that stripe-go never enters the graph of a library
// module; its tests build the idem binary and run it as users do.
//
// The default run is reduced (a few hundred calls in all);
// IDEM_COMPAT_CALLS sets the calls per variant (make compat runs 2,000),
// IDEM_COMPAT_DELAY the upstream's time per execution (20ms by default),
// and IDEM_COMPAT_PROXY_FLAGS adds flags to every proxy, to measure other
// settings (--wait 0, --in-progress-status 409).
package compat
