package idem

import (
	"testing"
	"unsafe"
)

// TestHTTPCallSizeClass: the per-request state of the middleware fits the
// allocator's 1024-byte size class. An object of more than 512 bytes that
// holds pointers carries an 8-byte header, and the next class is 1152
// bytes: a field or two more would cost every request 128 bytes for the
// collector to account for. Reorder fields (flags together) or move
// something out before letting it grow.
func TestHTTPCallSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(httpCall{}) + 8; n > 1024 {
		t.Errorf("httpCall takes %d bytes with its header; more than the 1024-byte size class", n)
	}
}
