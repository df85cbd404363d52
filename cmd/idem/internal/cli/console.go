package cli

import (
	"context"
	"net/http"

	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// consoleTenant is the tenant the proxy files a request carrying this
// Authorization value under. The console calls it to search by credential,
// so it hashes exactly as the proxy does, whatever the tenant sources.
func (p *Proxy) consoleTenant(credential string) (string, error) {
	return p.tenants.tenant(&http.Request{Header: http.Header{"Authorization": {credential}}})
}

// consoleSettle settles an unknown record through package maintenance, as
// `idem reconcile resolve` does, with the proxy's maintenance settings.
func (p *Proxy) consoleSettle(ctx context.Context, scope, key string, fence int64, res maintenance.Resolution) error {
	s := p.Store()
	if s == nil {
		return store.ErrNotFound
	}
	// The proxy's own settings: its store timeout bounds the call, and the
	// settlement is logged and counted (reconcile_resolved) with the
	// others.
	m, err := maintenance.New(s, p.maintenanceConfig())
	if err != nil {
		return err
	}
	return m.Settle(ctx, scope, key, fence, res)
}

// mountConsole adds the operations console to the admin handlers.
func (p *Proxy) mountConsole(cfg *ProxyConfig) error {
	h, err := console.New(console.Config{
		Store: p.Store, Settle: p.consoleSettle, Tenant: p.consoleTenant,
		Credentials: cfg.ConsoleCredentials, Addr: cfg.Admin,
		Logger: p.log, MeterProvider: cfg.MeterProvider,
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
