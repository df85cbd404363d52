package redis

import (
	"hash/fnv"
	"io"
	"strconv"
	"strings"
)

// shardCount is the number of index shards. A record's shard is both the hash
// tag of its key and the hash tag of the index sorted sets it belongs to, so
// every script touches a single hash slot. Changing it moves every record to
// another key: it is part of the data layout, not a tuning knob.
const shardCount = 256

// Index sorted sets of a shard, in the order the scripts expect them
// (lua/lib.lua: idx and REC).
var indexNames = [5]string{"lease", "unknown", "term", "open", "dead"}

const (
	idxLease = iota
	idxUnknown
	idxTerm
	idxOpen
	idxDead
)

// shardOf spreads records over the shards by a hash of their identity.
func shardOf(scope, key string) int {
	h := fnv.New64a()
	writeIdentity(h, scope, key)
	return int(h.Sum64() % shardCount)
}

// writeIdentity encodes (scope, key) unambiguously: the scope's length comes
// first, so ("a", "bc") and ("ab", "c") never share a key.
func writeIdentity(w io.Writer, scope, key string) {
	_, _ = w.Write([]byte(strconv.Itoa(len(scope))))
	_, _ = w.Write([]byte{':'})
	_, _ = w.Write([]byte(scope))
	_, _ = w.Write([]byte(key))
}

// tag is the hash tag of a shard: "{17}".
func (s *Store) tag(shard int) string {
	return s.cfg.Prefix + "{" + strconv.Itoa(shard) + "}"
}

// indexKeys returns the index keys of a shard.
func (s *Store) indexKeys(shard int) []string {
	t := s.tag(shard)
	keys := make([]string, len(indexNames))
	for i, n := range indexNames {
		keys[i] = t + "i:" + n
	}
	return keys
}

// recordKey is "<prefix>{<shard>}r:<len(scope)>:<scope><key>". The full
// identity follows the tag, so two records never share a key even when they
// share a shard.
func (s *Store) recordKey(scope, key string) string {
	var b strings.Builder
	b.WriteString(s.tag(shardOf(scope, key)))
	b.WriteString("r:")
	writeIdentity(&b, scope, key)
	return b.String()
}

// scriptKeys returns KEYS for a single-record script: the shard's index
// keys, then the record.
func (s *Store) scriptKeys(scope, key string) []string {
	return append(s.indexKeys(shardOf(scope, key)), s.recordKey(scope, key))
}
