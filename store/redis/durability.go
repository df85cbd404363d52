package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store"
)

var _ store.DurabilityChecker = (*Store)(nil)

// DefaultWaitTimeout is Config.WaitTimeout's default.
const DefaultWaitTimeout = time.Second

// eval runs a script that changes a record. With Config.WaitReplicas it
// sends WAIT right behind it, in one pipeline on one connection (WAIT
// counts the replicas that acknowledged the writes of its own
// connection), to the master that holds the record's keys; a write fewer
// replicas acknowledged within WaitTimeout fails, retryable.
func (s *Store) eval(ctx context.Context, sc *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	n := s.cfg.WaitReplicas
	if n <= 0 {
		return sc.Run(ctx, once{s.client}, keys, args...)
	}
	var node interface {
		Pipeline() goredis.Pipeliner
	} = s.client
	if c, ok := s.client.(*goredis.ClusterClient); ok {
		m, err := c.MasterForKey(ctx, keys[0])
		if err != nil {
			cmd := goredis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		node = m
	}
	var cmd *goredis.Cmd
	var wait *goredis.Cmd
	for attempt := range 2 {
		pipe := node.Pipeline()
		if attempt == 0 {
			cmd = sc.EvalSha(ctx, once{pipe}, keys, args...)
		} else {
			cmd = sc.Eval(ctx, once{pipe}, keys, args...) // the server lost its script cache
		}
		wait = pipe.Do(ctx, "wait", n, s.cfg.WaitTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if attempt > 0 || cmd.Err() == nil || !goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			break
		}
	}
	if cmd.Err() != nil {
		return cmd
	}
	if err := s.waited(wait, n); err != nil {
		cmd.SetErr(err)
	}
	return cmd
}

// waited reads the answer of a WAIT for n replicas: an error when it
// failed, retryable when fewer acknowledged the write within WaitTimeout.
func (s *Store) waited(wait *goredis.Cmd, n int) error {
	got, err := wait.Int64()
	switch {
	case err != nil:
		return fmt.Errorf("wait for %d replica(s): %w", n, err)
	case got < int64(n):
		return store.Retryable(fmt.Errorf("%d of %d replica(s) acknowledged the write within %v", got, n, s.cfg.WaitTimeout))
	}
	return nil
}

// CheckDurability reports whether a write the store acknowledged survives
// a restart of Redis and a failover to a replica, on every master:
//
//   - at risk without the append-only file (appendonly no): a restart
//     loses everything since the last snapshot, or everything when there
//     are no snapshots (save ""), and every key then runs again on a retry;
//   - at risk when replicas are attached but writes do not wait for them
//     (Config.WaitReplicas, wait_replicas in the URL): a failover to a
//     replica can lose acknowledged writes;
//   - at risk when the server is a replica;
//   - safe otherwise, with a warning for appendfsync everysec or no (an
//     operating-system crash can lose the last writes).
//
// A server that refuses CONFIG (managed Redis often does) gives
// DurabilityUnknown with a warning, unless what INFO shows is at risk
// already.
func (s *Store) CheckDurability(ctx context.Context) (store.Durability, error) {
	var mu sync.Mutex
	var nodes []redisNode
	check := func(ctx context.Context, c *goredis.Client) error {
		n, err := readNode(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
		return nil
	}
	var err error
	if c, ok := s.client.(*goredis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, check)
	} else if c, ok := s.client.(*goredis.Client); ok {
		err = check(ctx, c)
	} else {
		return store.Durability{State: store.DurabilityUnknown, Replicas: -1,
			Warnings: []string{"the store's client is of a kind whose servers the durability check cannot reach"}}, nil
	}
	if err != nil {
		return store.Durability{}, wrap("check durability", err)
	}
	return redisDurability(nodes, s.cfg.WaitReplicas), nil
}

// redisNode is what one master said.
type redisNode struct {
	config   map[string]string // nil when CONFIG was refused
	refusal  string            // why CONFIG was refused
	role     string
	replicas int
}

func readNode(ctx context.Context, c *goredis.Client) (redisNode, error) {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return redisNode{}, err
	}
	n := redisNode{role: infoField(info, "role")}
	n.replicas, _ = strconv.Atoi(infoField(info, "connected_slaves"))
	cfg := map[string]string{}
	for _, name := range []string{"appendonly", "appendfsync", "save"} {
		kv, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			if !isCommandRefused(err) {
				return redisNode{}, err
			}
			n.refusal = err.Error()
			return n, nil
		}
		cfg[name] = kv[name]
	}
	n.config = cfg
	return n, nil
}

