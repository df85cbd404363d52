// Package console is the operations console of the idem proxy's admin
// server: search records, read one, and settle or delete unknown records
// (the unknown queue, and the dead letters the reconciler gave up on), in
// plain HTML forms (no JavaScript, no asset from elsewhere).
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/listpage"
	"github.com/idem-go/idem/internal/header"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

//go:embed assets
var assets embed.FS

var pages = template.Must(template.ParseFS(assets, "assets/*.html"))

// Prefix is where the console is mounted.
const Prefix = "/console/"

// Credentials authenticate operators: a bearer token, or a user and a
// password (HTTP basic authentication or the login form).
type Credentials struct {
	Token    string
	User     string
	Password string
}

// CredentialsFromEnv reads IDEM_CONSOLE_TOKEN, IDEM_CONSOLE_USER and
// IDEM_CONSOLE_PASSWORD.
func CredentialsFromEnv() Credentials {
	return Credentials{Token: os.Getenv("IDEM_CONSOLE_TOKEN"),
		User: os.Getenv("IDEM_CONSOLE_USER"), Password: os.Getenv("IDEM_CONSOLE_PASSWORD")}
}

func (c Credentials) empty() bool { return c.Token == "" && (c.User == "" || c.Password == "") }

// Config wires the console to the proxy.
type Config struct {
	// Store returns the store, nil while it is not open yet (the console
	// answers 503 then).
	Store func() store.Store
	// Settle settles an unknown record as `idem reconcile resolve` does,
	// about the execution of the given fence (the one the page showed).
	Settle func(ctx context.Context, scope, key string, fence int64, res maintenance.Resolution) error
	// Tenant turns a client's credential (its Authorization header value)
	// into the tenant the proxy files its records under; nil when the proxy
	// takes no tenant from Authorization.
	Tenant func(credential string) (string, error)
	Credentials
	// Addr is the admin address: without credentials the console serves
	// only on a loopback address.
	Addr string
}

// Handler serves the console.
type Handler struct {
	cfg Config
	key []byte // signs sessions and CSRF tokens; new at every start
	mux *http.ServeMux
}

// New checks cfg and returns the console. It refuses to serve without
// credentials unless the admin address is loopback.
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil || cfg.Settle == nil {
		return nil, errors.New("console: a store and a settle function are required")
	}
	if cfg.Token == "" && (cfg.User == "") != (cfg.Password == "") {
		return nil, errors.New("console: IDEM_CONSOLE_USER and IDEM_CONSOLE_PASSWORD go together")
	}
	if cfg.empty() && !loopback(cfg.Addr) {
		return nil, fmt.Errorf("console: set IDEM_CONSOLE_TOKEN or IDEM_CONSOLE_USER/IDEM_CONSOLE_PASSWORD to serve the console on the non-loopback address %q", cfg.Addr)
	}
	h := &Handler{cfg: cfg, key: make([]byte, 32), mux: http.NewServeMux()}
	if _, err := rand.Read(h.key); err != nil {
		return nil, err
	}
	h.mux.HandleFunc("GET /console/{$}", h.search)
	h.mux.HandleFunc("GET /console/record", h.record)
	h.mux.HandleFunc("GET /console/unknown", h.unknown)
	h.mux.HandleFunc("GET /console/dead-letters", h.deadLetters)
	h.mux.HandleFunc("GET /console/login", h.loginPage)
	h.mux.HandleFunc("POST /console/login", h.login)
	h.mux.HandleFunc("POST /console/act", h.act)
	h.mux.HandleFunc("GET /console/style.css", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		http.ServeFileFS(w, r, assets, "assets/style.css")
	})
	return h, nil
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

