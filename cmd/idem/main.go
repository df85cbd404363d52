// Command idem puts idempotency keys in front of HTTP APIs: a reverse proxy
// over the idem engine, and the operator commands of its stores. Run
// `idem help` for the commands; they live in internal/cli.
package main

import (
	"context"
	"errors"
	"fmt"
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
	err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, cli.ErrUsage):
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "idem: %v\n", err)
		os.Exit(1)
	}
}
