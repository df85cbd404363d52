package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/store/sqlite"
)

// The database and its -wal and -shm files are created readable by their
// owner only: they hold every tenant's stored answers.
func TestCreatesPrivateFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := sqlite.Open(context.Background(), path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, name := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
}
