package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/appoutbox"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/outbox"
)

// TestOutboxCommands: a charge the provider refused until its last attempt
// is listed dead, shown, redelivered from the command line, and delivered
// by the application's own workers once the provider is back; the
// commands refuse what they cannot do with a reason.
func TestOutboxCommands(t *testing.T) {
	t.Parallel()
	dbs := map[string]string{"sqlite": "sqlite:" + filepath.Join(t.TempDir(), "app.db")}
	if testenv.PostgresURL(t) != "" {
		dbs["postgres"] = pgdb.URL(t, testenv.PostgresURL(t))
	}
	for name, dsn := range dbs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := appoutbox.New(t, dsn)
			msg := appoutbox.Charge(7)
			key := msg.Key
			a.Dead(t, msg)

			out, _, err := run("outbox", "dead", "--store", dsn, "--json")
			var dead []deliveryView
			if err != nil || json.Unmarshal([]byte(out), &dead) != nil || len(dead) != 1 ||
				dead[0].Key != key || dead[0].Kind != "charge" || dead[0].State != outbox.Dead || dead[0].Fence != 7 ||
				!strings.Contains(dead[0].LastError, "provider unavailable") {
				t.Fatalf("outbox dead --json: %v\n%s", err, out)
			}
			out, _, err = run("outbox", "dead", "--store", dsn)
			if err != nil || !strings.Contains(out, key) || !strings.Contains(out, "provider unavailable: 503") {
				t.Fatalf("outbox dead: %v\n%s", err, out)
			}
			if out, stderr, err := run("outbox", "dead", "--store", dsn, "--queue", "other"); err != nil || out != "" ||
				!strings.Contains(stderr, "no dead-lettered messages") {
				t.Fatalf("outbox dead of another queue: %v %q %q", err, out, stderr)
			}
			out, _, err = run("outbox", "show", "--store", dsn, "--kind", "charge", key)
			if err != nil || !strings.Contains(out, "state:") || !strings.Contains(out, "dead") {
				t.Fatalf("outbox show: %v\n%s", err, out)
			}

			a.Up.Store(true)
			out, _, err = run("outbox", "redeliver", "--store", dsn, "--kind", "charge", "--json", key)
			var d deliveryView
			if err != nil || json.Unmarshal([]byte(out), &d) != nil || d.State != outbox.Pending || d.Fence != 7 {
				t.Fatalf("outbox redeliver: %v\n%s", err, out)
			}
			stop := a.Start(t)
			got := a.WaitState(t, key, outbox.Delivered)
			stop()
			if got.DownstreamID != appoutbox.DownstreamID(key) || a.Calls.Load() != 2 {
				t.Fatalf("after the redelivery: %+v, %d calls to the provider", got, a.Calls.Load())
			}
			if out, _, err := run("outbox", "dead", "--store", dsn, "--json"); err != nil || strings.TrimSpace(out) != "[]" {
				t.Fatalf("dead letters after the redelivery: %v %s", err, out)
			}
			out, _, err = run("outbox", "show", "--store", dsn, "--kind", "charge", "--json", key)
			if err != nil || json.Unmarshal([]byte(out), &d) != nil || d.State != outbox.Delivered || d.DownstreamID != got.DownstreamID {
				t.Fatalf("outbox show after delivery: %v\n%s", err, out)
			}

			for _, c := range []struct {
				args  []string
				usage bool
				want  string
			}{
				{[]string{"redeliver", "--kind", "charge", key}, false, "is delivered, not dead"},
				{[]string{"show", "--kind", "charge", "idem_nothing"}, false, "message not found"},
				{[]string{"show", key}, true, "--kind is required"},
				{[]string{"show", "--kind", "charge", key, "again"}, true, "want one KEY"},
				{[]string{"redeliver", "--kind", "charge", "--max-attempts", "0", key}, true, "--max-attempts must be positive"},
				{[]string{"dead", "--limit", "0"}, true, "--limit must be from 1 to 10000"},
			} {
				args := append([]string{"outbox", c.args[0], "--store", dsn}, c.args[1:]...)
				var stderr strings.Builder
				err := Run(context.Background(), args, new(strings.Builder), &stderr)
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				if err == nil || errors.Is(err, ErrUsage) != c.usage || !strings.Contains(msg+stderr.String(), c.want) {
					t.Errorf("idem %s: %v (usage error %v)\n%s", strings.Join(args, " "), err, errors.Is(err, ErrUsage), stderr.String())
				}
			}
		})
	}
}

// TestOutboxCommandsRefuseOtherDatabases: the outbox lives in PostgreSQL
// or SQLite; a SQLite file that does not exist is not created.
func TestOutboxCommandsRefuseOtherDatabases(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "none.db")
	for _, c := range []struct {
		store string
		usage bool
		want  string
	}{
		{"memory:", true, "an outbox lives in PostgreSQL or SQLite"},
		{"redis://127.0.0.1:6379/0", true, "an outbox lives in PostgreSQL or SQLite"},
		{"sqlite:" + missing, false, "does not exist"},
		{"ftp://x", true, "unsupported store DSN"},
	} {
		var stderr strings.Builder
		err := Run(context.Background(), []string{"outbox", "dead", "--store", c.store}, new(strings.Builder), &stderr)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if err == nil || errors.Is(err, ErrUsage) != c.usage || !strings.Contains(msg+stderr.String(), c.want) {
			t.Errorf("--store %s: %v\n%s", c.store, err, stderr.String())
		}
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the command created %s: %v", missing, err)
	}
}
