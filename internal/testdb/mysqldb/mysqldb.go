// Package mysqldb gives each test a fresh, private MySQL/MariaDB database.
package mysqldb

import (
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem/internal/testkit/testenv"
)

// Config returns the parsed MySQL/MariaDB DSN or skips the test.
func Config(tb testing.TB) *mysql.Config {
	tb.Helper()
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(tb))
	if err != nil {
		tb.Fatalf("mysqldb: %s: %v", testenv.MySQLEnv, err)
	}
	return cfg
}

// Database creates an empty database, dropped when the test ends, and
// returns the configuration of a connection to it.
func Database(tb testing.TB) *mysql.Config {
	tb.Helper()
	cfg := Config(tb)
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	name := testenv.Name("idem_test_")
	// name is generated hex: safe to splice into DDL, which takes no
	// placeholders.
	if _, err := admin.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		admin.Close()
		tb.Fatalf("mysqldb: create database: %v", err)
	}
	tb.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			tb.Errorf("mysqldb: drop database %s: %v", name, err)
		}
		admin.Close()
	})
	cfg = cfg.Clone()
	cfg.DBName = name
	return cfg
}
