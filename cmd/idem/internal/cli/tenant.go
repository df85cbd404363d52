package cli

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/store"
)

// Tenant sources, as --tenant-from names them. A tenant keeps the records
// of one caller apart from every other's: two callers in one tenant can
// replay each other's stored answers, probe each other's keys (422) and
// squat them.
//
//	authorization         HMAC of the Authorization header
//	header:NAME           HMAC of a header holding a credential (X-Api-Key)
//	cookie:NAME           HMAC of a cookie holding a credential (a session)
//	trusted-header:NAME   the header's value as is: a tenant id set by a
//	                      gateway in front, which must overwrite or strip
//	                      what clients send
//
// The sources are tried in order; the first one the request carries names
// the tenant. Each source has a namespace of its own: a hashed id starts
// with its source's label (auth:, header:NAME:, cookie:NAME:), and a
// trusted value that starts with one of these labels is refused, so no
// source can produce an id of another: a trusted header can never borrow
// a credential's tenant.
const tenantSourcesHelp = `Tenant sources (--tenant-from, repeatable or comma-separated; the first
one a request carries names its tenant):
  authorization         HMAC-SHA-256 of the Authorization header
  header:NAME           HMAC-SHA-256 of a request header holding a credential (header:X-Api-Key)
  cookie:NAME           HMAC-SHA-256 of a cookie holding a credential (cookie:session)
  trusted-header:NAME   the header's value as is: a tenant id a gateway in front sets
                        (and strips from what clients send); a value that starts
                        with auth:, header: or cookie: (a hashed source's
                        namespace) is refused with 400
Each source names tenants in a namespace of its own: no source can produce
another's tenant id. Mixing a trusted header with credential sources is
allowed (a warning says so at start): a caller that sends no credential
but a trusted header gets the header's tenant, so the gateway must strip
the header from what clients send.
The proxy refuses to start without a source unless --single-tenant says one
trusted caller uses it. A keyed request on a protected method that carries
none of the sources is refused with 401: nothing is reserved or forwarded.
Credentials are hashed under the tenant secret (--tenant-secret-file, or
$IDEM_TENANT_SECRET; with a SQLite file store and neither, a random secret
is created once next to the database as DB.tenant-secret, mode 0600).`

// Tenant source kinds.
const (
	srcAuthorization = "authorization"
	srcHeader        = "header"
	srcCookie        = "cookie"
	srcTrusted       = "trusted-header"
)

// maxTrustedTenant bounds a tenant id taken as is from a trusted header, so
// the scope built from it stays within what every store accepts.
const maxTrustedTenant = 256

// minSecretBytes is the shortest tenant or fingerprint secret accepted: a
// key an attacker could enumerate would make the HMAC a plain hash.
const minSecretBytes = 16

// tenantSource is one place a caller's identity is read from.
type tenantSource struct {
	kind string
	name string // header name (canonical) or cookie name; "" for authorization
}

// maxSourceName bounds a configured header or cookie name, which becomes
// part of every hashed tenant id.
const maxSourceName = 64

func (s tenantSource) String() string {
	if s.kind == srcAuthorization {
		return s.kind
	}
	return s.kind + ":" + s.name
}

// hashed reports whether the source holds a credential, hashed under the
// tenant secret.
func (s tenantSource) hashed() bool { return s.kind != srcTrusted }

