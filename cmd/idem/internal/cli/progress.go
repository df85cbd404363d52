package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// progressFlags are --progress and --progress-interval, shared by the
// commands that can run long.
type progressFlags struct {
	fs    *flag.FlagSet
	on    bool
	every time.Duration
}

func (p *progressFlags) register(fs *flag.FlagSet) {
	p.fs = fs
	fs.BoolVar(&p.on, "progress", false, "print a progress line on stderr every --progress-interval (on by default when stderr is a terminal; --progress=false turns it off)")
	fs.DurationVar(&p.every, "progress-interval", time.Second, "how often the progress line is printed")
}

// open returns the progress printer on stderr, or nil when progress is off:
// --progress decides when it is given, else whether stderr is a terminal.
func (p *progressFlags) open(stderr io.Writer) (*progress, error) {
	if p.every <= 0 {
		return nil, usageErr(p.fs, "--progress-interval must be positive")
	}
	term := isTerminal(stderr)
	on := term
	p.fs.Visit(func(f *flag.Flag) {
		if f.Name == "progress" {
			on = p.on
		}
	})
	if !on {
		return nil, nil
	}
	return &progress{w: stderr, every: p.every, term: term}, nil
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progress prints a status line every interval while a command runs. On a
// terminal the line is rewritten in place; elsewhere (a log, a test) each
// is a line of its own.
type progress struct {
	w     io.Writer
	every time.Duration
	term  bool
}

// start prints line() every interval until stop, which prints it a last
// time, so that the final counts are always shown. A nil *progress does
// nothing.
func (p *progress) start(line func() string) (stop func()) {
	if p == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(p.every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.print(line(), false)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		p.print(line(), true)
	}
}

func (p *progress) print(line string, last bool) {
	switch {
	case !p.term:
		fmt.Fprintln(p.w, line)
	case last:
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	default:
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	}
}

// passCounter counts the batches and records of a maintenance pass, from
// the store calls and resolver calls the pass makes.
type passCounter struct {
	batches   atomic.Int64
	records   atomic.Int64
	deleted   atomic.Int64
	abandoned atomic.Int64
}

// countingStore is a store whose Reap and ListUnknown calls (one per batch
// of a pass) are counted; the empty call that ends a pass is no batch.
type countingStore struct {
	store.Store
	c *passCounter
}

func (s countingStore) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	res, err := s.Store.Reap(ctx, p)
	if err == nil && res.Deleted+res.Abandoned > 0 {
		s.c.batches.Add(1)
		s.c.records.Add(int64(res.Deleted + res.Abandoned))
		s.c.deleted.Add(int64(res.Deleted))
		s.c.abandoned.Add(int64(res.Abandoned))
	}
	return res, err
}

func (s countingStore) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	recs, err := s.Store.ListUnknown(ctx, p)
	if err == nil && len(recs) > 0 {
		s.c.batches.Add(1)
	}
	return recs, err
}

// countingResolver counts the records a reconciliation pass asks about.
type countingResolver struct {
	maintenance.Resolver
	c *passCounter
}

func (r countingResolver) Resolve(ctx context.Context, rec store.Record) (maintenance.Resolution, error) {
	defer r.c.records.Add(1)
	return r.Resolver.Resolve(ctx, rec)
}

// rate formats n events over d as a per-second rate.
func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "0.0/s"
	}
	return fmt.Sprintf("%.1f/s", float64(n)/d.Seconds())
}
