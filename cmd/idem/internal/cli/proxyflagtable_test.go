package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// flagSample is a valid value, other than the default, of the flags whose
// parser is their own (a flag.Value); the others' are made from their
// default.
var flagSample = map[string]string{
	"lease-policy": "retry", "key-required": "true", "key-reused-status": "409", "in-progress-status": "409",
	"max-response-bytes": "2MiB", "fields": "amount", "echo-key": "true", "tenant-from": "authorization",
	"max-header-bytes": "1KiB", "max-buffered-bytes": "128MiB", "store-replay-cache": "64MiB", "gc-headroom": "64MiB", "methods": "PUT", "max-body": "2MiB",
	"async": "POST /v1/reports", "async-keep-headers": "Cookie",
}

// sampleOf is a valid value of f that is not its default.
func sampleOf(t *testing.T, f proxyFlag) string {
	if s, ok := flagSample[f.name]; ok {
		return s
	}
	switch d := f.def.(type) {
	case string:
		return d + "x"
	case bool:
		return strconv.FormatBool(!d)
	case int:
		return strconv.Itoa(d + 1)
	case float64:
		return fmt.Sprint(d + 1.5)
	case time.Duration:
		return (d + time.Second).String()
	}
	t.Errorf("--%s: no sample value for a default of type %T: add one to flagSample", f.name, f.def)
	return ""
}

// Every setting of idem proxy is one row of proxyFlags, and each row has
// its flag, its environment variable, its config file member, its default
// and its help, all of them working: the environment and the config file
// set the flag, the default is the flag's, and the help is generated from
// the row.
func TestProxyFlagTable(t *testing.T) {
	fs, _ := proxyFlagSet(io.Discard)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n != len(proxyFlags) {
		t.Errorf("idem proxy has %d flags, the table %d rows: every flag must come from the table", n, len(proxyFlags))
	}
	members := map[string]any{}
	seen := map[string]bool{}
	for _, f := range proxyFlags {
		if seen[f.name] {
			t.Errorf("--%s: two rows", f.name)
		}
		seen[f.name] = true
		fl := fs.Lookup(f.name)
		switch {
		case fl == nil:
			t.Errorf("--%s: the row defines no flag", f.name)
			continue
		case f.help == "" || fl.Usage != f.help:
			t.Errorf("--%s: help %q, the flag's %q", f.name, f.help, fl.Usage)
		case f.def == nil || fl.DefValue != defaultText(t, f):
			t.Errorf("--%s: default %v (%q), the flag's %q", f.name, f.def, defaultText(t, f), fl.DefValue)
		case f.env() != "IDEM_"+strings.ToUpper(strings.ReplaceAll(f.name, "-", "_")):
			t.Errorf("--%s: environment variable %s", f.name, f.env())
		}
		t.Setenv(f.env(), sampleOf(t, f))
		if f.member() != "config" { // the file names no other file
			members[f.member()] = sampleOf(t, f)
		}
	}

	// The environment sets every flag.
	if err := applyEnv(fs); err != nil {
		t.Fatalf("every flag from its environment variable: %v", err)
	}
	for _, f := range proxyFlags {
		if got := originOf(fs, f.name); got != "$"+f.env() {
			t.Errorf("--%s: set by %q, want $%s", f.name, got, f.env())
		}
	}

	// The config file sets every flag.
	data, err := json.Marshal(members)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "idem.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fs, _ = proxyFlagSet(io.Discard)
	if _, err := loadConfig(fs, path); err != nil {
		t.Fatalf("every flag from its config member: %v", err)
	}
	for _, f := range proxyFlags {
		if got := originOf(fs, f.name); f.name != "config" && got != "config file "+path {
			t.Errorf("--%s: set by %q, want the config file's member %q", f.name, got, f.member())
		}
	}

	// The help shows each row: its flag, value name, variable, help and
	// default, and nothing else.
	for _, f := range proxyFlags {
		os.Unsetenv(f.env())
	}
	out, _, err := run("help", "proxy")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range proxyFlags {
		name, usage := flag.UnquoteUsage(&flag.Flag{Name: f.name, Usage: f.help, Value: fs.Lookup(f.name).Value})
		if name != "" {
			name = " " + name
		}
		def := defaultText(t, f)
		if def == "" {
			def = "none"
		}
		want := fmt.Sprintf("  --%s%s  ($%s)\n        %s (default: %s)\n", f.name, name, f.env(), usage, def)
		if !strings.Contains(out, want) {
			t.Errorf("idem help proxy lacks\n%s", want)
		}
	}
	if got := strings.Count(out, "\n  --"); got != len(proxyFlags) {
		t.Errorf("idem help proxy lists %d flags, the table %d", got, len(proxyFlags))
	}
}

// defaultText is f's default as its parser shows it.
func defaultText(t *testing.T, f proxyFlag) string {
	switch d := f.def.(type) {
	case time.Duration:
		return d.String()
	case bool:
		return strconv.FormatBool(d)
	}
	if v, ok := f.target(newProxyArgs()).(flag.Value); ok && defText(f.def) != "" {
		if err := v.Set(defText(f.def)); err != nil {
			t.Errorf("--%s: default %v: %v", f.name, f.def, err)
		}
		return v.String()
	}
	return defText(f.def)
}

// env is the flag's environment variable, by the rule every command uses.
func (f proxyFlag) env() string { return envName(f.name) }

// member is the flag's member in the config file: its name.
func (f proxyFlag) member() string { return f.name }
