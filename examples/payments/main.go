// Command payments runs the reference payments service of idem with its
// fake card provider. See README.md.
//
//	go run ./examples/payments [--db sqlite:payments.db | --db postgres://...]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idem-go/idem/examples/payments/payments"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

// shutdownTimeout bounds the graceful shutdown: requests in flight finish,
// charges being delivered finish, then the database closes.
const shutdownTimeout = 15 * time.Second

// run serves until ctx is done, then shuts down gracefully. ready, when
// not nil, receives the API's and the provider's addresses once both
// listen.
func run(ctx context.Context, args []string, stderr io.Writer, ready func(api, provider string)) error {
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		listen      = fs.String("listen", "127.0.0.1:8080", "address of the payments API")
		db          = fs.String("db", "sqlite:payments.db", "database: sqlite:PATH or postgres://... (search_path=SCHEMA picks a schema)")
		provListen  = fs.String("provider-listen", "127.0.0.1:8081", "address of the built-in fake card provider; empty to run none")
		provURL     = fs.String("provider-url", "", "card provider base URL (default: the built-in one)")
		provTimeout = fs.Duration("provider-timeout", 3*time.Second, "bound on one call to the provider; a call past it has an unknown outcome")
		fail        = fs.Int("provider-fail", 0, "the built-in provider fails its next N calls with 503, doing nothing")
		timeouts    = fs.Int("provider-timeouts", 0, "the built-in provider takes effect on its next N calls and never answers them")
		latency     = fs.Duration("provider-latency", 0, "the built-in provider delays every call by this much")
		lease       = fs.Duration("lease", 30*time.Second, "idempotency lease; a dead holder's key is taken over (refunds) or goes unknown (payments) after it")
		wait        = fs.Duration("wait", 0, "let a duplicate of a request in flight wait this long for its answer instead of getting 409")
		reconcile   = fs.Duration("reconcile-interval", 5*time.Second, "how often unknown outcomes are reconciled")
		sweep       = fs.Duration("sweep-interval", 15*time.Second, "how often expired leases are swept")
		backoff     = fs.Duration("outbox-backoff", time.Second, "delay after a failed charge attempt, times the attempt number")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		logJSON     = fs.Bool("log-json", false, "log JSON instead of text")
		onlyProv    = fs.Bool("provider-only", false, "run only the fake provider (on --provider-listen), e.g. to crash the service without losing the provider's charges")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	if *logJSON {
		log = slog.New(slog.NewJSONHandler(stderr, opts))
	} else {
		log = slog.New(slog.NewTextHandler(stderr, opts))
	}

	// The fake provider listens on its own port: the service reaches it
	// over the network, as it would a real one.
	var (
		provider   *payments.Provider
		provSrv    *http.Server
		provErr    = make(chan error, 1)
		providerAt string
	)
	if *provListen != "" {
		provider = payments.NewProvider()
		if err := provider.SetFaults(payments.Faults{Fail: *fail, Timeout: *timeouts, Latency: latency.String()}); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", *provListen)
		if err != nil {
			return fmt.Errorf("provider: %w", err)
		}
		providerAt = ln.Addr().String()
		provSrv = &http.Server{Handler: provider, ReadHeaderTimeout: 10 * time.Second}
		go func() { provErr <- provSrv.Serve(ln) }()
		defer provSrv.Close()
		if *provURL == "" {
			*provURL = "http://" + providerAt
		}
		log.Info("fake card provider listening", "addr", providerAt)
	}
	if *onlyProv {
		if provider == nil {
			return errors.New("--provider-only needs --provider-listen")
		}
		if ready != nil {
			ready("", providerAt)
		}
		var serveErr error
		select {
		case <-ctx.Done():
		case serveErr = <-provErr:
		}
		provider.Close()
		stopCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return errors.Join(serveErr, provSrv.Shutdown(stopCtx))
	}
	if *provURL == "" {
		return errors.New("--provider-url is required with --provider-listen empty")
	}

	svc, err := payments.Open(ctx, payments.Config{
		DB: *db, ProviderURL: *provURL, ProviderTimeout: *provTimeout,
		Lease: *lease, Wait: *wait, ReconcileInterval: *reconcile, SweepInterval: *sweep,
		OutboxBackoff: *backoff, Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := svc.Close(); err != nil {
			log.Error("closing the database", "err", err)
		}
	}()
	// Background work runs until shutdown, not until a request ends.
	if err := svc.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return errors.Join(err, svc.Stop(stopCtx))
	}
	api := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	apiErr := make(chan error, 1)
	go func() { apiErr <- api.Serve(ln) }()
	log.Info("payments API listening", "addr", ln.Addr().String(), "db", redact(*db), "provider", *provURL)
	if ready != nil {
		ready(ln.Addr().String(), providerAt)
	}

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case serveErr = <-apiErr:
	case serveErr = <-provErr:
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	// First the API (requests in flight finish and store their answers),
	// then the outbox and the maintainer (a charge being delivered
	// finishes), then the provider, then the database (deferred).
	errs := []error{serveErr}
	if err := api.Shutdown(stopCtx); err != nil {
		errs = append(errs, fmt.Errorf("api shutdown: %w", err))
	}
	if err := svc.Stop(stopCtx); err != nil {
		errs = append(errs, err)
	}
	if provider != nil {
		provider.Close()
		if err := provSrv.Shutdown(stopCtx); err != nil {
			errs = append(errs, fmt.Errorf("provider shutdown: %w", err))
		}
	}
	log.Info("stopped")
	return errors.Join(errs...)
}

// redact hides a password in a database URL for the logs.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