// parseTenantSource reads one --tenant-from value.
func parseTenantSource(spec string) (tenantSource, error) {
	spec = strings.TrimSpace(spec)
	kind, name, hasName := strings.Cut(spec, ":")
	kind = strings.ToLower(kind)
	if len(name) > maxSourceName {
		return tenantSource{}, fmt.Errorf("tenant source %q: a name of at most %d bytes", spec, maxSourceName)
	}
	switch kind {
	case srcAuthorization:
		if hasName {
			return tenantSource{}, fmt.Errorf("tenant source %q: authorization takes no name", spec)
		}
		return tenantSource{kind: kind}, nil
	case srcHeader, srcTrusted:
		if !validToken(name) {
			return tenantSource{}, fmt.Errorf("tenant source %q: want %s:NAME with a header name", spec, kind)
		}
		canon := http.CanonicalHeaderKey(name)
		if canon == "Authorization" || canon == "Cookie" {
			return tenantSource{}, fmt.Errorf("tenant source %q: use authorization or cookie:NAME", spec)
		}
		return tenantSource{kind: kind, name: canon}, nil
	case srcCookie:
		if !validToken(name) {
			return tenantSource{}, fmt.Errorf("tenant source %q: want cookie:NAME with a cookie name", spec)
		}
		return tenantSource{kind: kind, name: name}, nil
	}
	return tenantSource{}, fmt.Errorf("tenant source %q: want authorization, header:NAME, cookie:NAME or trusted-header:NAME", spec)
}

