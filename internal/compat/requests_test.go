package compat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// python is the system's Python 3 with Debian's python3-requests (the
// requests and urllib3 a Debian service gets); .ci/run installs it.
const python = "/usr/bin/python3"

// Python requests with urllib3's Retry (409 and 503 retried, Retry-After
// honoured, POST allowed) through the relay that loses answers, on the
// ietf profile: with the proxy's default flags, and in the full run (make
// compat) also with --wait 0, where duplicates in flight get the 409 it
// retries.
func TestPythonRequests(t *testing.T) {
	mock := stripeMock(t)
	if err := exec.Command(python, "-c", "import requests, urllib3").Run(); err != nil {
		testenv.Skip(t, python+" cannot import requests and urllib3 (apt-get install python3-requests)")
	}
	for _, v := range []struct {
		name string
		args []string
	}{{"defaults", nil}, {"wait=0", []string{"--wait", "0"}}} {
		if v.args != nil && !full() {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			stores(t, func(t *testing.T, dsn string) {
				s := newStack(t, mock, dsn, 20*time.Millisecond, v.args...)
				s.verify(t, pythonCalls(t, s.relayURL, calls(t, 80)))
			})
		})
	}
}

func pythonCalls(t *testing.T, base string, n int) []outcome {
	t.Helper()
	cmd := exec.Command(python, "testdata/requests_client.py", base, strconv.Itoa(n), strconv.Itoa(callers))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("requests_client.py: %v\n%s", err, stderr.Bytes())
	}
	var res []outcome
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var line struct{ Call, ID, Err string }
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("requests_client.py printed %q: %v", sc.Bytes(), err)
		}
		res = append(res, outcome{call: line.Call, id: line.ID, err: line.Err})
	}
	if len(res) != n {
		t.Fatalf("requests_client.py reported %d calls, want %d\n%s", len(res), n, stderr.Bytes())
	}
	return res
}
