// Package integration holds the tests that run the engine, the background
// services and the phases over every real store: SQLite, PostgreSQL and
// MariaDB next to memory, and real operating-system processes killed
// mid-request. They live in a module of their own so that the core module
// depends on no database driver; the README's test command runs them with
// every other module's tests.
package integration
