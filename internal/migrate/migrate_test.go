package migrate

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoadSortsAndReadsMigrations(t *testing.T) {
	fsys := fstest.MapFS{
		"m/010_later.sql":   {Data: []byte("CREATE INDEX x;")},
		"m/002_second.sql":  {Data: []byte("ALTER TABLE t;")},
		"m/001_records.sql": {Data: []byte("CREATE TABLE t;")},
		"m/README.md":       {Data: []byte("not a migration")},
	}
	got, err := Load(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Version != 1 || got[1].Version != 2 || got[2].Version != 10 {
		t.Fatalf("versions %+v", got)
	}
	if got[0].Name != "001_records" || got[0].SQL != "CREATE TABLE t;" {
		t.Fatalf("first migration %+v", got[0])
	}
	pending := Pending(got, map[int]bool{1: true, 10: true})
	if len(pending) != 1 || pending[0].Version != 2 {
		t.Fatalf("pending %+v", pending)
	}
}

func TestLoadRefusesBadNames(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"no number":      {"m/records.sql": {}},
		"zero":           {"m/000_x.sql": {}},
		"duplicate":      {"m/001_a.sql": {}, "m/1_b.sql": {}},
		"no underscore":  {"m/001.sql": {}},
		"missing folder": {},
	} {
		if _, err := Load(fsys, "m"); err == nil || !strings.HasPrefix(err.Error(), "migrate:") {
			t.Fatalf("%s: Load = %v, want a migrate error", name, err)
		}
	}
}

type fakeRows struct {
	vals []int
	i    int
}

func (r *fakeRows) Next() bool { r.i++; return r.i <= len(r.vals) }
func (r *fakeRows) Scan(dest ...any) error {
	*dest[0].(*int) = r.vals[r.i-1]
	return nil
}
func (r *fakeRows) Err() error { return nil }

func TestApply(t *testing.T) {
	all := []Migration{{Version: 1, Name: "001_a"}, {Version: 2, Name: "002_b"}, {Version: 3, Name: "003_c"}}
	applied, err := AppliedVersions(&fakeRows{vals: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	var ran, recorded []int
	err = Apply(all, applied, func(m Migration) error {
		ran = append(ran, m.Version)
		if m.Version == 3 {
			return errors.New("syntax error")
		}
		return nil
	}, func(m Migration) error {
		recorded = append(recorded, m.Version)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "003_c") {
		t.Fatalf("Apply error %v, want one naming 003_c", err)
	}
	if len(ran) != 2 || ran[0] != 2 || len(recorded) != 1 || recorded[0] != 2 {
		t.Fatalf("ran %v recorded %v", ran, recorded)
	}
}
