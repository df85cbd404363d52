package storeurl_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParse(t *testing.T) {
	t.Parallel()
	// A password with every character that means something in a URL or in
	// the driver's DSN syntax.
	const pw = `p@ss:w/rd?#%()& =`
	mysqlURL := (&url.URL{Scheme: "mysql", User: url.UserPassword("app", pw), Host: "db.internal:3307", Path: "/idem"}).String()

	tests := []struct {
		dsn    string
		kind   storeurl.Kind
		target string
		err    string // substring of the error; "" for success
	}{
		{dsn: "sqlite:idem.db", kind: storeurl.SQLite, target: "idem.db"},
		{dsn: storeurl.Default, kind: storeurl.SQLite, target: "idem.db"},
		{dsn: "sqlite:/var/lib/idem/idem.db", kind: storeurl.SQLite, target: "/var/lib/idem/idem.db"},
		{dsn: "sqlite:///var/lib/idem.db", kind: storeurl.SQLite, target: "/var/lib/idem.db"},
		{dsn: "sqlite://rel.db", kind: storeurl.SQLite, target: "rel.db"},
		{dsn: "sqlite::memory:", kind: storeurl.SQLite, target: ":memory:"},
		{dsn: "sqlite:file:x.db?_txlock=immediate", kind: storeurl.SQLite, target: "file:x.db?_txlock=immediate"},
		{dsn: "SQLITE:x.db", kind: storeurl.SQLite, target: "x.db"},
		{dsn: "sqlite:", err: "needs a file path"},
		{dsn: "memory:", kind: storeurl.Memory},
		{dsn: "memory://", kind: storeurl.Memory},
		{dsn: "memory:x", err: "takes no argument"},
		{dsn: "postgres://u:p@127.0.0.1:5432/test?sslmode=disable", kind: storeurl.Postgres,
			target: "postgres://u:p@127.0.0.1:5432/test?sslmode=disable"},
		{dsn: "postgresql://127.0.0.1/test", kind: storeurl.Postgres, target: "postgresql://127.0.0.1/test"},
		{dsn: "postgres:host=x", err: "must be a URL"},
		{dsn: "mysql://root@127.0.0.1:3306/test", kind: storeurl.MySQL, target: "root@tcp(127.0.0.1:3306)/test"},
		{dsn: "mysql://root:secret@localhost/test", kind: storeurl.MySQL, target: "root:secret@tcp(localhost:3306)/test"},
		{dsn: "mysql://root@[::1]:3306/test", kind: storeurl.MySQL, target: "root@tcp([::1]:3306)/test"},
		{dsn: "mysql://root@127.0.0.1/test?timeout=5s&tls=false", kind: storeurl.MySQL,
			target: "root@tcp(127.0.0.1:3306)/test?timeout=5s&tls=false"},
		{dsn: mysqlURL, kind: storeurl.MySQL, target: "app:" + pw + "@tcp(db.internal:3307)/idem"},
		{dsn: "mysql://root@127.0.0.1:3306/", err: "needs a database name"},
		{dsn: "mysql://root@127.0.0.1:3306/a/b", err: "needs a database name"},
		{dsn: "mysql:root@tcp(127.0.0.1)/test", err: "must be a URL"},
		{dsn: "mysql://root@127.0.0.1/test?timeout=soon", err: "parameters"},
		{dsn: "redis://127.0.0.1:6379/0", kind: storeurl.Redis, target: "redis://127.0.0.1:6379/0"},
		{dsn: "rediss://u:p@cache:6380/1", kind: storeurl.Redis, target: "rediss://u:p@cache:6380/1"},
		{dsn: "redis+cluster://a:7000,b:7001", kind: storeurl.Redis, target: "redis+cluster://a:7000,b:7001"},
		{dsn: "redis:127.0.0.1", err: "must be a URL"},
		{dsn: "mongodb://127.0.0.1/x", err: `unsupported store DSN: scheme "mongodb"`},
		{dsn: "idem.db", err: "unsupported store DSN"},
		{dsn: "", err: "unsupported store DSN"},
	}
	for _, tt := range tests {
		d, err := storeurl.Parse(tt.dsn)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Parse(%q) = %+v, %v; want error containing %q", tt.dsn, d, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.dsn, err)
			continue
		}
		if d.Kind != tt.kind || d.Target != tt.target {
			t.Errorf("Parse(%q) = {%s %q}, want {%s %q}", tt.dsn, d.Kind, d.Target, tt.kind, tt.target)
		}
	}

	// The converted DSN must read back, through the driver, as the same
	// credentials: that is what the mysql store will do with it.
	d, err := storeurl.Parse(mysqlURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysqldrv.ParseDSN(d.Target)
	if err != nil {
		t.Fatalf("driver cannot parse %q: %v", d.Target, err)
	}
	if cfg.User != "app" || cfg.Passwd != pw || cfg.Addr != "db.internal:3307" || cfg.DBName != "idem" || cfg.Net != "tcp" {
		t.Errorf("driver read user=%q pass=%q addr=%q db=%q net=%q", cfg.User, cfg.Passwd, cfg.Addr, cfg.DBName, cfg.Net)
	}
}

func TestErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"mysql://root:hunter2@127.0.0.1:3306/%zz",
		"mysql://root:hunter2@127.0.0.1:3306/",
		"nosuch://root:hunter2@host/db",
		"redis://:hunter2@[::1:6379/0",
		"redis+cluster://:hunter2@a:7000,[b:7001",
		"redis://:hunter2@127.0.0.1:6379/0?x=%zz",
		"rediss://u:hunter2@cache:6380/0?dial_timeout=1s&wait_replicas=1&bogus=%zz",
	} {
		_, err := storeurl.Parse(dsn)
		if err == nil {
			t.Errorf("Parse(%q) succeeded", dsn)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error repeats the password: %v", err)
		}
		// Open, whose error the proxy logs, refuses it as Parse does.
		if _, err := storeurl.Open(context.Background(), dsn, storeurl.Options{}); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Open(%q): %v", dsn, err)
		}
	}
}

func TestOpenUnsupported(t *testing.T) {
	t.Parallel()
	_, err := storeurl.Open(context.Background(), "cassandra://x", storeurl.Options{})
	if !errors.Is(err, storeurl.ErrUnsupported) {
		t.Fatalf("Open: %v, want ErrUnsupported", err)
	}
	for _, form := range []string{"sqlite:PATH", "memory:", "postgres://", "mysql://", "redis://"} {
		if !strings.Contains(err.Error(), form) {
			t.Errorf("error %q does not name %s", err, form)
		}
	}
}

// roundTrip checks that an opened store works: reserve, get, delete.
func roundTrip(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	res, err := s.Reserve(ctx, store.ReserveParams{
		Scope: "storeurl-test", Key: "k", Fingerprint: "fp",
		Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown,
	})
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("Reserve: %v, %v", res.Outcome, err)
	}
	if _, err := s.Get(ctx, "storeurl-test", "k"); err != nil {
		t.Fatalf("Get: %v", err)
	}
	// An in-progress record is not deleted; a released one is.
	fence := store.FenceParams{Scope: "storeurl-test", Key: "k", Fence: res.Record.Fence}
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence, Error: "test"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := s.Delete(ctx, store.DeleteParams{Scope: "storeurl-test", Key: "k"}); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

