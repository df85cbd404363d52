package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// MaxReasonBytes bounds the reason an operator gives with an action.
const MaxReasonBytes = 500

// action is an operator's form, read and checked.
type action struct {
	name       string // completed, not_happened, run_again or delete
	scope, key string
	fence      int64 // the execution the page showed (0 for a delete that names none)
	status     int   // the answer's status, for completed
	reason     string
	res        maintenance.Resolution
}

// parseAction reads the form of an action. The completed form has no
// default status: a status guessed for the operator would be replayed to
// every retry as if the upstream had answered it.
func parseAction(f url.Values) (action, error) {
	a := action{name: f.Get("action"), scope: f.Get("scope"), key: f.Get("key"), reason: cleanReason(f.Get("reason"))}
	a.fence, _ = strconv.ParseInt(f.Get("fence"), 10, 64)
	if a.name != "delete" && a.fence <= 0 {
		return a, errors.New("the form names no fence: settle from the record's page")
	}
	switch a.name {
	case "completed":
		raw := strings.TrimSpace(f.Get("status"))
		status, err := strconv.Atoi(raw)
		switch {
		case raw == "":
			return a, errors.New("give the status the request was answered with (a final status from 200 to 599): there is no default")
		case err != nil || status < 200 || status > 599:
			// An informational status is no answer: a replay of one would
			// reach the client as an interim response and a 200.
			return a, fmt.Errorf("status %q: want a final status from 200 to 599", raw)
		}
		hdr := http.Header{}
		if ct := f.Get("content_type"); ct != "" {
			hdr.Set("Content-Type", ct)
		}
		a.status = status
		a.res = maintenance.Resolution{Outcome: maintenance.Happened, Response: &store.Response{Status: status, Header: hdr, Body: []byte(f.Get("body"))}}
	case "not_happened":
		a.res = maintenance.Resolution{Outcome: maintenance.DidNotHappen}
	case "run_again":
		a.res = maintenance.Resolution{Outcome: maintenance.RunAgain}
	case "delete":
	default:
		return a, fmt.Errorf("unknown action %q", a.name)
	}
	return a, nil
}

// refusal says why the record as it is now does not take the action ("" when
// it does). The store checks again when the action runs: this spares the
// operator a confirmation the store would refuse.
func (a *action) refusal(rec *store.Record) string {
	switch {
	case a.name == "delete" && rec.State == store.StateInProgress:
		return "the record is in progress: its holder may still be running; it can be deleted once it is settled or its lease expired"
	case a.name != "delete" && rec.State != store.StateUnknown:
		return fmt.Sprintf("the record is %s, not unknown: there is nothing to settle", rec.State)
	case a.fence != 0 && rec.Fence != a.fence:
		// A delete names the fence of the page it was sent from: the
		// record may have run again since, with an answer nobody saw.
		return fmt.Sprintf("the record ran again since the page showed fence %d (it is at fence %d): open the record again", a.fence, rec.Fence)
	}
	return ""
}

// failure is what the page says when the store did not take the action,
// err being its error (the status is storeStatus's). When the store failed,
// the change may have been made before it did: the page says so, and that
// the form can be sent again, since the console refuses it once the record
// is settled or gone, or ran again since the page showed its fence.
func (a *action) failure(err error) error {
	done := "settled"
	if a.name == "delete" {
		done = "deleted"
	}
	switch {
	case storeFailed(err):
		return fmt.Errorf("the store failed: %w; key %q in scope %q may or may not have been %s: open the record again to see where it stands, or send the form again (it is refused if the first one went through)", err, a.key, a.scope, done)
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("no record for key %q in scope %q", a.key, a.scope)
	case errors.Is(err, store.ErrLeaseLost):
		return fmt.Errorf("key %q in scope %q ran again since the page showed fence %d: nothing was %s; open the record again", a.key, a.scope, a.fence, done)
	case errors.Is(err, store.ErrStateConflict):
		return fmt.Errorf("key %q in scope %q is not in a state this action takes", a.key, a.scope)
	}
	return err
}

// cleanReason keeps a reason to one line of at most MaxReasonBytes.
func cleanReason(s string) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
	if len(s) <= MaxReasonBytes {
		return s
	}
	cut := MaxReasonBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// resultOf names the outcome of a store call in the audit trail.
func resultOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, store.ErrNotFound):
		return "not_found"
	case errors.Is(err, store.ErrLeaseLost), errors.Is(err, store.ErrStateConflict):
		return "conflict"
	}
	return "error"
}

// auditEntry is one line of the audit trail.
type auditEntry struct {
	action, result string
	via            string // how a sign-in came: form, bearer or basic
	scope, key     string
	status         int
	reason         string
	fence          int64
	before, after  *store.Record // nil: absent
	// afterUnread: the record could not be read after the action (the
	// store failing), so after says nothing.
	afterUnread bool
	err         error
}

func (a *action) entry(result string, before, after *store.Record, err error) auditEntry {
	return auditEntry{action: a.name, result: result, scope: a.scope, key: a.key, status: a.status,
		reason: a.reason, fence: a.fence, before: before, after: after, err: err}
}

// audit logs one action at info level, with who did it and, for an action
// on a record, the record's state and fence before and after, and counts
// it in idem.console.actions.
func (h *Handler) audit(r *http.Request, who caller, e auditEntry) {
	attrs := []any{"action", e.action, "result", e.result,
		"session", h.sessionTag(who.id), "operator", who.operator, "remote", r.RemoteAddr}
	if e.via != "" {
		attrs = append(attrs, "via", e.via)
	}
	if e.scope != "" || e.key != "" {
		attrs = append(attrs, "scope", e.scope, "key", e.key)
		if e.fence != 0 {
			attrs = append(attrs, "fence", e.fence)
		}
		if e.status != 0 {
			attrs = append(attrs, "status", e.status)
		}
		attrs = append(attrs, "reason", e.reason)
		attrs = append(attrs, stateAttrs("before", e.before)...)
		if e.afterUnread {
			attrs = append(attrs, "state_after", "unread")
		} else {
			attrs = append(attrs, stateAttrs("after", e.after)...)
		}
	}
	if e.err != nil {
		attrs = append(attrs, "err", e.err.Error())
	}
	h.log.Info("idem console: "+e.action, attrs...)
	h.count(e.action, e.result)
}

func stateAttrs(when string, rec *store.Record) []any {
	if rec == nil {
		return []any{"state_" + when, "absent"}
	}
	return []any{"state_" + when, string(rec.State), "fence_" + when, rec.Fence}
}

// count adds one to idem.console.actions.
func (h *Handler) count(action, result string) {
	h.actions.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("action", action), attribute.String("result", result)))
}

// sessionTag names a session in the audit trail without giving it away: a
// browser session's id is half of its cookie, so the trail shows a tag
// derived from it, the same on every line of the session. Sessions of
// requests carrying credentials ("bearer", "basic:USER") hold no secret.
func (h *Handler) sessionTag(id string) string {
	if id == "" || id == "bearer" || strings.HasPrefix(id, "basic:") {
		return id
	}
	return h.sign("audit", id)[:12]
}

// authScheme names how a request's Authorization header authenticates.
func authScheme(r *http.Request) string {
	scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if s := strings.ToLower(scheme); s == "bearer" || s == "basic" {
		return s
	}
	return "other"
}
