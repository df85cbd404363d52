package mysql

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/testkit/mysqldb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// baseConfig returns the parsed test DSN or skips the test.
func baseConfig(tb testing.TB) *mysqldrv.Config {
	tb.Helper()
	return parseDSN(tb, testenv.MySQLDSN(tb))
}

// newDatabase creates an empty database for one test, dropped when it
// ends, and returns the config of a connection to it.
func newDatabase(tb testing.TB) *mysqldrv.Config {
	tb.Helper()
	return parseDSN(tb, mysqldb.Database(tb))
}

func parseDSN(tb testing.TB, dsn string) *mysqldrv.Config {
	tb.Helper()
	cfg, err := mysqldrv.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("%s: %v", testenv.MySQLEnv, err)
	}
	return cfg
}

// testMaxConns caps each test store's pool: the suite races 64 goroutines
// per handle, tests run in parallel, and the server's max_connections (151
// by default) is shared with every other test of the machine.
const testMaxConns = 16

func openStore(tb testing.TB, cfg *mysqldrv.Config, clock store.Clock) *Store {
	tb.Helper()
	return openStoreConns(tb, cfg, clock, testMaxConns)
}

func openStoreConns(tb testing.TB, cfg *mysqldrv.Config, clock store.Clock, maxConns int) *Store {
	tb.Helper()
	s, err := Open(context.Background(), cfg.FormatDSN(), Config{Clock: clock, MaxConns: maxConns})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// newStore opens a store with a manual clock on a fresh database.
func newStore(t *testing.T) (*Store, *storetest.Clock) {
	t.Helper()
	clock := storetest.NewClock()
	return openStore(t, newDatabase(t), clock.Now), clock
}

// counter counts the packets the driver writes: after the handshake, one
// write is one command sent, i.e. one round trip.
type counter struct{ writes atomic.Int64 }

type countingConn struct {
	net.Conn
	c *counter
}

func (c countingConn) Write(p []byte) (int, error) {
	c.c.writes.Add(1)
	return c.Conn.Write(p)
}

var dialSeq atomic.Int64

// registerNet registers a dialer whose connections wrap makes and returns
// its network name, to be put in a DSN's Net.
func registerNet(wrap func(net.Conn) net.Conn) string {
	name := "idemnet" + hex.EncodeToString([]byte{byte(dialSeq.Add(1))})
	mysqldrv.RegisterDialContext(name, func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return wrap(conn), nil
	})
	return name
}

// countingNet registers a dialer that counts writes and returns its network
// name, to be put in a DSN's Net.
func countingNet(c *counter) string {
	return registerNet(func(conn net.Conn) net.Conn { return countingConn{Conn: conn, c: c} })
}

// beforeCommand runs hook once, just before the first command sent on its
// connections whose text holds match: another process's change then lands
// between two statements of one operation, at a chosen point.
type beforeCommand struct {
	match []byte
	once  sync.Once
	hook  func()
	ran   atomic.Bool
}

type hookedConn struct {
	net.Conn
	b *beforeCommand
}

func (c hookedConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.b.match) {
		c.b.once.Do(func() {
			c.b.hook()
			c.b.ran.Store(true)
		})
	}
	return c.Conn.Write(p)
}

// net registers a dialer of connections that run b's hook.
func (b *beforeCommand) net() string {
	return registerNet(func(conn net.Conn) net.Conn { return hookedConn{Conn: conn, b: b} })
}

func reserveParams(key string) store.ReserveParams {
	return store.ReserveParams{
		Scope:       "tenant|POST /payments",
		Key:         key,
		Fingerprint: "fp-" + key,
		Lease:       30 * time.Second,
		TTL:         24 * time.Hour,
		LeasePolicy: store.LeaseUnknown,
	}
}

func okResponse(body string) store.Response {
	return store.Response{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}},
		Body:   []byte(body),
	}
}
