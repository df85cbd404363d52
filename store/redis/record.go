package redis

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem/store"
)

// Record hash fields. Short names: they are repeated in every record.
//
//	s scope, k key, fp fingerprint, st state, f fence, pol lease policy,
//	lu locked_until, rp recovery_point, le last_error, at attempts,
//	ca created_at, ua updated_at, cpa completed_at, ea expires_at,
//	ra reconcile_after, rat reconcile_attempts, dla dead_lettered_at,
//	o owner (while in_progress or unknown; absent, as in older records, 0),
//	rs response status, rh response header (JSON), rb response body (absent
//	when the body is nil), ro body omitted ("1").
//
// Times are microseconds since the Unix epoch; an absent time is zero.

// decodeRecord turns an HGETALL reply (field, value, ...) into a Record.
func decodeRecord(v any) (store.Record, error) {
	pairs, ok := v.([]any)
	if !ok || len(pairs)%2 != 0 {
		return store.Record{}, fmt.Errorf("idem/redis: malformed record reply %T", v)
	}
	f := make(map[string]string, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		k, _ := pairs[i].(string)
		val, _ := pairs[i+1].(string)
		f[k] = val
	}
	if f["st"] == "" {
		return store.Record{}, store.ErrNotFound
	}
	var err error
	integer := func(name string) int64 {
		s, ok := f[name]
		if !ok || s == "" {
			return 0
		}
		n, perr := strconv.ParseInt(s, 10, 64)
		if perr != nil && err == nil {
			err = fmt.Errorf("idem/redis: record field %s: %w", name, perr)
		}
		return n
	}
	instant := func(name string) time.Time {
		if _, ok := f[name]; !ok {
			return time.Time{}
		}
		return time.UnixMicro(integer(name)).UTC()
	}
	r := store.Record{
		Scope:             f["s"],
		Key:               f["k"],
		Fingerprint:       f["fp"],
		State:             store.State(f["st"]),
		Fence:             integer("f"),
		LeasePolicy:       store.LeasePolicy(f["pol"]),
		LockedUntil:       instant("lu"),
		RecoveryPoint:     f["rp"],
		LastError:         f["le"],
		Attempts:          int(integer("at")),
		CreatedAt:         instant("ca"),
		UpdatedAt:         instant("ua"),
		CompletedAt:       instant("cpa"),
		ExpiresAt:         instant("ea"),
		ReconcileAfter:    instant("ra"),
		ReconcileAttempts: int(integer("rat")),
		DeadLetteredAt:    instant("dla"),
		Owner:             integer("o"),
	}
	if _, ok := f["rs"]; ok {
		resp := &store.Response{Status: int(integer("rs")), BodyOmitted: f["ro"] == "1"}
		if jerr := json.Unmarshal([]byte(f["rh"]), &resp.Header); jerr != nil && err == nil {
			err = fmt.Errorf("idem/redis: record response header: %w", jerr)
		}
		if b, ok := f["rb"]; ok {
			resp.Body = []byte(b)
		}
		r.Response = resp
	}
	if err != nil {
		return store.Record{}, err
	}
	return r, nil
}

// responseArgs encodes a response as the five script arguments of
// set_response in lib.lua: status, header, body, has_body, omitted.
func responseArgs(r *store.Response) ([]any, error) {
	var h http.Header
	if r.Header != nil {
		h = r.Header
	}
	hdr, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("idem/redis: encode response header: %w", err)
	}
	body := r.Body
	if r.BodyOmitted {
		body = nil
	}
	return []any{r.Status, hdr, body, flag(body != nil), flag(r.BodyOmitted)}, nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
