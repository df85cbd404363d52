package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// demoTranscript are the lines every tour prints, in order.
var demoTranscript = []string{
	"1. A new charge under a new key",
	"<- 201 Created  {\"id\":\"ch_1\",\"amount\":1000,\"currency\":\"eur\"}",
	"upstream charges made so far: 1",
	"2. The answer was lost",
	"<- 201 Created  Idempotent-Replayed: true  {\"id\":\"ch_1\",\"amount\":1000,\"currency\":\"eur\"}",
	"same status and body as the first answer",
	"upstream charges made so far: 1",
	"3. The same key with a different amount",
	"<- 422 Unprocessable Entity",
	"docs/problems.md#key-reused",
	"upstream charges made so far: 1",
	"4. Two duplicates of a new key",
	"{\"id\":\"ch_2\",\"amount\":2500,\"currency\":\"eur\"}",
	"upstream charges made so far: 2",
	"5. A POST without Idempotency-Key is refused",
	"<- 400 Bad Request",
	"docs/problems.md#key-missing",
	"upstream charges made so far: 2",
	"The upstream made 2 charges for 6 POST requests: each charge ran once.",
}

func assertTranscript(t *testing.T, out string) {
	t.Helper()
	rest := out
	for _, want := range demoTranscript {
		i := strings.Index(rest, want)
		if i < 0 {
			t.Fatalf("transcript lacks %q (in order):\n%s", want, out)
		}
		rest = rest[i+len(want):]
	}
	// The concurrent duplicates: one ran, the other got 409 or the replay.
	if !strings.Contains(out, "<- 409 Conflict  Retry-After: 1") &&
		strings.Count(out, "Idempotent-Replayed: true") != 2 {
		t.Errorf("the second duplicate got neither 409 nor a replay:\n%s", out)
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"demo"}, {"demo", "--store", "memory:"}} {
		out, errOut, err := run(args...)
		t.Log("\n" + out + errOut)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		assertTranscript(t, out)
		if args[len(args)-1] == "demo" && !strings.Contains(out, "keys in sqlite:") {
			t.Errorf("the default store is not a SQLite file")
		}
	}
}

func TestDemoKeep(t *testing.T) {
	t.Parallel()
	var out testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"demo", "--keep", "--delay", "50ms"}, &out, io.Discard) }()
	eventually(t, "the demo says it keeps running", func() bool { return strings.Contains(out.String(), "press Ctrl-C to stop") })
	assertTranscript(t, out.String())

	m := regexp.MustCompile(`(?m)^  idem proxy +(http://\S+)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no proxy address in:\n%s", out.String())
	}
	c := client(t)
	first := send(t, c, "POST", m[1]+"/v1/charges", "by-hand", `{"amount":700,"currency":"eur"}`)
	again := send(t, c, "POST", m[1]+"/v1/charges", "by-hand", `{"amount":700,"currency":"eur"}`)
	if first.status != http.StatusCreated || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("by hand: %d %s, then %d %s", first.status, first.body, again.status, again.body)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo --keep: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("demo --keep did not stop on cancel")
	}
	if !strings.HasSuffix(out.String(), "stopping\n") {
		t.Errorf("output ends %q", out.String()[max(0, len(out.String())-40):])
	}
}