// isCommandRefused reports a server error that means CONFIG is not
// available to this client (renamed, disabled, or not permitted), as
// opposed to a connection failure.
func isCommandRefused(err error) bool {
	var re goredis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "ERR") || strings.HasPrefix(msg, "NOPERM")
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// redisDurability is the verdict of CheckDurability on what the masters
// said.
func redisDurability(nodes []redisNode, waitReplicas int) store.Durability {
	d := store.Durability{State: store.DurabilitySafe, Settings: map[string]string{"wait_replicas": strconv.Itoa(waitReplicas)},
		Synchronous: waitReplicas > 0}
	atRisk := func(w string) {
		d.State = store.DurabilityAtRisk
		d.Warnings = append(d.Warnings, w)
	}
	unknown := false
	for _, n := range nodes {
		d.Replicas += n.replicas
		d.Settings["role"] = n.role
		if n.role != "" && n.role != "master" {
			atRisk("the store is connected to a Redis replica: point it at the master (or use a cluster or sentinel URL)")
		}
		switch {
		case n.replicas > 0 && waitReplicas == 0:
			atRisk(fmt.Sprintf("%d replica(s) attached but writes do not wait for them: a failover to a replica can lose answers "+
				"already acknowledged, and their keys run again on a retry; add wait_replicas=N to the store URL "+
				"(Config.WaitReplicas) so that each write waits for N replicas", n.replicas))
		case waitReplicas > n.replicas:
			d.Synchronous = false
			d.Warnings = append(d.Warnings, fmt.Sprintf("writes wait for %d replica(s) but %d are attached: every write fails until enough attach",
				waitReplicas, n.replicas))
		}
		if n.config == nil {
			unknown = true
			d.Warnings = append(d.Warnings, "CONFIG is not available to the store's user ("+n.refusal+"): whether Redis keeps its data "+
				"across a restart (appendonly, appendfsync) cannot be checked; make sure the append-only file is on")
			continue
		}
		for k, v := range n.config {
			d.Settings[k] = v
		}
		switch {
		case n.config["appendonly"] != "yes" && strings.TrimSpace(n.config["save"]) == "":
			atRisk(`appendonly is no and there are no snapshots (save ""): a restart of Redis empties it, every answer it kept is lost ` +
				"and every key runs again on a retry; set appendonly yes (appendfsync everysec or always)")
		case n.config["appendonly"] != "yes":
			atRisk("appendonly is no: a restart of Redis loses every answer written since the last snapshot, and those keys run " +
				"again on a retry; set appendonly yes (appendfsync everysec or always)")
		case n.config["appendfsync"] != "always":
			d.Warnings = append(d.Warnings, "appendfsync is "+n.config["appendfsync"]+": an operating-system crash or power loss "+
				"can lose the last writes (up to a second with everysec); appendfsync always closes that window")
		}
	}
	if unknown && d.State == store.DurabilitySafe {
		d.State = store.DurabilityUnknown
	}
	if len(nodes) == 0 {
		d.State, d.Replicas = store.DurabilityUnknown, -1
	}
	return d
}

var _ store.Syncer = (*Store)(nil)

// Sync implements store.Syncer. A record is visible on its master as soon
// as its script ran, before any replica has it; with Config.WaitReplicas,
// a write whose WAIT fell short fails, but a later read still shows it.
// Sync writes a marker on every master that holds records, each followed by
// WAIT: a master's replication is one ordered stream, so the replicas that
// acknowledged the marker hold every write the master made before it. It
// fails, retryable, when fewer than WaitReplicas did within WaitTimeout.
// Without WaitReplicas it returns nil: writes do not wait for replicas,
// and Sync promises no more than they do.
func (s *Store) Sync(ctx context.Context) error {
	n := s.cfg.WaitReplicas
	if n <= 0 {
		return nil
	}
	c, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		return s.barrier(ctx, s.client, s.cfg.Prefix+"sync", n)
	}
	// Records live in the shards' slots only: one marker per master that
	// holds any of them, in one of its shards.
	markers := map[*goredis.Client]string{}
	for shard := range shardCount {
		key := s.tag(shard) + "sync"
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return wrap("sync", err)
		}
		if _, ok := markers[m]; !ok {
			markers[m] = key
		}
	}
	// Every master at once: the slowest bounds the wait.
	errs := make(chan error, len(markers))
	for m, key := range markers {
		go func() { errs <- s.barrier(ctx, m, key, n) }()
	}
	var err error
	for range markers {
		if e := <-errs; err == nil {
			err = e
		}
	}
	return err
}

// barrier writes key on node and waits until n replicas acknowledged it.
func (s *Store) barrier(ctx context.Context, node interface{ Pipeline() goredis.Pipeliner }, key string, n int) error {
	pipe := node.Pipeline()
	set := pipe.Set(ctx, key, "1", time.Minute)
	wait := pipe.Do(ctx, "wait", n, s.cfg.WaitTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx)
	if err := set.Err(); err != nil {
		return wrap("sync", err)
	}
	return wrap("sync", s.waited(wait, n))
}
