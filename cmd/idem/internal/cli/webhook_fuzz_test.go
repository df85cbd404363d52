package cli

import (
	"crypto/sha256"
	"strconv"
	"testing"
	"time"
)

// FuzzWebhookSignature: the signature header parser, which runs before
// any authentication, never panics, and accepts only a timestamp within
// the tolerance with at least one 32-byte signature.
func FuzzWebhookSignature(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	for _, seed := range []string{
		"t=" + ts + ",v1=" + "00000000000000000000000000000000000000000000000000000000000000ff",
		"t=" + ts + ",v1=zz,v0=00",
		"t=99999999999999999999,v1=",
		"v1=,t=,t=",
		",,,=,==",
	} {
		f.Add(seed)
	}
	h := &webhook{cfg: WebhookConfig{Tolerance: DefaultWebhookTolerance, Now: func() time.Time { return now }}}
	f.Fuzz(func(t *testing.T, header string) {
		sig, err := h.signature([]string{header})
		if err != nil {
			return
		}
		if d := now.Unix() - sig.sec; d > 300 || d < -300 {
			t.Fatalf("accepted a timestamp %ds from now: %q", d, header)
		}
		if len(sig.sigs) == 0 {
			t.Fatalf("accepted no signature: %q", header)
		}
		for _, s := range sig.sigs {
			if len(s) != sha256.Size {
				t.Fatalf("accepted a %d-byte signature: %q", len(s), header)
			}
		}
	})
}
