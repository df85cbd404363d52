package cli

import (
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/console"
)

// credentialTenant is the tenant the proxy files a request with this
// Authorization value under, or nil when tenants come from a header. The
// console calls it to search by credential, so it hashes exactly as the
// proxy does.
func credentialTenant(cfg ProxyConfig) func(string) string {
	if cfg.TenantHeader != "" {
		return nil
	}
	tenant := tenantFunc("", cfg.TenantSecret)
	return func(credential string) string {
		return tenant(&http.Request{Header: http.Header{"Authorization": {credential}}})
	}
}

// mountConsole adds the operations console to the admin handlers.
func (p *Proxy) mountConsole(cfg *ProxyConfig) error {
	settler := p.engine.Maintainer(idem.MaintenanceConfig{})
	h, err := console.New(console.Config{
		Store: p.store, Settle: settler.Settle, Tenant: credentialTenant(*cfg),
		Credentials: cfg.ConsoleCredentials, Addr: cfg.Admin,
	})
	if err != nil {
		return err
	}
	handlers := map[string]http.Handler{console.Prefix: h}
	for pattern, x := range cfg.AdminHandlers {
		handlers[pattern] = x
	}
	cfg.AdminHandlers = handlers
	return nil
}
