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
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/listpage"
	"github.com/idem-go/idem/internal/header"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
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
	// An error that is no definite answer of the store (ErrNotFound,
	// ErrLeaseLost, ErrStateConflict, ErrInvalidParams) is taken for the
	// store failing.
	Settle func(ctx context.Context, scope, key string, fence int64, res maintenance.Resolution) error
	// Tenant turns a client's credential (its Authorization header value)
	// into the tenant the proxy files its records under; nil when the proxy
	// takes no tenant from Authorization.
	Tenant func(credential string) (string, error)
	Credentials
	// Addr is the admin address: without credentials the console serves
	// only on a loopback address.
	Addr string
	// Logger receives the audit trail: one line at info level per action
	// (sign-in, failed sign-in, sign-out, settlement, delete). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider counts the actions (idem.console.actions, by action
	// and result). Defaults to the global provider.
	MeterProvider metric.MeterProvider
}

// Handler serves the console.
type Handler struct {
	cfg Config
	key []byte // signs sessions and CSRF tokens; new at every start
	mux *http.ServeMux
	now func() time.Time

	log     *slog.Logger
	actions metric.Int64Counter

	mu       sync.Mutex
	sessions map[string]session   // by session id
	fails    map[string]*failures // failed sign-ins by client address
}

// session is a signed-in browser: until when, and who signed in.
type session struct {
	expires  time.Time
	operator string
}

// SessionTTL is how long a session lasts after sign-in (or, without
// credentials on loopback, after the first page).
const SessionTTL = 12 * time.Hour

// maxSessions bounds the sessions kept; past it, arbitrary ones end.
const maxSessions = 10000

// MinTokenBytes is the shortest console token accepted: a token is the
// whole of an operator's authentication.
const MinTokenBytes = 32

// Sign-in throttling: after freeFailures failed attempts in a row from one
// address, each attempt waits, starting at one second and doubling up to
// maxLockout; a success clears the count.
const (
	freeFailures = 5
	maxLockout   = 5 * time.Minute
)

// failures counts a client's failed sign-ins.
type failures struct {
	n     int
	until time.Time // no attempt is checked before
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
	if cfg.Token != "" && len(cfg.Token) < MinTokenBytes {
		return nil, fmt.Errorf("console: IDEM_CONSOLE_TOKEN is %d bytes, want at least %d (e.g. openssl rand -hex 24)", len(cfg.Token), MinTokenBytes)
	}
	h := &Handler{cfg: cfg, key: make([]byte, 32), mux: http.NewServeMux(), now: time.Now,
		sessions: map[string]session{}, fails: map[string]*failures{}, log: cfg.Logger}
	if h.log == nil {
		h.log = slog.Default()
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	var err error
	if h.actions, err = mp.Meter("github.com/idem-go/idem/cmd/idem/internal/console").Int64Counter("idem.console.actions",
		metric.WithDescription("operator actions in the console (sign-in, sign-out, settlements, deletes), by action and result")); err != nil {
		return nil, fmt.Errorf("console: metrics: %w", err)
	}
	if _, err := rand.Read(h.key); err != nil {
		return nil, err
	}
	h.mux.HandleFunc("GET /console/{$}", h.search)
	h.mux.HandleFunc("POST /console/{$}", h.searchCredential)
	h.mux.HandleFunc("POST /console/logout", h.logout)
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
	if h.cfg.empty() && !h.localHost(r.Host) {
		// Without credentials the console trusts the loopback address; a
		// page of another site whose name resolves to 127.0.0.1 (DNS
		// rebinding) sends its own name as Host.
		http.Error(w, "this console has no credentials and answers only to a loopback host name (localhost, 127.0.0.1, [::1])", http.StatusMisdirectedRequest)
		return
	}
	if r.Method == http.MethodPost && !h.sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	open := r.URL.Path == "/console/login" || r.URL.Path == "/console/style.css"
	if r.Header.Get("Authorization") != "" || (r.Method == http.MethodPost && r.URL.Path == "/console/login") {
		if wait, locked := h.locked(r); locked {
			// Counted, but logged at debug only: a client hammering a
			// locked-out address must not flood the audit trail.
			h.count("login", "throttled")
			h.log.Debug("idem console: sign-in attempt refused while locked out", "remote", r.RemoteAddr)
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(wait.Round(time.Second)/time.Second))))
			http.Error(w, "too many failed sign-ins from this address; try again later", http.StatusTooManyRequests)
			return
		}
	}
	who := h.session(r)
	if who.id == "" && h.cfg.empty() {
		// Loopback without credentials: a session per browser, which
		// nobody signed in to (no audit line: a client without cookies
		// would leave one per request); its actions name it "loopback".
		who = h.newSession(w, r, "loopback")
	}
	if !open && who.id == "" {
		if r.Header.Get("Authorization") != "" {
			h.failed(r)
			h.audit(r, who, auditEntry{action: "login", result: "wrong_credentials", via: authScheme(r)})
			w.Header().Set("WWW-Authenticate", `Basic realm="idem console"`)
			http.Error(w, "wrong credentials", http.StatusUnauthorized)
			return
		}
		http.Redirect(w, r, "/console/login", http.StatusSeeOther)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, who))
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

