package cli

import (
	"encoding/hex"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-go/idem/store"
)

// previewBytes is how much of a binary body inspect shows.
const previewBytes = 64

// bodyText returns the body of r as text when it is text: valid UTF-8
// under a textual Content-Type (sniffed when the answer has none).
func bodyText(r *store.Response) (string, bool) {
	if r.BodyOmitted || !utf8.Valid(r.Body) {
		return "", false
	}
	return string(r.Body), textual(contentType(r))
}

// contentType is the media type of r's body, sniffed when the header has
// none.
func contentType(r *store.Response) string {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		if len(r.Body) == 0 {
			return ""
		}
		ct = http.DetectContentType(r.Body)
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(ct))
	}
	return mt
}

// textual reports whether media type mt holds text a terminal can show.
func textual(mt string) bool {
	typ, sub, _ := strings.Cut(mt, "/")
	if typ == "text" {
		return true
	}
	if typ != "application" {
		return false
	}
	switch sub {
	case "json", "xml", "javascript", "ecmascript", "x-www-form-urlencoded", "x-ndjson", "ndjson",
		"yaml", "x-yaml", "toml", "graphql", "csv", "sql":
		return true
	}
	return strings.HasSuffix(sub, "+json") || strings.HasSuffix(sub, "+xml") || strings.HasSuffix(sub, "+yaml")
}

// fieldList prints "name: value" lines for a person, the values aligned.
type fieldList struct{ tw *tabwriter.Writer }

func newFieldList(w io.Writer) fieldList { return fieldList{tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)} }

func (f fieldList) row(name, format string, a ...any) {
	fmt.Fprintf(f.tw, "%s:\t"+format+"\n", append([]any{name}, a...)...)
}

func (f fieldList) flush() error { return f.tw.Flush() }

// at is the row of a time, left out when it is zero.
func (f fieldList) at(name string, t time.Time) {
	if !t.IsZero() {
		f.row(name, "%s", t.UTC().Format(time.RFC3339Nano))
	}
}

// printRecord prints rec for a person: the record's fields, then the
// stored answer as an HTTP response would read.
func printRecord(w io.Writer, rec store.Record) error {
	f := newFieldList(w)
	row, at := f.row, f.at
	row("scope", "%q", rec.Scope)
	row("key", "%q", rec.Key)
	row("state", "%s", rec.State)
	row("fence", "%d", rec.Fence)
	row("fingerprint", "%s", rec.Fingerprint)
	row("lease policy", "%s", rec.LeasePolicy)
	if rec.State == store.StateInProgress {
		at("locked until", rec.LockedUntil)
	}
	if rec.RecoveryPoint != "" {
		row("recovery point", "%s", printable(rec.RecoveryPoint, false))
	}
	row("attempts", "%d", rec.Attempts)
	if rec.LastError != "" {
		row("last error", "%s", oneLine(rec.LastError))
	}
	at("created", rec.CreatedAt)
	at("updated", rec.UpdatedAt)
	at("completed", rec.CompletedAt)
	at("expires", rec.ExpiresAt)
	if rec.State == store.StateUnknown {
		at("reconcile after", rec.ReconcileAfter)
		row("reconcile attempts", "%d", rec.ReconcileAttempts)
		at("dead-lettered", rec.DeadLetteredAt)
	}
	if err := f.flush(); err != nil {
		return err
	}
	if rec.State == store.StateUnknown {
		if err := printRequest(w, &rec); err != nil {
			return err
		}
	}
	return printResponse(w, rec.Response)
}

// printResponse prints the stored response r: status, headers and body,
// the body as text when it is text, else as a hex preview.
func printResponse(w io.Writer, r *store.Response) error {
	if r == nil {
		_, err := fmt.Fprintln(w, "\nno stored response")
		return err
	}
	fmt.Fprintf(w, "\nresponse: %d %s\n", r.Status, http.StatusText(r.Status))
	printHeader(w, r.Header)
	fmt.Fprintln(w)
	var err error
	switch text, ok := bodyText(r); {
	case r.BodyOmitted:
		_, err = fmt.Fprintln(w, "(body not stored: it was larger than the store's limit)")
	case len(r.Body) == 0:
		_, err = fmt.Fprintln(w, "(empty body)")
	case ok:
		_, err = io.WriteString(w, printable(text, true))
		if err == nil && !strings.HasSuffix(text, "\n") {
			_, err = fmt.Fprintln(w)
		}
	default:
		mt := contentType(r)
		if mt == "" {
			mt = "no content type"
		}
		fmt.Fprintf(w, "(binary body: %d bytes, %s; write it with --body-out FILE)\n", len(r.Body), mt)
		preview := r.Body[:min(len(r.Body), previewBytes)]
		_, err = io.WriteString(w, hex.Dump(preview))
		if err == nil && len(r.Body) > previewBytes {
			_, err = fmt.Fprintf(w, "... %d more bytes\n", len(r.Body)-previewBytes)
		}
	}
	return err
}

// printHeader prints h, one "Name: value" line a value, in name order.
func printHeader(w io.Writer, h http.Header) {
	for _, name := range sortedKeys(h) {
		for _, v := range h[name] {
			fmt.Fprintf(w, "%s: %s\n", printable(name, false), printable(v, false))
		}
	}
}

// printable is s as a terminal may show it. What a record holds comes from
// clients and upstreams; a control character in it (ESC starts sequences
// that rewrite the screen, set the window title or write the clipboard), a
// bidirectional override or a byte that is not UTF-8 is written as a Go
// escape (\x1b, \u202e, \xff) instead. With lines (a body), line breaks,
// tabs and the CR of a CRLF stay as they are.
func printable(s string, lines bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case lines && (r == '\n' || r == '\t' || r == '\r' && strings.HasPrefix(s[i+n:], "\n")),
			!unicode.IsControl(r) && !unicode.Is(unicode.Bidi_Control, r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
