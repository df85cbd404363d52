package cli

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		out, _, err := run(args...)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		// A test binary has no main module version: "(devel)" or, for
		// a test binary, none at all.
		if !strings.HasPrefix(out, "idem ") || !strings.Contains(out, runtime.Version()) ||
			!strings.Contains(out, runtime.GOOS+"/"+runtime.GOARCH) || strings.Count(out, "\n") != 1 {
			t.Errorf("%q printed %q", args, out)
		}
	}
	out, _, err := run("version", "--json")
	var b buildInfo
	if err != nil || json.Unmarshal([]byte(out), &b) != nil || b.GoVersion != runtime.Version() || b.Version == "" {
		t.Errorf("version --json: %v\n%s", err, out)
	}
	if _, _, err := run("version", "extra"); err == nil {
		t.Error("version with an argument succeeded")
	}
}

func TestBuildInfoForms(t *testing.T) {
	t.Parallel()
	installed := fromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.8",
		Main: debug.Module{Path: "github.com/idem-go/idem/cmd/idem", Version: "v1.2.0"}})
	if got, want := installed.String(), "idem v1.2.0 (github.com/idem-go/idem/cmd/idem) go1.26.8 "+runtime.GOOS+"/"+runtime.GOARCH; got != want {
		t.Errorf("installed: %q, want %q", got, want)
	}
	checkout := fromBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.8",
		Main: debug.Module{Path: "github.com/idem-go/idem", Version: "(devel)"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-11-23T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}})
	want := "idem (devel) (github.com/idem-go/idem) commit 0123456789abcdef0123456789abcdef01234567 2026-11-23T10:00:00Z, modified go1.26.8"
	if got := checkout.String(); !strings.HasPrefix(got, want) || !checkout.Modified {
		t.Errorf("checkout: %q, want %q...", got, want)
	}
	if none := fromBuildInfo(nil); none.Version != "(unknown)" || none.GoVersion != runtime.Version() {
		t.Errorf("no build info: %+v", none)
	}
}