// localHost reports whether a Host header names the console on loopback:
// localhost, a loopback address, or the configured admin address.
func (h *Handler) localHost(host string) bool {
	if host == h.cfg.Addr {
		return true
	}
	name, _, err := net.SplitHostPort(host)
	if err != nil {
		name = host
	}
	return loopback(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]"))
}

type sessionKey struct{}

// caller is who sent a request: the session (a browser's, or "bearer" and
// "basic:USER" for a request carrying credentials) and the operator who
// signed it in ("token", "user NAME", or "loopback" without credentials).
type caller struct {
	id, operator string
}

// callerOf is the caller ServeHTTP found for r.
func callerOf(r *http.Request) caller {
	c, _ := r.Context().Value(sessionKey{}).(caller)
	return c
}

// sessionOf is the session ServeHTTP found for r.
func sessionOf(r *http.Request) string { return callerOf(r).id }

// client is the address failed sign-ins are counted by.
func client(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// locked reports whether r's address must wait before its next attempt.
func (h *Handler) locked(r *http.Request) (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.fails[client(r)]
	if f == nil {
		return 0, false
	}
	wait := f.until.Sub(h.now())
	return wait, wait > 0
}

// failed counts a failed sign-in of r's address.
func (h *Handler) failed(r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if len(h.fails) > 10000 {
		for k, f := range h.fails {
			if now.Sub(f.until) > maxLockout {
				delete(h.fails, k)
			}
		}
	}
	f := h.fails[client(r)]
	if f == nil {
		f = &failures{}
		h.fails[client(r)] = f
	}
	f.n++
	if f.n > freeFailures {
		f.until = now.Add(min(maxLockout, time.Second<<min(f.n-freeFailures-1, 16)))
	}
}

// succeeded clears the failures of r's address.
func (h *Handler) succeeded(r *http.Request) {
	h.mu.Lock()
	delete(h.fails, client(r))
	h.mu.Unlock()
}

// newSession starts a session for operator and sets its cookie.
func (h *Handler) newSession(w http.ResponseWriter, r *http.Request, operator string) caller {
	idb := make([]byte, 16)
	_, _ = rand.Read(idb)
	id := base64.RawURLEncoding.EncodeToString(idb)
	now := h.now()
	h.mu.Lock()
	for k, s := range h.sessions {
		if !now.Before(s.expires) || len(h.sessions) >= maxSessions {
			delete(h.sessions, k)
		}
	}
	h.sessions[id] = session{expires: now.Add(SessionTTL), operator: operator}
	h.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: "idem_console", Value: id + "." + h.sign("session", id),
		Path: Prefix, MaxAge: int(SessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return caller{id: id, operator: operator}
}

// session names the authenticated caller (a zero caller when not
// authenticated): an Authorization header with the credentials, or the
// cookie of a session that has not expired nor been ended.
func (h *Handler) session(r *http.Request) caller {
	c := h.cfg.Credentials
	if a := r.Header.Get("Authorization"); a != "" && !c.empty() {
		if tok, ok := strings.CutPrefix(a, "Bearer "); ok && c.Token != "" && equal(tok, c.Token) {
			return caller{id: "bearer", operator: "token"}
		}
		if u, p, ok := r.BasicAuth(); ok {
			if op := h.check(u, p); op != "" {
				return caller{id: "basic:" + u, operator: op}
			}
		}
		return caller{}
	}
	ck, err := r.Cookie("idem_console")
	if err != nil {
		return caller{}
	}
	id, mac, ok := strings.Cut(ck.Value, ".")
	if !ok || !equal(mac, h.sign("session", id)) {
		return caller{}
	}
	h.mu.Lock()
	s, live := h.sessions[id]
	h.mu.Unlock()
	if !live || !h.now().Before(s.expires) {
		return caller{}
	}
	return caller{id: id, operator: s.operator}
}

// check accepts the token as a password (any user) or the user/password,
// and names the operator they sign in ("" when refused).
func (h *Handler) check(user, password string) string {
	c := h.cfg.Credentials
	switch {
	case c.Token != "" && equal(password, c.Token):
		return "token"
	case c.User != "" && c.Password != "" && equal(user, c.User) && equal(password, c.Password):
		return "user " + c.User
	}
	return ""
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func (h *Handler) sign(purpose, v string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(purpose + "\x00" + v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrf is the form token of the request's session: checked on every
// POST. Each session has its own; without one (the login page) it is
// empty and no POST but the sign-in is taken.
func (h *Handler) csrf(r *http.Request) string {
	id := sessionOf(r)
	if id == "" {
		return ""
	}
	return h.sign("csrf", id)
}

// checkCSRF refuses a form without its session's token.
func (h *Handler) checkCSRF(w http.ResponseWriter, r *http.Request) bool {
	want := h.csrf(r)
	if want == "" || !equal(r.PostFormValue("csrf"), want) {
		http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
		return false
	}
	return true
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "login.html", map[string]any{"User": h.cfg.User != ""})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	user, pass := r.PostFormValue("user"), r.PostFormValue("password")
	if tok := r.PostFormValue("token"); tok != "" {
		user, pass = "", tok
	}
	operator := h.check(user, pass)
	if h.cfg.empty() || operator == "" {
		h.failed(r)
		h.audit(r, caller{}, auditEntry{action: "login", result: "wrong_credentials", via: "form"})
		h.render(w, r, http.StatusUnauthorized, "login.html", map[string]any{"User": h.cfg.User != "", "Error": "wrong credentials"})
		return
	}
	h.succeeded(r)
	h.audit(r, h.newSession(w, r, operator), auditEntry{action: "login", result: "ok", via: "form"})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// logout ends the session: its cookie no longer signs anyone in.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !h.checkCSRF(w, r) {
		return
	}
	h.mu.Lock()
	delete(h.sessions, sessionOf(r))
	h.mu.Unlock()
	h.audit(r, callerOf(r), auditEntry{action: "logout", result: "ok"})
	http.SetCookie(w, &http.Cookie{Name: "idem_console", Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
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

// storeStatus is the status of a page whose store call ended in err (not
// nil). A definite answer about the record keeps its meaning: 404 when it
// is absent, 409 when it ran again since the page showed it or is not in
// the state the action takes, 400 for parameters the store refuses. Any
// other error is the store failing (connection refused, a timeout, an
// error of the database): no answer about the record nor about the
// operator's input, so 502, the console's upstream having failed. Every
// page that calls the store answers by this one mapping.
func storeStatus(err error) int {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, store.ErrLeaseLost), errors.Is(err, store.ErrStateConflict):
		return http.StatusConflict
	case errors.Is(err, store.ErrInvalidParams):
		return http.StatusBadRequest
	}
	return http.StatusBadGateway
}

// storeFailed reports whether err is the store failing rather than an
// answer (see storeStatus).
func storeFailed(err error) bool { return storeStatus(err) == http.StatusBadGateway }

// getRecord reads (scope, key) for a page. When it cannot, it answers
// (404 for no record, 502 when the store failed) and returns false.
func (h *Handler) getRecord(w http.ResponseWriter, r *http.Request, scope, key string) (store.Record, bool) {
	rec, err := h.cfg.Store().Get(r.Context(), scope, key)
	if errors.Is(err, store.ErrInvalidParams) {
		// No record is kept under a scope or key the store refuses (empty,
		// too long).
		err = store.ErrNotFound
	}
	switch {
	case err == nil:
		return rec, true
	case storeFailed(err):
		h.fail(w, r, storeStatus(err), fmt.Errorf("the store failed reading key %q in scope %q: %w; nothing was changed: try again", key, scope, err))
	default:
		h.fail(w, r, storeStatus(err), fmt.Errorf("no record for key %q in scope %q", key, scope))
	}
	return rec, false
}

// query turns the search form into ListParams.
func (h *Handler) query(q url.Values) (store.ListParams, error) {
	p := store.ListParams{Limit: 50, State: store.State(q.Get("state"))}
	tenant := q.Get("tenant")
	if q.Has("credential") {
		// A customer's token must not land in a URL (history, logs,
		// the next-page link): it is searched for by POST only.
		return p, errors.New("a credential is searched for with the credential form (POST), never in the address")
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
		if storeFailed(err) {
			data["Error"] = "the store failed listing records: " + err.Error() + "; reload the page to try again"
		}
		h.render(w, r, storeStatus(err), page, data)
		return
	}
	data["Records"] = views(recs, h.now())
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

// searchCredential turns a client's credential, posted, into the tenant
// the proxy files it under and shows that tenant's records: the address,
// and the next-page link, hold the tenant id, never the credential.
func (h *Handler) searchCredential(w http.ResponseWriter, r *http.Request) {
	if !h.checkCSRF(w, r) {
		return
	}
	q := url.Values{}
	for _, name := range []string{"method", "route", "key", "state"} {
		if v := r.PostFormValue(name); v != "" {
			q.Set(name, v)
		}
	}
	var err error
	switch cred := r.PostFormValue("credential"); {
	case h.cfg.Tenant == nil:
		err = errors.New("this proxy does not take tenants from the Authorization header")
	case cred == "":
		err = errors.New("give the credential (the Authorization value the client sends)")
	default:
		var tenant string
		if tenant, err = h.cfg.Tenant(cred); err == nil {
			q.Set("tenant", tenant)
			http.Redirect(w, r, Prefix+"?"+q.Encode(), http.StatusSeeOther)
			return
		}
		err = fmt.Errorf("credential: %w", err)
	}
	h.list(w, r, "search.html", store.ListParams{}, err, nil)
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
	rec, ok := h.getRecord(w, r, r.URL.Query().Get("scope"), r.URL.Query().Get("key"))
	if !ok {
		return
	}
	h.render(w, r, http.StatusOK, "record.html", map[string]any{"R": view(rec, h.now())})
}

// act runs an action after its confirmation page: the first POST shows
// the record as it is now and what will happen, the second (confirm=yes)
// does it and leaves a line in the audit trail. An action the record no
// longer takes (settled meanwhile, run again, in progress) is refused on
// the confirmation page already, with nothing to confirm.
func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if !h.checkCSRF(w, r) {
		return
	}
	f := r.PostForm
	a, err := parseAction(f)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ctx := r.Context()
	before, ok := h.getRecord(w, r, a.scope, a.key)
	if !ok {
		return
	}
	confirmed := f.Get("confirm") == "yes"
	data := map[string]any{"F": f, "Action": a.name, "R": view(before, h.now()), "Reason": a.reason}
	if refused := a.refusal(&before); refused != "" {
		if confirmed {
			h.audit(r, callerOf(r), a.entry("conflict", &before, &before, nil))
		}
		data["Refused"] = refused
		h.render(w, r, http.StatusConflict, "confirm.html", data)
		return
	}
	if !confirmed {
		h.render(w, r, http.StatusOK, "confirm.html", data)
		return
	}
	if a.name == "delete" {
		// The store checks the page's fence again, in the same step as the
		// delete: the record may have run again since the Get above.
		err = h.cfg.Store().Delete(ctx, store.DeleteParams{Scope: a.scope, Key: a.key, Fence: a.fence})
	} else {
		err = h.cfg.Settle(ctx, a.scope, a.key, a.fence, a.res)
	}
	e := a.entry(resultOf(err), &before, nil, err)
	switch rec, gerr := h.cfg.Store().Get(ctx, a.scope, a.key); {
	case gerr == nil:
		e.after = &rec
	case !errors.Is(gerr, store.ErrNotFound):
		e.afterUnread = true // not known to be absent: the store failed
	}
	h.audit(r, callerOf(r), e)
	if err != nil {
		h.fail(w, r, storeStatus(err), a.failure(err))
		return
	}
	if a.name == "delete" {
		back := "unknown"
		if f.Get("from") == "dead-letters" {
			back = "dead-letters"
		}
		http.Redirect(w, r, Prefix+back, http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, Prefix+"record?"+url.Values{"scope": {a.scope}, "key": {a.key}}.Encode(), http.StatusSeeOther)
}

// recordView is a record as the pages show it.
type recordView struct {
	store.Record
	Tenant, Method, Route string
	Link                  string
	BodyText              string
	BodyIsText            bool
	BodySize              int
	// Age is how long ago the record was created (its first attempt
	// started); Idle how long ago it last changed (for an unknown record:
	// since it became unknown).
	Age, Idle string
	// Req is the request an unknown record keeps; when there is none for
	// its current execution, NotRecorded says why.
	Req         *requestView
	NotRecorded string
}

func view(r store.Record, now time.Time) recordView {
	v := recordView{Record: r, Link: Prefix + "record?" + url.Values{"scope": {r.Scope}, "key": {r.Key}}.Encode(),
		Age: ago(r.CreatedAt, now), Idle: ago(r.UpdatedAt, now)}
	v.Tenant, v.Method, v.Route, _ = idem.ParseScope(r.Scope)
	if r.Response != nil {
		v.BodySize = len(r.Response.Body)
		v.BodyIsText = isText(r.Response.Body)
		if v.BodyIsText {
			v.BodyText = string(r.Response.Body)
		}
	}
	if r.State == store.StateUnknown {
		v.Req, v.NotRecorded = requestOf(&r)
	}
	return v
}

func views(rs []store.Record, now time.Time) []recordView {
	out := make([]recordView, len(rs))
	for i, r := range rs {
		out[i] = view(r, now)
	}
	return out
}

func isText(b []byte) bool { return utf8.Valid(b) && !strings.ContainsRune(string(b), 0) }

// ago says how long before now t was, to the second.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	return max(0, now.Sub(t)).Round(time.Second).String() + " ago"
}
