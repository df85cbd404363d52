// Package migrate reads a store's embedded, numbered migrations. Each store
// applies them with its own locking (an advisory lock on PostgreSQL,
// GET_LOCK on MySQL, an immediate transaction on SQLite) and records the
// applied versions in its own table.
package migrate

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one numbered SQL file, e.g. "001_records.sql".
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Load returns the migrations in dir of fsys sorted by version. File names
// must be NNN_name.sql; a duplicate or unparsable version is an error.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migrate: %s: name must be NNN_name.sql", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrate: %s and %s share version %d", prev, name, v)
		}
		seen[v] = name
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(name, ".sql"), SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Pending returns the migrations whose version is not in applied.
func Pending(all []Migration, applied map[int]bool) []Migration {
	var out []Migration
	for _, m := range all {
		if !applied[m.Version] {
			out = append(out, m)
		}
	}
	return out
}

// Apply runs, in version order, the migrations of all whose version is not
// in applied: exec runs a migration's SQL, then record notes its version.
// Stores call it inside their own locked transaction. The error names the
// migration that failed.
func Apply(all []Migration, applied map[int]bool, exec, record func(Migration) error) error {
	for _, m := range Pending(all, applied) {
		if err := exec(m); err != nil {
			return fmt.Errorf("migration %s: %w", m.Name, err)
		}
		if err := record(m); err != nil {
			return fmt.Errorf("migration %s: %w", m.Name, err)
		}
	}
	return nil
}

// Rows is the part of *sql.Rows (and of similar row iterators) that
// AppliedVersions reads.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// AppliedVersions reads a one-column result of applied versions.
func AppliedVersions(rows Rows) (map[int]bool, error) {
	applied := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		applied[v] = true
	}
	return applied, rows.Err()
}
