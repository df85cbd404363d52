// Package sqltx holds the tests of internal/sqltx over a real database/sql
// driver (SQLite).
package sqltx
