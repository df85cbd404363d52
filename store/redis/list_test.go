package redis

import (
	"context"
	"fmt"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// repeatScan makes every SCAN reply hold each of its keys twice: SCAN may
// return a key more than once (Redis documents it; it happens when the
// keyspace's table shrinks during a scan), which a real server does only
// now and then.
type repeatScan struct{}

func (repeatScan) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (repeatScan) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (repeatScan) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if sc, ok := cmd.(*goredis.ScanCmd); ok && err == nil {
			keys, cursor := sc.Val()
			sc.SetVal(append(keys, keys...), cursor)
		}
		return err
	}
}

// TestListWithRepeatedScanKeys: a key SCAN returns twice is one record on
// the page, and the pages still hold every record once.
func TestListWithRepeatedScanKeys(t *testing.T) {
	t.Parallel()
	client, prefix := hookedClient(t, repeatScan{})
	clock := storetest.NewClock()
	s, err := New(client, Config{Prefix: prefix, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	const n = 25
	for i := range n {
		mustReserve(t, s, reserveParams(fmt.Sprint("k", i)), store.Created)
	}
	seen := map[string]int{}
	var cursor *store.Cursor
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatal("more pages than records")
		}
		recs, next, err := s.List(ctx, store.ListParams{Limit: 10, After: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			seen[r.Key]++
		}
		if next == nil {
			break
		}
		cursor = next
	}
	if len(seen) != n {
		t.Fatalf("listed %d distinct records of %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("record %s listed %d times", k, c)
		}
	}
}
