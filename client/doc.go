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
//   - 409 whose problem type ends in #request-in-progress (the key's first
//     request is still running), and any other 409 carrying Retry-After,
//     except 409 #outcome-unknown (see below);
//   - 429 and 503.
//
// Nothing else is: not 422 (the key was used with another request), not
// 400 or any other 4xx, not 2xx, 3xx or other 5xx. A 409 #outcome-unknown
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
// # Bodies
//
// Every attempt sends the whole body again. A request made by
// http.NewRequest from a bytes.Buffer, bytes.Reader or strings.Reader has
// GetBody, which the transport uses. A body without GetBody is read into
// memory once, up to MaxBufferBytes (1 MiB by default, the idem
// middleware's default body limit); a larger one is sent once, streamed,
// without retries, because it could not be sent again. Every response the
// transport does not return is drained a little and closed.
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
