package store

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxListLimit bounds ListParams.Limit: a page is read into memory at once.
const MaxListLimit = 1000

// ListParams selects records for operators (the console, `idem inspect`).
// Every filter is optional; set filters combine with AND.
//
// The list is ordered newest first by CreatedAt, then by Scope and Key in
// descending byte order, so the order is total and stable: a record keeps
// its CreatedAt for its whole life (it changes only when the record is
// created again over an expired or deleted one). UpdatedAt would move a
// record between pages while an operator pages through them.
//
// Paging is keyset paging: pass the Cursor of the last record of a page as
// After to get the next page. A record created after the first page was read
// appears on no later page (it sorts before the cursor); a record deleted
// meanwhile is simply absent. No store ever skips rows by counting them.
type ListParams struct {
	// ScopePrefix keeps records whose Scope starts with it (bytes). The
	// proxy's scopes start with the tenant, so a tenant's records are one
	// prefix.
	ScopePrefix string
	// Key keeps records whose Key is exactly it.
	Key string
	// State keeps records in that state.
	State State
	// After continues a listing after this record (exclusive).
	After *Cursor
	// Limit is the page size: 1..MaxListLimit.
	Limit int
}

// Cursor is a position in the list order: the sort key of one record.
type Cursor struct {
	CreatedAt time.Time
	Scope     string
	Key       string
}

// CursorOf returns the position of r, to pass as ListParams.After.
func CursorOf(r *Record) Cursor {
	return Cursor{CreatedAt: r.CreatedAt, Scope: r.Scope, Key: r.Key}
}

// Validate checks the parameters every store must refuse.
func (p *ListParams) Validate() error {
	switch {
	case p.Limit <= 0 || p.Limit > MaxListLimit:
		return errors.Join(ErrInvalidParams, fmt.Errorf("list limit %d is outside 1..%d", p.Limit, MaxListLimit))
	case p.State != "" && !p.State.Valid():
		return errors.Join(ErrInvalidParams, fmt.Errorf("unknown state %q", p.State))
	case len(p.ScopePrefix) > MaxScopeBytes:
		return errors.Join(ErrTooLong, fmt.Errorf("scope prefix of %d bytes, the limit is %d", len(p.ScopePrefix), MaxScopeBytes))
	case len(p.Key) > MaxKeyBytes:
		return errors.Join(ErrTooLong, fmt.Errorf("key of %d bytes, the limit is %d", len(p.Key), MaxKeyBytes))
	case !validText(p.ScopePrefix) || !validText(p.Key):
		return errors.Join(ErrInvalidParams, errors.New("scope prefix and key must be valid UTF-8 without NUL"))
	}
	if c := p.After; c != nil {
		if err := CheckID(c.Scope, c.Key); err != nil {
			return errors.Join(err, errors.New("in the list cursor"))
		}
		if c.CreatedAt.IsZero() {
			return errors.Join(ErrInvalidParams, errors.New("list cursor without a time"))
		}
	}
	return nil
}

func validText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// String encodes the cursor for a URL: microseconds, then the scope and the
// key in unpadded base64url, separated by dots.
func (c Cursor) String() string {
	enc := base64.RawURLEncoding
	return strconv.FormatInt(c.CreatedAt.UnixMicro(), 10) + "." +
		enc.EncodeToString([]byte(c.Scope)) + "." + enc.EncodeToString([]byte(c.Key))
}

// ParseCursor decodes Cursor.String. A cursor comes back from a client, so
// every malformed one is an ErrInvalidParams.
func ParseCursor(s string) (Cursor, error) {
	bad := func(why string) (Cursor, error) {
		return Cursor{}, errors.Join(ErrInvalidParams, errors.New("list cursor: "+why))
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return bad("want three dot-separated parts")
	}
	us, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil || us <= 0 {
		return bad("bad time")
	}
	scope, err1 := base64.RawURLEncoding.DecodeString(parts[1])
	key, err2 := base64.RawURLEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil {
		return bad("bad scope or key encoding")
	}
	c := Cursor{CreatedAt: time.UnixMicro(us).UTC(), Scope: string(scope), Key: string(key)}
	if err := CheckID(c.Scope, c.Key); err != nil {
		return Cursor{}, errors.Join(err, errors.New("in the list cursor"))
	}
	return c, nil
}
