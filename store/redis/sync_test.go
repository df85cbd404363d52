package redis

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
)

// With WaitReplicas, the replica goes away while the engine completes a
// record: the script ran on the master (every reader sees the record
// completed), its WAIT falls short, and the Complete fails, retryable.
// Whatever the engine's retries find, no answer no replica acknowledged
// counts as stored. Sync, which the engine calls before it takes a read
// as proof that its write landed, succeeds only while a replica
// acknowledges.
func TestNoAnswerStoredWithoutTheReplica(t *testing.T) {
	t.Parallel()
	primary := startRedis(t, "--appendonly", "no", "--save", "", "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(primary)
	replica := startRedis(t, "--replicaof", host, port, "--appendonly", "no", "--save", "")
	ctx := context.Background()
	s := openAt(t, primary, Config{WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})
	// In sync once the replica acknowledges a write (Sync succeeds).
	poll(t, ctx, "the replica to acknowledge writes", func() bool { return s.Sync(ctx) == nil })

	var logs testenv.Buffer
	e, err := idem.New(s, idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Lease: 3 * time.Second, StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	call := idem.Call{Method: "POST", Route: "/v1/charges", Keys: []string{`"lost-completion"`}, Body: []byte(`{"amount":1}`)}
	a := e.Run(ctx, call, func(context.Context) idem.Result {
		// The operation ran; the replica goes away before its answer is
		// stored.
		r := goredis.NewClient(&goredis.Options{Addr: replica, MaxRetries: -1})
		defer r.Close()
		if err := r.Do(ctx, "shutdown", "nosave").Err(); err != nil && !strings.Contains(err.Error(), "EOF") {
			t.Errorf("shutting the replica down: %v", err)
		}
		return idem.Result{Response: store.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}}
	})
	if a.Verdict != idem.Executed {
		t.Fatalf("verdict %v, want executed", a.Verdict)
	}
	log := logs.String()
	if strings.Contains(log, "outcome recorded after retries") || !a.Expires.IsZero() {
		t.Errorf("the answer was taken as stored (expires %v) while no replica acknowledged it:\n%s", a.Expires, log)
	}
	if !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "outcome=completed") {
		t.Errorf("no error says the outcome was not recorded:\n%s", log)
	}
	if err := s.Sync(ctx); err == nil || !store.IsRetryable(err) || !strings.Contains(err.Error(), "0 of 1 replica(s)") {
		t.Errorf("sync without the replica: %v, want a retryable error saying 0 of 1", err)
	}
}
