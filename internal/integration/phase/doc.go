// Package phase holds the tests of atomic phases (package
// github.com/idem-go/idem/phase) over the stores that run them in their
// own transactions: SQLite, PostgreSQL and MariaDB.
package phase