const csp = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// ServeHTTP authenticates, sets the security headers and dispatches.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", csp)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer browsers send
	// "Origin: null" with a form POST, which the Origin check refuses.
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodPost && !h.sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	open := r.URL.Path == "/console/login" || r.URL.Path == "/console/style.css"
	if !open && h.session(r) == "" {
		if r.Header.Get("Authorization") != "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="idem console"`)
			http.Error(w, "wrong credentials", http.StatusUnauthorized)
			return
		}
		http.Redirect(w, r, "/console/login", http.StatusSeeOther)
		return
	}
	if !open && h.cfg.Store() == nil {
		http.Error(w, "the store is not open yet", http.StatusServiceUnavailable)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// sameOrigin refuses a POST whose Origin (or, without one, Referer) names
// another site.
func (h *Handler) sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		o = r.Header.Get("Referer")
	}
	if o == "" || o == "null" {
		return o == ""
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// session names the authenticated caller ("" when not authenticated): an
// Authorization header with the credentials, or the signed cookie the login
// form set.
func (h *Handler) session(r *http.Request) string {
	c := h.cfg.Credentials
	if c.empty() {
		return "local"
	}
	if a := r.Header.Get("Authorization"); a != "" {
		if tok, ok := strings.CutPrefix(a, "Bearer "); ok && c.Token != "" && equal(tok, c.Token) {
			return "bearer"
		}
		if u, p, ok := r.BasicAuth(); ok && h.check(u, p) {
			return "basic:" + u
		}
		return ""
	}
	ck, err := r.Cookie("idem_console")
	if err != nil {
		return ""
	}
	id, mac, ok := strings.Cut(ck.Value, ".")
	if !ok || !equal(mac, h.sign("session", id)) {
		return ""
	}
	return id
}

// check accepts the token as a password (any user) or the user/password.
func (h *Handler) check(user, password string) bool {
	c := h.cfg.Credentials
	return (c.Token != "" && equal(password, c.Token)) ||
		(c.User != "" && c.Password != "" && equal(user, c.User) && equal(password, c.Password))
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func (h *Handler) sign(purpose, v string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(purpose + "\x00" + v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrf is the form token of a session: checked on every POST.
func (h *Handler) csrf(r *http.Request) string { return h.sign("csrf", h.session(r)) }

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "login.html", map[string]any{"User": h.cfg.User != ""})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	user, pass := r.PostFormValue("user"), r.PostFormValue("password")
	if tok := r.PostFormValue("token"); tok != "" {
		user, pass = "", tok
	}
	if h.cfg.empty() || !h.check(user, pass) {
		h.render(w, r, http.StatusUnauthorized, "login.html", map[string]any{"User": h.cfg.User != "", "Error": "wrong credentials"})
		return
	}
	idb := make([]byte, 16)
	_, _ = rand.Read(idb)
	id := base64.RawURLEncoding.EncodeToString(idb)
	http.SetCookie(w, &http.Cookie{Name: "idem_console", Value: id + "." + h.sign("session", id),
		Path: Prefix, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, page string, data map[string]any) {
	data["CSRF"] = h.csrf(r)
	data["Page"] = page
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := pages.ExecuteTemplate(w, page, data); err != nil {
		fmt.Fprintf(w, "template: %v", template.HTMLEscapeString(err.Error()))
	}
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	h.render(w, r, status, "error.html", map[string]any{"Error": err.Error()})
}

// query turns the search form into ListParams.
func (h *Handler) query(q url.Values) (store.ListParams, error) {
	p := store.ListParams{Limit: 50, State: store.State(q.Get("state"))}
	tenant := q.Get("tenant")
	if cred := q.Get("credential"); cred != "" {
		if h.cfg.Tenant == nil {
			return p, errors.New("this proxy does not take tenants from the Authorization header")
		}
		var err error
		if tenant, err = h.cfg.Tenant(cred); err != nil {
			return p, fmt.Errorf("credential: %w", err)
		}
	}
	if tenant != "" || q.Get("route") != "" {
		p.ScopePrefix = strconv.Itoa(len(tenant)) + ":" + tenant
		if route := q.Get("route"); route != "" {
			method := strings.ToUpper(q.Get("method"))
			if method == "" {
				method = http.MethodPost
			}
			p.ScopePrefix += method + " " + route
		}
	}
	if raw := q.Get("key"); raw != "" {
		// As the client sent it: a structured-field string ("k") or bare.
		k, err := header.Parse([]string{raw})
		if err != nil {
			return p, fmt.Errorf("key: %w", err)
		}
		p.Key = k
	}
	if c := q.Get("after"); c != "" {
		cur, err := store.ParseCursor(c)
		if err != nil {
			return p, err
		}
		p.After = &cur
	}
	return p, p.Validate()
}

// list renders page with the records p selects, newest first; keep, when
// not nil, keeps only the records it accepts (see filtered).
func (h *Handler) list(w http.ResponseWriter, r *http.Request, page string, p store.ListParams, err error, keep func(*store.Record) bool) {
	data := map[string]any{"Q": r.URL.Query(), "States": []store.State{store.StateInProgress, store.StateCompleted,
		store.StateFailedRetryable, store.StateUnknown, store.StateExpired}}
	if err != nil {
		data["Error"] = err.Error()
		h.render(w, r, http.StatusBadRequest, page, data)
		return
	}
	recs, next, err := h.filtered(r.Context(), p, keep)
	if err != nil {
		data["Error"] = err.Error()
		h.render(w, r, http.StatusBadGateway, page, data)
		return
	}
	data["Records"] = views(recs)
	if next != nil {
		q := r.URL.Query()
		q.Set("after", next.String())
		data["Next"] = "?" + q.Encode()
	}
	h.render(w, r, http.StatusOK, page, data)
}

// maxScan bounds the records one page of a filtered list reads: a page
// may then hold fewer records than asked, with a link to go on.
const maxScan = 5000

// filtered lists the records p selects that keep accepts (all with a nil
// keep), up to p.Limit of them, and the cursor to go on from. The stores
// list by tenant, route, key and state; what only the record tells (a dead
// letter) is filtered here, reading at most maxScan records.
func (h *Handler) filtered(ctx context.Context, p store.ListParams, keep func(*store.Record) bool) ([]store.Record, *store.Cursor, error) {
	if keep == nil {
		return h.cfg.Store().List(ctx, p)
	}
	return listpage.Filtered(ctx, h.cfg.Store(), p, min(store.MaxListLimit, max(p.Limit, 200)), maxScan, keep)
}

func (h *Handler) search(w http.ResponseWriter, r *http.Request) {
	p, err := h.query(r.URL.Query())
	h.list(w, r, "search.html", p, err, nil)
}

// unknown is the unknown queue: unknown records the reconciler (or an
// operator) has yet to settle; the dead letters have their own page.
func (h *Handler) unknown(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	q.Set("state", string(store.StateUnknown))
	p, err := h.query(q)
	h.list(w, r, "unknown.html", p, err, func(r *store.Record) bool { return !r.DeadLettered() })
}

// deadLetters lists the unknown records the reconciler gave up on: only
// an operator settles them.
func (h *Handler) deadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	q.Set("state", string(store.StateUnknown))
	p, err := h.query(q)
	h.list(w, r, "deadletters.html", p, err, (*store.Record).DeadLettered)
}

func (h *Handler) record(w http.ResponseWriter, r *http.Request) {
	scope, key := r.URL.Query().Get("scope"), r.URL.Query().Get("key")
	rec, err := h.cfg.Store().Get(r.Context(), scope, key)
	switch {
	case errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrInvalidParams):
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no record for key %q in scope %q", key, scope))
		return
	case err != nil:
		h.fail(w, r, http.StatusBadGateway, err)
		return
	}
	h.render(w, r, http.StatusOK, "record.html", map[string]any{"R": view(rec)})
}

// act runs an action after its confirmation page: the first POST shows
// what will happen, the second (confirm=yes) does it.
func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if !equal(r.PostForm.Get("csrf"), h.csrf(r)) {
		http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
		return
	}
	f := r.PostForm
	scope, key, action := f.Get("scope"), f.Get("key"), f.Get("action")
	fence, _ := strconv.ParseInt(f.Get("fence"), 10, 64)
	if action != "delete" && fence <= 0 {
		h.fail(w, r, http.StatusBadRequest, errors.New("the form names no fence: settle from the record's page"))
		return
	}
	var res maintenance.Resolution
	switch action {
	case "completed":
		status, err := strconv.Atoi(f.Get("status"))
		if err != nil || status < 100 || status > 599 {
			h.fail(w, r, http.StatusBadRequest, errors.New("status must be a number from 100 to 599"))
			return
		}
		hdr := http.Header{}
		if ct := f.Get("content_type"); ct != "" {
			hdr.Set("Content-Type", ct)
		}
		res = maintenance.Resolution{Outcome: maintenance.Happened, Response: &store.Response{Status: status, Header: hdr, Body: []byte(f.Get("body"))}}
	case "not_happened":
		res = maintenance.Resolution{Outcome: maintenance.DidNotHappen}
	case "run_again":
		res = maintenance.Resolution{Outcome: maintenance.RunAgain}
	case "delete":
	default:
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("unknown action %q", action))
		return
	}
	if f.Get("confirm") != "yes" {
		h.render(w, r, http.StatusOK, "confirm.html", map[string]any{"F": f, "Action": action})
		return
	}
	var err error
	if action == "delete" {
		err = h.cfg.Store().Delete(r.Context(), scope, key)
	} else {
		err = h.cfg.Settle(r.Context(), scope, key, fence, res)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no record for key %q in scope %q", key, scope))
		return
	case errors.Is(err, store.ErrLeaseLost):
		h.fail(w, r, http.StatusConflict, fmt.Errorf("key %q in scope %q ran again since the page showed fence %d: nothing was settled; open the record again", key, scope, fence))
		return
	case errors.Is(err, store.ErrStateConflict):
		h.fail(w, r, http.StatusConflict, fmt.Errorf("key %q in scope %q is not in a state this action takes", key, scope))
		return
	case err != nil:
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if action == "delete" {
		back := "unknown"
		if f.Get("from") == "dead-letters" {
			back = "dead-letters"
		}
		http.Redirect(w, r, Prefix+back, http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, Prefix+"record?"+url.Values{"scope": {scope}, "key": {key}}.Encode(), http.StatusSeeOther)
}

// recordView is a record as the pages show it.
type recordView struct {
	store.Record
	Tenant, Method, Route string
	Link                  string
	BodyText              string
	BodyIsText            bool
	BodySize              int
}

func view(r store.Record) recordView {
	v := recordView{Record: r, Link: Prefix + "record?" + url.Values{"scope": {r.Scope}, "key": {r.Key}}.Encode()}
	v.Tenant, v.Method, v.Route, _ = idem.ParseScope(r.Scope)
	if r.Response != nil {
		v.BodySize = len(r.Response.Body)
		v.BodyIsText = utf8.Valid(r.Response.Body) && !strings.ContainsRune(string(r.Response.Body), 0)
		if v.BodyIsText {
			v.BodyText = string(r.Response.Body)
		}
	}
	return v
}

func views(rs []store.Record) []recordView {
	out := make([]recordView, len(rs))
	for i, r := range rs {
		out[i] = view(r)
	}
	return out
}
