package console_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// A summary keeps the first bytes of the body, which may end inside a
// character: the text before it is still shown as text.
func TestShownTextOfABodyCutInsideACharacter(t *testing.T) {
	body := []byte("a" + strings.Repeat("é", console.MaxShownBody)) // é is two bytes
	kept := body[:console.MaxShownBody]                             // ends with half an é
	text, ok := console.ShownText(kept)
	if want := "a" + strings.Repeat("é", (console.MaxShownBody-2)/2); !ok || text != want {
		t.Fatalf("ShownText = %d bytes, %v; want the %d bytes before the cut character, as text", len(text), ok, len(want))
	}
	if text, ok := console.ShownText(body); !ok || len(text) != console.MaxShownBody-1 {
		t.Fatalf("ShownText of a longer body = %d bytes, %v; want %d, as text", len(text), ok, console.MaxShownBody-1)
	}
	if _, ok := console.ShownText([]byte("a\x00b")); ok {
		t.Fatal("a body with a NUL byte shown as text")
	}
	if _, ok := console.ShownText([]byte{0xff, 'a'}); ok {
		t.Fatal("a body that is not UTF-8 shown as text")
	}
}
