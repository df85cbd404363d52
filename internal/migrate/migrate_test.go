package migrate

import (
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
