package idem_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
)

// gzipped compresses s as a client would, at a level and with the
// modification time its gzip header carries (Python's gzip.compress writes
// the current time, so each retry's bytes differ).
func gzipped(t *testing.T, s string, level int, mtime time.Time) string {
	t.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, level)
	if err != nil {
		t.Fatal(err)
	}
	zw.ModTime = mtime
	io.WriteString(zw, s)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func deflated(t *testing.T, s string, wrapped bool) string {
	t.Helper()
	var b bytes.Buffer
	var w io.WriteCloser = zlib.NewWriter(&b)
	if !wrapped {
		w, _ = flate.NewWriter(&b, flate.BestSpeed)
	}
	io.WriteString(w, s)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func encoded(key, body, coding string) call {
	c := post(key, body)
	if coding != "" {
		c.header.Set("Content-Encoding", coding)
	}
	return c
}

// A JSON body sent compressed is fingerprinted by its content: it used to
// be parsed as JSON as it came, and every compressed request was refused
// as invalid. A retry whose compressor wrote other bytes (another level,
// another time in the gzip header), or that sends the content unencoded,
// is the same request and gets the replay; other content is another
// request. The handler gets the body as sent.
func TestCompressedBodyFingerprintedByContent(t *testing.T) {
	t.Parallel()
	var seen []string
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, string(b))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	})
	const body = `{"amount":100,"currency":"eur"}`
	t0 := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	first := gzipped(t, body, gzip.BestSpeed, t0)
	if w := f.do(encoded(uuid, first, "gzip")); w.Code != http.StatusCreated {
		t.Fatalf("gzip JSON body: %d %s", w.Code, w.Body)
	}
	if len(seen) != 1 || seen[0] != first {
		t.Fatalf("the handler saw %q, want the gzip bytes as sent", seen)
	}
	for _, retry := range []struct{ name, body, coding string }{
		{"gzip at another level and time", gzipped(t, body, gzip.BestCompression, t0.Add(time.Second)), "gzip"},
		{"x-gzip", gzipped(t, body, gzip.DefaultCompression, t0), "x-gzip"},
		{"gzip with identity listed", first, "identity, GZIP"},
		{"deflate (zlib)", deflated(t, body, true), "deflate"},
		{"deflate (raw)", deflated(t, body, false), "deflate"},
		{"unencoded, spelled otherwise", `{ "currency": "eur", "amount": 100 }`, ""},
		{"gzip twice", gzipped(t, gzipped(t, body, 1, t0), 1, t0), "gzip, gzip"},
	} {
		w := f.do(encoded(uuid, retry.body, retry.coding))
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry %s: %d replayed=%q %s, want the replay", retry.name, w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
		}
	}
	other := gzipped(t, `{"amount":999,"currency":"eur"}`, gzip.BestSpeed, t0)
	enginetest.WantProblem(t, f.do(encoded(uuid, other, "gzip")), http.StatusUnprocessableEntity, "key-reused")
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// A body that does not decode, or whose content passes the limit (a few
// hundred compressed bytes can stand for megabytes), is refused before
// anything is reserved: the key stays free for a good request.
func TestBadCompressedBodies(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{MaxBodyBytes: 1 << 10}, nil)
	const body = `{"amount":100}`
	whole := gzipped(t, body, gzip.BestSpeed, time.Time{})
	for _, c := range []struct{ name, body, coding string }{
		{"not gzip", body, "gzip"},
		{"cut short", whole[:len(whole)-6], "gzip"},
		{"garbage after the stream", whole + "garbage", "gzip"},
		{"not deflate", "\xff\xff\xff\xff", "deflate"},
		{"gzip holding invalid JSON", gzipped(t, `{"amount":`, 1, time.Time{}), "gzip"},
	} {
		p := enginetest.WantProblem(t, f.do(encoded(uuid, c.body, c.coding)), http.StatusBadRequest, "invalid-body")
		if p.Detail == "" {
			t.Errorf("%s: no detail", c.name)
		}
	}
	bomb := gzipped(t, `{"a":"`+strings.Repeat("0", 1<<19)+`"}`, gzip.BestCompression, time.Time{})
	if len(bomb) > 1<<10 {
		t.Fatalf("the compressed body is %d bytes, not under the limit", len(bomb))
	}
	enginetest.WantProblem(t, f.do(encoded(uuid, bomb, "gzip")), http.StatusRequestEntityTooLarge, "body-too-large")
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times on bad bodies", n)
	}
	if w := f.do(encoded(uuid, whole, "gzip")); w.Code != http.StatusCreated {
		t.Fatalf("the key after the refusals: %d %s", w.Code, w.Body)
	}
}

// A body in a coding the engine does not decode (br, zstd) cannot be read
// as JSON: it is fingerprinted as the bytes sent, under the coding's name,
// instead of being refused as invalid JSON. A retry that sends the same
// bytes is a replay; other bytes, or the same bytes in another coding, are
// another request.
func TestUndecodedCodingHashedAsSent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{Fields: []string{"amount"}}, nil)
	const sent = "\x1b\x0f\x00\xf8\xa5\x40\x02brotli-bytes"
	if w := f.do(encoded(uuid, sent, "br")); w.Code != http.StatusCreated {
		t.Fatalf("br body: %d %s", w.Code, w.Body)
	}
	if w := f.do(encoded(uuid, sent, "BR")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("the same bytes again: %d %s, want the replay", w.Code, w.Body)
	}
	enginetest.WantProblem(t, f.do(encoded(uuid, sent+"x", "br")), http.StatusUnprocessableEntity, "key-reused")
	enginetest.WantProblem(t, f.do(encoded(uuid, sent, "zstd")), http.StatusUnprocessableEntity, "key-reused")
	enginetest.WantProblem(t, f.do(encoded(uuid, sent, "gzip, br")), http.StatusUnprocessableEntity, "key-reused")
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