// parseTenantSources reads --tenant-from values (each may be a comma list).
func parseTenantSources(specs []string) ([]tenantSource, error) {
	var out []tenantSource
	seen := map[string]bool{}
	for _, spec := range specs {
		for one := range strings.SplitSeq(spec, ",") {
			if strings.TrimSpace(one) == "" {
				continue
			}
			s, err := parseTenantSource(one)
			if err != nil {
				return nil, err
			}
			if !seen[s.String()] {
				seen[s.String()] = true
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// errNoTenant: the request carries none of the tenant sources.
var errNoTenant = errors.New("the request carries none of the configured tenant sources")

// tenants names the caller of a request. The proxy and the operator
// commands share it, so an operator names a record by the credential the
// caller sent, never by a hash computed by hand.
type tenants struct {
	sources []tenantSource
	secret  []byte
	single  bool // --single-tenant: every caller is the tenant ""
}

// String lists the sources, for logs and answers.
func (t *tenants) String() string {
	if t.single {
		return "single-tenant"
	}
	names := make([]string, len(t.sources))
	for i, s := range t.sources {
		names[i] = s.String()
	}
	return strings.Join(names, ",")
}

// needsSecret reports whether a source is hashed.
func (t *tenants) needsSecret() bool {
	for _, s := range t.sources {
		if s.hashed() {
			return true
		}
	}
	return false
}

// tenant returns the tenant id of r: errNoTenant when r carries no source,
// another error when a trusted header holds a value no scope may hold.
func (t *tenants) tenant(r *http.Request) (string, error) {
	if t.single {
		return "", nil
	}
	for _, s := range t.sources {
		var values []string
		switch s.kind {
		case srcAuthorization:
			values = r.Header.Values("Authorization")
		case srcHeader, srcTrusted:
			values = r.Header.Values(s.name)
		case srcCookie:
			for _, c := range r.CookiesNamed(s.name) {
				values = append(values, c.Value)
			}
		}
		if strings.Join(values, "") == "" {
			continue
		}
		if s.kind == srcTrusted {
			v := strings.Join(values, ",")
			if len(v) > maxTrustedTenant || !utf8.ValidString(v) || strings.ContainsFunc(v, isControl) {
				return "", fmt.Errorf("the %s header is not a tenant id (at most %d bytes of UTF-8 text)", s.name, maxTrustedTenant)
			}
			if hashedNamespace(v) {
				return "", fmt.Errorf("the %s header starts with %q, the namespace of a credential source's tenant ids: a trusted tenant id must not", s.name, v[:strings.IndexByte(v, ':')+1])
			}
			return v, nil
		}
		return t.hash(s, values), nil
	}
	return "", errNoTenant
}

// hashedLabels are the prefixes of the hashed sources' tenant ids (see
// hash): the namespaces a trusted value may not enter.
var hashedLabels = []string{"auth:", srcHeader + ":", srcCookie + ":"}

// hashedNamespace reports whether a trusted value starts like a hashed
// tenant id, whatever its case.
func hashedNamespace(v string) bool {
	for _, l := range hashedLabels {
		if len(v) >= len(l) && strings.EqualFold(v[:len(l)], l) {
			return true
		}
	}
	return false
}

// mixed reports whether a trusted header is a source beside credentials.
func (t *tenants) mixed() bool {
	trusted := false
	for _, s := range t.sources {
		trusted = trusted || !s.hashed()
	}
	return trusted && t.needsSecret()
}

// credentialHeaders are the request headers the hashed sources read
// besides Authorization and Cookie (never kept with an asynchronous
// request anyway): the header:NAME sources.
func (t *tenants) credentialHeaders() []string {
	var out []string
	for _, s := range t.sources {
		if s.kind == srcHeader {
			out = append(out, s.name)
		}
	}
	return out
}

// hash is the tenant id of a credential: the source, then the first 128
// bits of HMAC-SHA-256 under the tenant secret, in hex. Keyed, a leaked
// store or log does not let anyone test guessed credentials against it.
func (t *tenants) hash(s tenantSource, values []string) string {
	m := hmac.New(sha256.New, t.secret)
	for i, v := range values {
		if i > 0 {
			m.Write([]byte{'\n'})
		}
		m.Write([]byte(v))
	}
	label := s.String()
	if s.kind == srcAuthorization {
		label = "auth"
	} else if s.kind == srcHeader {
		label = srcHeader + ":" + strings.ToLower(s.name)
	}
	return label + ":" + hex.EncodeToString(m.Sum(nil)[:16])
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// validToken reports whether s is an RFC 9110 token (header and cookie
// names, methods).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Secret environment variables: a secret stays out of the process list.
const (
	tenantSecretEnv      = "IDEM_TENANT_SECRET"
	fingerprintSecretEnv = "IDEM_FINGERPRINT_SECRET"
)

// readSecret returns the secret of a --*-secret-file flag or of its
// environment variable (the file wins); nil when neither is set. Trailing
// white space (the newline editors add) is not part of the secret.
func readSecret(file, env, what string) ([]byte, error) {
	var b []byte
	switch {
	case file != "":
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%s secret: %w", what, err)
		}
		b = bytes.TrimRight(raw, " \t\r\n")
	case os.Getenv(env) != "":
		b = []byte(strings.TrimRight(os.Getenv(env), " \t\r\n"))
	default:
		return nil, nil
	}
	if len(b) < minSecretBytes {
		return nil, fmt.Errorf("%s secret: %d bytes, want at least %d (e.g. head -c 32 /dev/urandom | base64)", what, len(b), minSecretBytes)
	}
	return b, nil
}

// sqliteSecretPath returns where the generated tenant secret of a SQLite
// file store lives, or "" for a store that is not one file.
func sqliteSecretPath(dsn string) string {
	d, err := storeurl.Parse(dsn)
	if err != nil || d.Kind != storeurl.SQLite || d.Target == ":memory:" || strings.HasPrefix(d.Target, "file:") {
		return ""
	}
	return d.Target + ".tenant-secret"
}

// noSecretHelp says how to give a tenant secret.
const noSecretHelp = "give --tenant-secret-file PATH or set " + tenantSecretEnv +
	" (at least 16 bytes, e.g. head -c 32 /dev/urandom | base64 > tenant.secret)"

// refuseNewSecret refuses to make a tenant secret for a SQLite database
// that already holds records: their tenant ids were hashed under the
// secret that is missing, and a new one would file every caller under a
// new tenant, so the retries of their stored requests would run again.
func refuseNewSecret(dsn, db, path string) error {
	fi, err := os.Stat(db)
	switch {
	case errors.Is(err, fs.ErrNotExist) || (err == nil && fi.Size() == 0):
		return nil // a new database: nothing was hashed yet
	case err != nil:
		return fmt.Errorf("tenant secret: %w", err)
	}
	restore := fmt.Sprintf("restore %s (from a backup of the database's directory; mode 0600), or give the secret the records were filed under with --tenant-secret-file or %s", path, tenantSecretEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := storeurl.Open(ctx, dsn, storeurl.Options{})
	var recs []store.Record
	if err == nil {
		recs, _, err = s.List(ctx, store.ListParams{Limit: 1})
		s.Close()
	}
	switch {
	case err != nil && errors.Is(err, store.ErrInvalidParams):
		return fmt.Errorf("tenant secret: %w", err)
	case err != nil:
		// No schema yet (a database idem never used) tells nothing
		// either way: the operator decides.
		return fmt.Errorf("the tenant secret %s is missing and it cannot be told whether %s holds records (%v): %s", path, db, err, restore)
	case len(recs) > 0:
		return fmt.Errorf("the tenant secret %s is missing, but %s holds records whose tenants were hashed under it: a new secret would put every caller in a new tenant and their retries would run again. %s", path, db, restore)
	}
	return nil
}

// secretReadableByOthers reports whether a secret file may be read by
// other users than its owner.
func secretReadableByOthers(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().Perm()&0o077 != 0
}

// defaultTenantSecret is the proxy's tenant secret when none was given.
// A SQLite file store keeps one next to the database, created once, so a
// restart keeps every tenant id; the memory store lives as long as the
// process, and so may its secret. A shared store (PostgreSQL, MySQL,
// Redis) needs the same secret in every proxy: the operator must give it.
func defaultTenantSecret(dsn string) ([]byte, string, error) {
	d, err := storeurl.Parse(dsn)
	if err != nil {
		return nil, "", err
	}
	if d.Kind == storeurl.Memory || (d.Kind == storeurl.SQLite && d.Target == ":memory:") {
		b := make([]byte, 32)
		rand.Read(b)
		return []byte(hex.EncodeToString(b)), "", nil
	}
	path := sqliteSecretPath(dsn)
	if path == "" {
		return nil, "", fmt.Errorf("the tenant sources are hashed under a secret every proxy on a %s store must share: %s", d.Kind, noSecretHelp)
	}
	if b, err := readSecret(path, "", "tenant"); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return b, path, err
	}
	if err := refuseNewSecret(dsn, d.Target, path); err != nil {
		return nil, "", err
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	secret := []byte(hex.EncodeToString(raw))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another process created it first: use theirs.
		b, err := readSecret(path, "", "tenant")
		return b, path, err
	}
	if err != nil {
		return nil, "", fmt.Errorf("tenant secret: %w", err)
	}
	_, werr := f.Write(append(secret, '\n'))
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		os.Remove(path)
		return nil, "", fmt.Errorf("tenant secret: %w", err)
	}
	return secret, path, nil
}

// proxyTenants builds the tenant rule of the proxy's configuration.
func proxyTenants(cfg ProxyConfig, log *slog.Logger) (*tenants, error) {
	specs := cfg.TenantFrom
	if cfg.TenantHeader != "" {
		specs = append(slices.Clip(specs), srcTrusted+":"+cfg.TenantHeader)
	}
	sources, err := parseTenantSources(specs)
	if err != nil {
		return nil, configErr("proxy: %w", err)
	}
	switch {
	case cfg.SingleTenant && len(sources) > 0:
		return nil, configErr("proxy: --single-tenant and --tenant-from exclude each other")
	case cfg.SingleTenant:
		return &tenants{single: true}, nil
	case len(sources) == 0:
		return nil, configErr("proxy: no tenant source: callers would share each other's records. " +
			"Name how callers are told apart with --tenant-from (authorization, header:NAME, cookie:NAME " +
			"or trusted-header:NAME, e.g. --tenant-from authorization), or declare one trusted caller with --single-tenant")
	}
	t := &tenants{sources: sources, secret: cfg.TenantSecret}
	if t.needsSecret() && len(t.secret) == 0 {
		secret, path, err := defaultTenantSecret(cfg.Store)
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		if path != "" {
			log.Info("idem proxy: tenant secret from the file beside the database", "path", path)
			if secretReadableByOthers(path) {
				log.Warn("idem proxy: the tenant secret file is readable by other users: chmod 600 it", "path", path)
			}
		}
		t.secret = secret
	}
	if t.mixed() {
		log.Warn("idem proxy: a trusted tenant header is a source beside credentials: a request without a credential is filed under the header's value, "+
			"so the gateway in front must strip that header from what clients send (trusted values that look like a credential's tenant id are refused)",
			"tenant_from", t.String())
	}
	return t, nil
}
