package cli

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// buildInfo is what the binary knows about its own build.
type buildInfo struct {
	Module    string `json:"module"`
	Version   string `json:"version"`            // "(devel)" when built from a checkout
	Revision  string `json:"revision,omitempty"` // VCS commit, when built in a checkout
	Time      string `json:"time,omitempty"`     // commit time, RFC 3339
	Modified  bool   `json:"modified"`           // the checkout had uncommitted changes
	GoVersion string `json:"go"`
	Platform  string `json:"platform"`
}

// readBuildInfo reads the module version and the VCS stamp the go command
// embeds: `go install module@version` records the version, a build in a
// checkout records "(devel)" and the commit (unless -buildvcs=false).
func readBuildInfo() buildInfo {
	info, _ := debug.ReadBuildInfo()
	return fromBuildInfo(info)
}

// fromBuildInfo reads info, which is nil when the binary carries none.
func fromBuildInfo(info *debug.BuildInfo) buildInfo {
	b := buildInfo{Version: "(unknown)", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info == nil {
		return b
	}
	b.Module, b.GoVersion = info.Main.Path, info.GoVersion
	if info.Main.Version != "" {
		b.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the one-line form:
//
//	idem v1.2.0 (github.com/idem-go/idem/cmd/idem) go1.26.8 linux/amd64
//	idem (devel) (github.com/idem-go/idem) commit 0123abcd... 2026-11-23T10:00:00Z, modified go1.26.8 linux/amd64
func (b buildInfo) String() string {
	s := "idem " + b.Version
	if b.Module != "" {
		s += " (" + b.Module + ")"
	}
	if b.Revision != "" {
		s += " commit " + b.Revision
		if b.Time != "" {
			s += " " + b.Time
		}
		if b.Modified {
			s += ", modified"
		}
	}
	return s + " " + b.GoVersion + " " + b.Platform
}

// runVersion is `idem version`.
func runVersion(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", `[--json]

Prints the module version of this binary ("(devel)" when it was built from
a checkout rather than installed at a version), the VCS commit, its time
and whether the checkout had uncommitted changes (when the build recorded
them), and the Go version and platform it was built with. Quote it in bug
reports.`, stderr)
	asJSON := fs.Bool("json", false, "print a JSON object (module, version, revision, time, modified, go, platform)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	b := readBuildInfo()
	if *asJSON {
		return writeJSON(stdout, b)
	}
	_, err := fmt.Fprintln(stdout, b)
	return err
}
