// Package testenv finds the real servers the tests run against. It imports
// no driver: pgdb and mysqldb give each test a fresh, private place on a
// server (a PostgreSQL schema, a MySQL database). A test whose server is not configured is
// skipped with a message that names the environment variable to set.
//
//	IDEM_TEST_POSTGRES_URL  postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	IDEM_TEST_MYSQL_DSN     root@tcp(127.0.0.1:3306)/test
//	IDEM_TEST_REDIS_ADDR    127.0.0.1:6379 (127.0.0.1:6379/3: database 3)
//	IDEM_TEST_PGBOUNCER_URL postgres://postgres@127.0.0.1:6432/idem_tx?sslmode=disable
//
// .ci/run sets all four; .ci/pgbouncer starts the pgbouncer the last one
// names.
package testenv

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Environment variables naming the test servers.
const (
	PostgresEnv  = "IDEM_TEST_POSTGRES_URL"
	MySQLEnv     = "IDEM_TEST_MYSQL_DSN"
	RedisEnv     = "IDEM_TEST_REDIS_ADDR"
	PgbouncerEnv = "IDEM_TEST_PGBOUNCER_URL"
)

// Name returns prefix followed by 12 random hex digits: a name no other
// test uses.
func Name(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func need(tb testing.TB, env, example string) string {
	tb.Helper()
	v := os.Getenv(env)
	if v == "" {
		Skip(tb, fmt.Sprintf("%s is not set (e.g. %s=%q): skipping the tests that need this server", env, env, example))
	}
	return v
}

// CI reports whether the tests run under CI=true, where a check that
// cannot run is a failure, not a skip.
func CI() bool { return os.Getenv("CI") == "true" }

// SkipsEnv names a file to which Skip appends its reason, one a line:
// .ci/run, make test and make race set it around the README's test command,
// and go run ./internal/tools/skipsummary then says in one line what was
// skipped and how to enable it (go test prints "ok" for a package whose
// tests all skipped).
const SkipsEnv = "IDEM_TEST_SKIPS"

// Skip skips the test, saying why; under CI=true it fails it instead: a CI
// run must never count a check it could not make as passed.
func Skip(tb testing.TB, why string) {
	tb.Helper()
	if CI() {
		tb.Fatalf("CI=true, and this test cannot run: %s", why)
	}
	if path := os.Getenv(SkipsEnv); path != "" {
		// The file exists (its creator reads it); each line is one write,
		// whole under O_APPEND, whichever test process writes it.
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0); err == nil {
			f.WriteString(strings.ReplaceAll(why, "\n", " ") + "\n")
			f.Close()
		}
	}
	tb.Skip(why)
}

// Without notes that a test runs without one of its servers; under
// CI=true it fails the test instead.
func Without(tb testing.TB, why string) {
	tb.Helper()
	if CI() {
		tb.Fatalf("CI=true, and %s", why)
	}
	tb.Log(why)
}

// PostgresURL returns the PostgreSQL server URL or skips the test.
func PostgresURL(tb testing.TB) string {
	tb.Helper()
	return need(tb, PostgresEnv, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// Pooled databases of the pgbouncer that .ci/pgbouncer starts: a
// transaction pool, a transaction pool of one server connection (a client
// that connects again meets the server connection of the one before it),
// and a session pool.
const (
	PgbouncerTx      = "idem_tx"
	PgbouncerTxOne   = "idem_tx1"
	PgbouncerSession = "idem_session"
)

// PgbouncerURL returns the URL of one of the pgbouncer's pooled databases
// (PgbouncerTx, PgbouncerTxOne or PgbouncerSession), or skips the test.
func PgbouncerURL(tb testing.TB, database string) string {
	tb.Helper()
	v := need(tb, PgbouncerEnv, "postgres://postgres@127.0.0.1:6432/idem_tx?sslmode=disable")
	u, err := url.Parse(v)
	if err != nil {
		tb.Fatalf("%s: %v", PgbouncerEnv, err)
	}
	u.Path = "/" + database
	return u.String()
}

// FreeAddr returns a loopback address nobody listens on right now, for a
// server the test starts later (another process may still take it before
// the server listens).
//
// The port is below the kernel's ephemeral range: a port the kernel hands
// out for 127.0.0.1:0 comes from that range, where every outgoing
// connection of the machine takes its local port too, and a test that
// makes thousands of connections (the fault tests) can take it before the
// server binds it. Below the range, only another test's pick can; a port
// is handed out once per process.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	low := ephemeralLow()
	for range 200 {
		port := 10000 + mrand.IntN(low-10000)
		if _, taken := handedPorts.LoadOrStore(port, true); taken {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		return ln.Addr().String()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

var handedPorts sync.Map // port -> true: handed out by FreeAddr in this process

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default, 32768, where the range cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
		return n
	}
	return 32768
}

// WithParam returns the URL u with its query parameter k set to v.
func WithParam(tb testing.TB, u, k, v string) string {
	tb.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		tb.Fatalf("parse %s: %v", u, err)
	}
	q := parsed.Query()
	q.Set(k, v)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// MySQLDSN returns the MySQL/MariaDB DSN or skips the test.
func MySQLDSN(tb testing.TB) string {
	tb.Helper()
	return need(tb, MySQLEnv, "root@tcp(127.0.0.1:3306)/test")
}

// RedisAddr returns the Redis server's address (host:port), or skips the
// test. Connect with RedisDB's database: Options{Addr: RedisAddr(t), DB:
// RedisDB(t)}, or use RedisURL.
func RedisAddr(tb testing.TB) string {
	tb.Helper()
	addr, _ := redisServer(tb)
	return addr
}

// RedisDB returns the database number IDEM_TEST_REDIS_ADDR names (0 when
// it names none), or skips the test.
func RedisDB(tb testing.TB) int {
	tb.Helper()
	_, db := redisServer(tb)
	return db
}

// RedisURL returns the test Redis server as a store URL,
// redis://host:port/DB, or skips the test.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	addr, db := redisServer(tb)
	return fmt.Sprintf("redis://%s/%d", addr, db)
}

func redisServer(tb testing.TB) (string, int) {
	tb.Helper()
	addr, db, err := ParseRedisAddr(need(tb, RedisEnv, "127.0.0.1:6379"))
	if err != nil {
		tb.Fatalf("%s: %v", RedisEnv, err)
	}
	return addr, db
}

// ParseRedisAddr reads IDEM_TEST_REDIS_ADDR: host:port, or host:port/DB to
// keep the tests in database DB of a server that holds other data in
// database 0.
func ParseRedisAddr(v string) (addr string, db int, err error) {
	addr, dbText, hasDB := strings.Cut(v, "/")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", 0, fmt.Errorf("%q: want host:port or host:port/DB, e.g. 127.0.0.1:6379/3", v)
	}
	if !hasDB {
		return addr, 0, nil
	}
	db, err = strconv.Atoi(dbText)
	if err != nil || db < 0 {
		return "", 0, fmt.Errorf("%q: the database after / must be a number from 0, e.g. 127.0.0.1:6379/3", v)
	}
	return addr, db, nil
}

// Buffer is a bytes.Buffer that goroutines may write while a test reads it:
// a place for a logger's or a command's output.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
