// Package mysqldb gives each test a fresh, private MySQL/MariaDB database.
//
// It imports no driver, so that the core module, which holds it, never
// requires one and no store module requires a test-only module: it talks
// to the server through database/sql under the driver name "mysql", which
// the MySQL store (or github.com/go-sql-driver/mysql) registers.
package mysqldb

import (
	"database/sql"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// Database creates an empty database on the server IDEM_TEST_MYSQL_DSN
// names (skipping the test when it is not set), dropped when the test
// ends, and returns the DSN of a connection to it.
func Database(tb testing.TB) string {
	tb.Helper()
	dsn := testenv.MySQLDSN(tb)
	admin, err := sql.Open("mysql", dsn)
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
	return withDatabase(dsn, name)
}

// withDatabase returns dsn naming database name instead. The driver's DSN
// is [user[:password]@][net[(addr)]]/dbname[?params]: the database lies
// between the last slash (a password or an address may hold one) and the
// parameters.
func withDatabase(dsn, name string) string {
	slash := strings.LastIndexByte(dsn, '/')
	if slash < 0 {
		return dsn + "/" + name
	}
	params := ""
	if q := strings.IndexByte(dsn[slash:], '?'); q >= 0 {
		params = dsn[slash+q:]
	}
	return dsn[:slash+1] + name + params
}
