package idem

import (
	"testing"
	"unsafe"
)

// TestHTTPCallSizeClass: the middleware's per-request state stays within
// its allocator size classes. httpCall, which every request allocates,
// fits the 256-byte class; httpRun, which only a request that runs the
// handler allocates, fits the 896-byte class with the 8-byte header an
// object of more than 512 bytes that holds pointers carries (the next
// class is 1024 bytes). A field or two more would cost each request the
// next class's bytes for the collector to account for: reorder fields
// (flags together) or move something out before letting either grow.
func TestHTTPCallSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(httpCall{}); n > 256 {
		t.Errorf("httpCall takes %d bytes; more than the 256-byte size class", n)
	}
	if n := unsafe.Sizeof(httpRun{}) + 8; n > 896 {
		t.Errorf("httpRun takes %d bytes with its header; more than the 896-byte size class", n)
	}
}
