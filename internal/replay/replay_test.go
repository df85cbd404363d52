package replay

import (
	"net/http"
	"testing"
)

func TestHeader(t *testing.T) {
	h := http.Header{
		"Content-Type": {"application/json"},
		"Set-Cookie":   {"s=1"},
		"Date":         {"Mon, 23 Nov 2026 08:00:00 GMT"},
		"Connection":   {"close, X-Hop"},
		"X-Hop":        {"1"},
		"X-Id":         {"7", "8"},
	}
	got := Header(h)
	if len(got) != 2 || got.Get("Content-Type") != "application/json" || len(got["X-Id"]) != 2 {
		t.Fatalf("Header kept %v", got)
	}
	// An Add on the copy must not write into the original's backing array.
	got.Add("X-Id", "9")
	if len(h["X-Id"]) != 2 {
		t.Fatalf("the copy wrote into the original: %v", h["X-Id"])
	}
	if Header(nil) != nil {
		t.Fatal("Header(nil) is not nil")
	}
	if !Unreplayable("Set-Cookie") || Unreplayable("Content-Type") {
		t.Fatal("Unreplayable disagrees with Header")
	}
}