func TestOpenMemory(t *testing.T) {
	t.Parallel()
	s, err := storeurl.Open(context.Background(), "memory:", storeurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s)
	if ok, err := storeurl.Migrate(context.Background(), s); ok || err != nil {
		t.Errorf("Migrate(memory) = %v, %v; want a no-op", ok, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

	// Without Migrate the file has no table yet: the store must say so
	// rather than create it behind the operator's back.
	s, err := storeurl.Open(ctx, "sqlite:"+path, storeurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a", "b"); err == nil || errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get before migration: %v, want a missing-table error", err)
	}
	if ok, err := storeurl.Migrate(ctx, s); !ok || err != nil {
		t.Fatalf("Migrate = %v, %v", ok, err)
	}
	roundTrip(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = storeurl.Open(ctx, "sqlite://"+path, storeurl.Options{Migrate: true, Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Reserve(ctx, store.ReserveParams{
		Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Record.CreatedAt.Equal(now) {
		t.Errorf("CreatedAt = %v, want the injected clock's %v", res.Record.CreatedAt, now)
	}
}

// The server stores are opened only to check that the DSN reaches them;
// Migrate stays false so the shared test databases are not changed.

func TestOpenPostgres(t *testing.T) {
	t.Parallel()
	u := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if u == "" {
		testenv.Skip(t, "IDEM_TEST_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	pingAndClose(t, u)

	// Conns sizes the pool, over a pool_max_conns in the URL.
	s, err := storeurl.Open(context.Background(), u+"&pool_max_conns=5", storeurl.Options{Conns: 9})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.(*postgres.Store).Pool().Config().MaxConns; got != 9 {
		t.Errorf("pool of %d connections, want 9", got)
	}
	if got := s.(*postgres.Store).MaxBatches(); got != postgres.DefaultMaxBatches {
		t.Errorf("%d batch slots by default, want %d", got, postgres.DefaultMaxBatches)
	}

	// Batches sets the group commit's slots; -1 turns it off.
	for _, c := range []struct{ batches, want int }{{3, 3}, {-1, 0}} {
		s, err := storeurl.Open(context.Background(), u, storeurl.Options{Batches: c.batches})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.(*postgres.Store).MaxBatches(); got != c.want {
			t.Errorf("Batches %d: %d slots, want %d", c.batches, got, c.want)
		}
		s.Close()
	}
}

// TestOpenPostgresPartitions: Partitions makes a new schema's table
// partitioned by retention.
func TestOpenPostgresPartitions(t *testing.T) {
	t.Parallel()
	u := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if u == "" {
		testenv.Skip(t, "IDEM_TEST_POSTGRES_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	u = testenv.WithParam(t, u, "search_path", pgdb.Schema(t, u))
	s, err := storeurl.Open(context.Background(), u, storeurl.Options{Migrate: true, Partitions: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var kind string
	if err := s.(*postgres.Store).Pool().QueryRow(context.Background(),
		"SELECT relkind::text FROM pg_class WHERE oid = 'idem_records'::regclass").Scan(&kind); err != nil || kind != "p" {
		t.Errorf("idem_records of kind %q (%v), want p (partitioned)", kind, err)
	}
}

func TestOpenBatchesInvalid(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-2, 1 << 20} {
		if _, err := storeurl.Open(context.Background(), "memory:", storeurl.Options{Batches: n}); err == nil ||
			!strings.Contains(err.Error(), "store batches") {
			t.Errorf("Batches %d: %v", n, err)
		}
	}
}

func TestOpenOptionsInvalid(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		opts storeurl.Options
		want string
	}{
		{storeurl.Options{Conns: -1}, "store connections"},
		{storeurl.Options{Conns: 1 << 40}, "store connections"},
		{storeurl.Options{Batches: -2}, "store batches"},
		{storeurl.Options{Batches: 1 << 20}, "store batches"},
	} {
		if _, err := storeurl.Open(context.Background(), "memory:", c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %s", c.opts, err, c.want)
		}
	}
}

func TestOpenMySQL(t *testing.T) {
	t.Parallel()
	dsn := os.Getenv("IDEM_TEST_MYSQL_DSN")
	if dsn == "" {
		testenv.Skip(t, "IDEM_TEST_MYSQL_DSN is not set (e.g. root@tcp(127.0.0.1:3306)/test)")
	}
	cfg, err := mysqldrv.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	} else {
		u.User = url.User(cfg.User)
	}
	pingAndClose(t, u.String())
}

func TestOpenRedis(t *testing.T) {
	t.Parallel()
	pingAndClose(t, testenv.RedisURL(t))
}

func pingAndClose(t *testing.T, dsn string) {
	t.Helper()
	ctx := context.Background()
	s, err := storeurl.Open(ctx, dsn, storeurl.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestReadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := storeurl.ReadFile(write("ok", " postgres://u:p%40ss@h/db \r\nsecond line\n"))
	if err != nil || got != "postgres://u:p%40ss@h/db" {
		t.Errorf("ReadFile = %q, %v", got, err)
	}
	for _, p := range []string{write("empty", ""), write("blank", "  \nsqlite:x\n"), filepath.Join(dir, "missing")} {
		if got, err := storeurl.ReadFile(p); err == nil || strings.Contains(fmt.Sprint(err), "sqlite:x") {
			t.Errorf("ReadFile(%s) = %q, %v", filepath.Base(p), got, err)
		}
	}
}

// wait_replicas and wait_timeout are the Redis store's own URL parameters:
// taken out before go-redis reads the URL, checked at Parse.
func TestRedisWaitParameters(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"wait_replicas=-1", "wait_replicas=two", "wait_timeout=0s", "wait_timeout=soon"} {
		if _, err := storeurl.Parse("redis://127.0.0.1:6379/0?" + bad); err == nil || !strings.Contains(err.Error(), strings.Split(bad, "=")[0]) {
			t.Errorf("Parse with %s: %v, want an error naming the parameter", bad, err)
		}
	}
	if os.Getenv("IDEM_TEST_REDIS_ADDR") == "" {
		return
	}
	// Opened for real: go-redis takes the rest of the URL, and the
	// parameter reaches the store (the test server has no replica, so a
	// write waiting for one fails).
	s, err := storeurl.Open(context.Background(), testenv.RedisURL(t)+"?dial_timeout=3s&wait_replicas=1&wait_timeout=20ms", storeurl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Reserve(context.Background(), store.ReserveParams{Scope: "storeurl-wait", Key: fmt.Sprint(time.Now().UnixNano()),
		Fingerprint: "f", Lease: time.Second, TTL: time.Minute, LeasePolicy: store.LeaseUnknown})
	if err == nil || !strings.Contains(err.Error(), "0 of 1 replica(s)") {
		t.Errorf("Reserve through wait_replicas=1 without a replica: %v", err)
	}
}
