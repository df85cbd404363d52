// Package testenv finds the real servers the tests run against and gives
// each test a fresh, private place on them: a PostgreSQL schema, a MySQL
// database, a Redis key prefix. A test whose server is not configured is
// skipped with a message that names the environment variable to set.
//
//	IDEM_TEST_POSTGRES_URL  postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	IDEM_TEST_MYSQL_DSN     root@tcp(127.0.0.1:3306)/test
//	IDEM_TEST_REDIS_ADDR    127.0.0.1:6379
//
// .ci/run sets all three.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

// Environment variables naming the test servers.
const (
	PostgresEnv = "IDEM_TEST_POSTGRES_URL"
	MySQLEnv    = "IDEM_TEST_MYSQL_DSN"
	RedisEnv    = "IDEM_TEST_REDIS_ADDR"
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

// Skip skips the test, saying why; under CI=true it fails it instead: a CI
// run must never count a check it could not make as passed.
func Skip(tb testing.TB, why string) {
	tb.Helper()
	if CI() {
		tb.Fatalf("CI=true, and this test cannot run: %s", why)
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

// PostgresSchema creates an empty schema on the server at url, dropped when
// the test ends, and returns its name.
func PostgresSchema(tb testing.TB, url string) string {
	tb.Helper()
	schema := Name("idem_test_")
	exec := func(q string) error {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	ident := pgx.Identifier{schema}.Sanitize()
	if err := exec("CREATE SCHEMA " + ident); err != nil {
		tb.Fatalf("testenv: create schema: %v", err)
	}
	tb.Cleanup(func() {
		if err := exec("DROP SCHEMA " + ident + " CASCADE"); err != nil {
			tb.Errorf("testenv: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// MySQLConfig returns the parsed MySQL/MariaDB DSN or skips the test.
func MySQLConfig(tb testing.TB) *mysqldrv.Config {
	tb.Helper()
	cfg, err := mysqldrv.ParseDSN(need(tb, MySQLEnv, "root@tcp(127.0.0.1:3306)/test"))
	if err != nil {
		tb.Fatalf("testenv: %s: %v", MySQLEnv, err)
	}
	return cfg
}

// MySQLDatabase creates an empty database, dropped when the test ends, and
// returns the configuration of a connection to it.
func MySQLDatabase(tb testing.TB) *mysqldrv.Config {
	tb.Helper()
	cfg := MySQLConfig(tb)
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	name := Name("idem_test_")
	// name is generated hex: safe to splice into DDL, which takes no
	// placeholders.
	if _, err := admin.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		admin.Close()
		tb.Fatalf("testenv: create database: %v", err)
	}
	tb.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			tb.Errorf("testenv: drop database %s: %v", name, err)
		}
		admin.Close()
	})
	cfg = cfg.Clone()
	cfg.DBName = name
	return cfg
}

// RedisAddr returns the Redis server address or skips the test.
func RedisAddr(tb testing.TB) string {
	tb.Helper()
	return need(tb, RedisEnv, "127.0.0.1:6379")
}
