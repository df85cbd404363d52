// Package client retries state-changing HTTP requests safely, by sending
// each one under an idempotency key that every retry repeats.
//
// A POST that times out or whose connection drops may or may not have been
// executed; retrying it blindly can charge a card twice. Sent under an
// Idempotency-Key, the retry is safe against a server that implements the
// header (an idem middleware or the idem proxy): if the first attempt ran,
// the retry gets its stored answer back instead of running again.
//
// # Using it
//
// Transport is an http.RoundTripper; New wraps one in an http.Client:
//
//	c := client.New(&client.Transport{MaxAttempts: 4})
//	resp, err := c.Post(url, "application/json", strings.NewReader(body))
//	if err == nil && client.Replayed(resp) {
//		// the first attempt had already been executed; this is its answer
//	}
//
// For each POST or PATCH (Transport.Methods) without the header, the
// transport makes a fresh key, a version 4 UUID from crypto/rand sent as
// an RFC 8941 string ("Idempotency-Key: "8e03978e-..."), and sends the
// same key on every attempt. A key the caller set is kept as it is: set
// one yourself, and store it with the business object, when the request
// must survive a restart of the caller too; NewKey makes one. Other
// methods pass through untouched, once.
//
// # What is retried
//
//   - a transport error: the connection was refused, reset, or cut, also
//     after the request was sent (with the key that is exactly the case a
//     retry makes safe: if the server ran it, the retry gets the replay).
//     Certificate and TLS errors and unknown hosts are not retried;
//   - the key's first request still running, in every form the idem
//     middleware and proxy answer it: 409 or 202 whose problem type ends in
//     #request-in-progress (202 is InProgressStatus's other choice: it is
//     a deferral, not the answer), and, under the Stripe profile, 429 with
//     the code lock_timeout or 409 idempotency_key_in_use;
//   - any other 409 carrying Retry-After, except 409 #outcome-unknown (see
//     below);
//   - 429 and 503;
//   - 502 whose problem type ends in #upstream-unreachable: the idem proxy
//     could not send the request to its upstream, nothing ran and the key
//     was released.
//
// A replayed answer (Idempotent-Replayed: true) is never retried, whatever
// its status: it is the stored answer, which every retry with the key gets
// again (a server that keeps 5xx replays a 503).
//
// Nothing else is: not 422 (the key was used with another request), not
// 400 or any other 4xx, not other 2xx or 3xx, not other 5xx. Other 502s
// and every 504 are returned: a gateway error says the gateway lost touch
// with what is behind it, not that nothing happened there. The server
// releases a key on a 5xx, so a retry would run the request again; after
// the proxy's own 502 #upstream-failed the record is unknown instead (a
// retry gets 409 #outcome-unknown), and an application's 502 or 504 may
// follow a side effect only the application knows about. A 409 #outcome-unknown
// means the server cannot tell whether the first request ran and will not
// run it again until it has found out (reconciliation, minutes or more);
// retrying at the usual pace only burns attempts, so it is returned to the
// caller unless Transport.RetryUnknown asks for a slow retry.
//
// # Pace and bounds
//
// The wait before retry n is BaseDelay·2ⁿ⁻¹, at most MaxBackoff, passed
// through Jitter (by default a uniform draw from its upper half), and never
// shorter than the server's Retry-After (delay-seconds or an HTTP-date).
// Retrying stops, and the last answer is returned as it is (a response,
// or the last error wrapped in *Error), when MaxAttempts attempts were
// made, when the next wait would take the waits' sum past MaxDelay, or
// when it would end after the request context's deadline. A context that
// ends during a wait ends the call with its error.
//
// # Timeouts
//
// http.Client.Timeout, like a deadline on the request's context, bounds the
// whole call: every attempt and every wait. A 1s client timeout in front of
// an answer that takes 1s leaves no time for a retry; no wait is begun that
// would end after the deadline. To bound each attempt instead, set
// Transport.AttemptTimeout: it bounds sending the request, the response
// headers and, for an answer whose case the transport reads from its body
// (the problem documents above), the start of that body. An attempt that
// has not got that far by then is abandoned and retried under the same
// key (a server that still runs the first attempt answers the retry 409,
// or holds it until the answer is stored and replays it), so the call as a
// whole can outlive a slow attempt, or a server that sends an answer's
// head and then stalls. The body of an answer that is retried is drained
// for no longer than AttemptTimeout before the next attempt. The body of
// the response returned is the caller's to read after the call, and
// AttemptTimeout does not cut it. Keep a
// context deadline or a client timeout, longer than AttemptTimeout times
// MaxAttempts plus MaxDelay, as the call's own bound.
//
// # Bodies
//
// Every attempt sends the whole body again. A request made by
// http.NewRequest from a bytes.Buffer, bytes.Reader or strings.Reader has
// GetBody, which the transport uses. A body without GetBody is read into
// memory once, within the request's context, up to MaxBufferBytes (1 MiB
// by default, the idem middleware's default body limit); a larger one is
// sent once, streamed, without retries, because it could not be sent
// again. Every response the transport does not return is drained a
// little and closed.
//
// # What the caller learns
//
// Replayed reports whether the response is a stored answer replayed by the
// server (Idempotent-Replayed: true). Key and Attempts read what the
// transport did from the response's Request: its context carries the key
// and the number of attempts, so no header is invented and nothing needs
// to be threaded through the call. When every attempt failed without a
// response, the error wraps an *Error that carries the key and the count,
// so the caller can try again later under the same key.
//
// OnRetry is called before every wait, for logging. Time is a dependency:
// Now, Sleep and Jitter replace the clock, the wait and the randomness in
// tests.
//
// Go's http.Transport itself re-sends, once and silently, a request that
// carries an Idempotency-Key when a reused keep-alive connection turns out
// to be dead; that is just as safe, and Attempts does not count it.
package client
