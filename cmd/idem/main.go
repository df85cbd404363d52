// Command idem puts idempotency keys in front of HTTP APIs: a reverse proxy
// over the idem engine, and the operator commands of its stores. Run
// `idem help` for the commands; they live in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idem-go/idem/cmd/idem/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal starts a graceful shutdown, a second one
		// kills the process the default way.
		<-ctx.Done()
		stop()
	}()
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
