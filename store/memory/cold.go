package memory

import (
	"encoding/binary"
	"hash/maphash"
	"net/http"
	"slices"
	"unsafe"

	"github.com/idem-go/idem/store"
)

// cold keeps completed records in memory the garbage collector never
// traces. A store holds mostly completed records (a day of answers), and
// a collection traces every object with pointers it finds, each time: as
// entries, those records were most of the collector's work in a busy
// process. Here a record is a slot in pointer-free pages of slots, its key,
// fingerprint and body are bytes in large pointer-free chunks, and the
// index is a map from a hash of the key to a slot (kept per scope, see
// records), whose keys and values hold no pointer either. The tenant and
// the header are small indices into tables of the few distinct values a
// store sees; a header that differs from answer to answer (a Location, a
// request id) is kept in the record's text once the table is full, and
// read from there.
//
// Only a record completed by Complete and holding nothing beyond an
// answer of moderate size is moved here (see freeze): every other record,
// and any record about to change, is an entry. A record is read here
// without being moved (record, entry); find moves it back to an entry
// (thaw) before any transition, so the store's transitions are written
// once, for entries.
//
// The bytes of a chunk are never written again once written: strings and
// slices over them, handed out in records, stay valid and immutable after
// their record is gone (the collector keeps a chunk while they point into
// it).
type cold struct {
	seed maphash.Seed
	// pages hold the slots, slot i at pages[i/pageSlots][i%pageSlots]:
	// one growing array would be copied, and its new memory faulted in,
	// at every doubling.
	pages  []*[pageSlots]slot
	n      int32   // slots in use or free
	free   []int32 // unused slots
	chunks []chunk
	cur    int32   // the chunk being filled; -1 before the first
	spare  []int32 // chunks emptied and dropped, whose index is free
	// live is the bytes of the records' text, held the size of the chunks
	// kept for them (see compact).
	live, held int
	// tenants and headers are the interned values slots refer to, with
	// their indices by value; lastHeader is the header map interned last,
	// which the store's sharing (see Store.share) makes the common one.
	tenants    []string
	tenantOf   map[string]int32
	headers    []http.Header
	headerOf   map[string]int32
	lastHeader http.Header
	lastIndex  int32
	// size, maxText, slack and maxHeaders are chunkSize, maxColdText,
	// compactSlack and maxHeaders, which tests make small.
	size, maxText, slack, maxHeaders int
	// Tests: disabled keeps every record an entry; collide hashes every
	// key alike, so that lookups go through the chains.
	disabled, collide bool
}

// slot is one cold record. It holds no pointer.
type slot struct {
	hash uint64 // of the key, with the store's seed
	next int32  // the next slot of the same scope and hash; -1 ends the chain
	// The record's text: key, fingerprint, header (when inline) and body,
	// in this order, at off in chunks[chunk].
	chunk                   int32
	off                     uint32
	klen, fplen, hlen, blen uint32
	// tenant and header are indices into tenants and headers; header is
	// noHeader for a nil one and inlineHeader for one in the text.
	tenant, header   int32
	status, attempts int32
	policy           policyCode
	omitted, nilBody bool
	fence            int64
	lockedUntil      micros
	createdAt        micros
	updatedAt        micros
	completedAt      micros
	expiresAt        micros
}

type chunk struct {
	b    []byte // what was written; its capacity is the chunk's size
	live int    // bytes of records still here
}

const (
	pageSlots = 1 << 12
	chunkSize = 256 << 10
	// maxColdText bounds the text of a record moved here: a larger answer
	// stays an entry, so that a chunk holds many records and one kept
	// record cannot keep a chunk of mostly dead bytes alive.
	maxColdText = 8 << 10
	// compactSlack is how far held may exceed twice live, at least,
	// before compact runs: a small store is never compacted.
	compactSlack = 4 * chunkSize
	// maxHeaders bounds the distinct headers interned. Past it, a header
	// not interned is kept in its record's text (headerText).
	maxHeaders = 1024
)

// The header of a slot that is not an index into cold.headers.
const (
	noHeader     = -1
	inlineHeader = -2
)

// at returns slot i.
func (c *cold) at(i int32) *slot { return &c.pages[i/pageSlots][i%pageSlots] }

func newCold() cold {
	return cold{seed: maphash.MakeSeed(), cur: -1, tenantOf: make(map[string]int32), headerOf: make(map[string]int32),
		size: chunkSize, maxText: maxColdText, slack: compactSlack, maxHeaders: maxHeaders}
}

func (c *cold) hash(key string) uint64 {
	if c.collide {
		return 1
	}
	return maphash.String(c.seed, key)
}

// text returns the text of slot i.
func (c *cold) text(i int32) []byte {
	sl := c.at(i)
	end := sl.off + sl.size()
	return c.chunks[sl.chunk].b[sl.off:end:end]
}

// size is the length of the slot's text.
func (sl *slot) size() uint32 { return sl.klen + sl.fplen + sl.hlen + sl.blen }

func (c *cold) key(i int32) string {
	sl := c.at(i)
	t := c.text(i)
	return unsafe.String(&t[0], sl.klen)
}

// find returns the slot of key in rs, -1 if there is none.
func (c *cold) find(rs *records, key string) int32 {
	if len(rs.cold) == 0 {
		return -1
	}
	head, ok := rs.cold[c.hash(key)]
	if !ok {
		return -1
	}
	for i := head; i >= 0; i = c.at(i).next {
		if c.key(i) == key {
			return i
		}
	}
	return -1
}

// entry sets e to the record of slot i in rs. Its strings and body are
// views of the slot's text. Without header, an inline header is left nil
// (reading it allocates a map): for visits that read no answer.
func (c *cold) entry(rs *records, i int32, e *entry, header bool) {
	sl := c.at(i)
	t := c.text(i)
	*e = entry{
		key: unsafe.String(&t[0], sl.klen), scope: rs.scope, tenant: c.tenants[sl.tenant],
		state: stCompleted, policy: sl.policy, hasResp: true, packed: true,
		attempts: sl.attempts, fence: sl.fence, lockedUntil: sl.lockedUntil, createdAt: sl.createdAt,
		updatedAt: sl.updatedAt, completedAt: sl.completedAt, expiresAt: sl.expiresAt,
	}
	if sl.fplen > 0 {
		e.fp = unsafe.String(&t[sl.klen], sl.fplen)
	}
	e.resp = store.Response{Status: int(sl.status), BodyOmitted: sl.omitted}
	switch {
	case sl.header >= 0:
		e.resp.Header = c.headers[sl.header]
	case sl.header == inlineHeader && header:
		e.resp.Header = parseHeader(t[sl.klen+sl.fplen : sl.klen+sl.fplen+sl.hlen])
	}
	if !sl.nilBody {
		e.resp.Body = t[sl.klen+sl.fplen+sl.hlen:]
	}
}

// record returns the record of slot i in rs, with a response of its own.
func (c *cold) record(rs *records, i int32) store.Record {
	var e entry
	c.entry(rs, i, &e, true)
	r := e.fields()
	r.Response = e.response()
	return r
}

// freeze moves e, a record just completed, here, if it is of a kind kept
// here; it reports whether it did. The caller removes the entry from its
// maps.
func (c *cold) freeze(rs *records, e *entry) bool {
	if c.disabled || e.state != stCompleted || !e.hasResp || (e.more != nil && *e.more != none) ||
		len(e.key)+len(e.fp)+len(e.resp.Body) > c.maxText || e.resp.Status != int(int32(e.resp.Status)) {
		return false
	}
	hdr, inline := c.header(e.resp.Header)
	n := len(e.key) + len(e.fp) + len(inline) + len(e.resp.Body)
	if n > c.maxText {
		return false
	}
	ch, off := c.write(n, e.key, e.fp, inline, e.resp.Body)
	h := c.hash(e.key)
	i := c.slot()
	*c.at(i) = slot{
		hash: h, next: -1, chunk: ch, off: off,
		klen: uint32(len(e.key)), fplen: uint32(len(e.fp)), hlen: uint32(len(inline)), blen: uint32(len(e.resp.Body)),
		tenant: c.tenant(e.tenant), header: hdr, status: int32(e.resp.Status), attempts: e.attempts,
		policy: e.policy, omitted: e.resp.BodyOmitted, nilBody: e.resp.Body == nil, fence: e.fence,
		lockedUntil: e.lockedUntil, createdAt: e.createdAt, updatedAt: e.updatedAt,
		completedAt: e.completedAt, expiresAt: e.expiresAt,
	}
	if rs.cold == nil {
		rs.cold = make(map[uint64]int32)
	}
	if head, ok := rs.cold[h]; ok {
		c.at(i).next = head
	}
	rs.cold[h] = i
	rs.frozen++
	return true
}

// remove drops slot i of rs.
func (c *cold) remove(rs *records, i int32) {
	sl := c.at(i)
	h := sl.hash
	switch head := rs.cold[h]; {
	case head == i && sl.next < 0:
		delete(rs.cold, h)
	case head == i:
		rs.cold[h] = sl.next
	default:
		p := head
		for c.at(p).next != i {
			p = c.at(p).next
		}
		c.at(p).next = sl.next
	}
	rs.frozen--
	c.release(sl.chunk, int(sl.size()))
	*sl = slot{}
	c.free = append(c.free, i)
	if c.held > 2*c.live+max(c.slack, c.live/4) {
		c.compact()
	}
}

// release notes that n bytes of chunk ch are no longer a record's, and
// drops the chunk once it holds none and is not being filled.
func (c *cold) release(ch int32, n int) {
	c.chunks[ch].live -= n
	c.live -= n
	if c.chunks[ch].live == 0 && ch != c.cur {
		c.drop(ch)
	}
}

// drop forgets chunk ch, which holds no record; its index is reused.
func (c *cold) drop(ch int32) {
	c.held -= cap(c.chunks[ch].b)
	c.chunks[ch].b = nil
	c.spare = append(c.spare, ch)
}

// compact copies the records of the chunks less than half full into a new
// chunk, so that those chunks are dropped: a few long-lived
// records among many short-lived ones (routes with different TTLs) would
// otherwise keep every chunk they were written to, at 256 KiB each. It
// runs when the chunks exceed twice the size of the records in them by a
// quarter of that size (or by compactSlack, for a small store). It leaves
// them at most twice that size plus the chunk being filled, so that
// between two of its passes over the slots about a ninth of the records'
// bytes, at least, were removed. The bytes are copied, not moved: what was
// handed out keeps pointing into the old chunk, which the collector keeps
// while it is referenced, and no chunk is written where it was written
// before.
func (c *cold) compact() {
	// The chunk being filled may be as sparse as any: the records moved
	// go to a new one.
	c.cur = -1
	sparse := make([]bool, len(c.chunks))
	for i := range c.chunks {
		switch ch := &c.chunks[i]; {
		case ch.b == nil:
		case ch.live == 0:
			c.drop(int32(i))
		default:
			sparse[i] = 2*ch.live < cap(ch.b)
		}
	}
	for i := range c.n {
		sl := c.at(i)
		if sl.klen == 0 || int(sl.chunk) >= len(sparse) || !sparse[sl.chunk] {
			continue // unused (every key has a byte), or where it stays
		}
		// A slot not visited yet is in a chunk not dropped yet, so an
		// index that write reuses for a new chunk is never one of theirs.
		t := c.text(i)
		old := sl.chunk
		sl.chunk, sl.off = c.write(len(t), "", "", "", t)
		c.release(old, len(t))
	}
}

// slot returns the index of an unused slot.
func (c *cold) slot() int32 {
	if n := len(c.free); n > 0 {
		i := c.free[n-1]
		c.free = c.free[:n-1]
		return i
	}
	if c.n%pageSlots == 0 {
		c.pages = append(c.pages, new([pageSlots]slot))
	}
	c.n++
	return c.n - 1
}

// write appends the n bytes of key, fp, hdr and body to the current
// chunk, or to a new one when they do not fit, and returns where they are.
func (c *cold) write(n int, key, fp, hdr string, body []byte) (int32, uint32) {
	if c.cur < 0 || cap(c.chunks[c.cur].b)-len(c.chunks[c.cur].b) < n {
		old := c.cur
		c.cur = c.chunk()
		if old >= 0 && c.chunks[old].live == 0 {
			c.drop(old)
		}
	}
	ch := &c.chunks[c.cur]
	off := len(ch.b)
	ch.b = append(append(append(append(ch.b, key...), fp...), hdr...), body...)
	ch.live += n
	c.live += n
	return c.cur, uint32(off)
}

// chunk returns the index of a new, empty chunk.
func (c *cold) chunk() int32 {
	ch := chunk{b: make([]byte, 0, c.size)}
	c.held += c.size
	if n := len(c.spare); n > 0 {
		i := c.spare[n-1]
		c.spare = c.spare[:n-1]
		c.chunks[i] = ch
		return i
	}
	c.chunks = append(c.chunks, ch)
	return int32(len(c.chunks) - 1)
}

func (c *cold) tenant(t string) int32 {
	if i, ok := c.tenantOf[t]; ok {
		return i
	}
	c.tenants = append(c.tenants, t)
	i := int32(len(c.tenants) - 1)
	c.tenantOf[t] = i
	return i
}

// header returns the index of h among the interned headers, interning it
// if there is room. If there is not, it returns inlineHeader and h's text,
// to be kept with the record.
func (c *cold) header(h http.Header) (int32, string) {
	if h == nil {
		return noHeader, ""
	}
	if same(h, c.lastHeader) {
		return c.lastIndex, ""
	}
	k := headerText(h)
	i, ok := c.headerOf[k]
	if !ok {
		if len(c.headers) >= c.maxHeaders {
			return inlineHeader, k
		}
		c.headers = append(c.headers, h)
		i = int32(len(c.headers) - 1)
		c.headerOf[k] = i
	}
	c.lastHeader, c.lastIndex = h, i // kept, so its address names no other map
	return i, ""
}

// same reports whether a and b are the same map (not merely equal ones).
func same(a, b http.Header) bool {
	return *(*unsafe.Pointer)(unsafe.Pointer(&a)) == *(*unsafe.Pointer)(unsafe.Pointer(&b))
}

// headerText is h as one string, equal for equal headers only: the names
// in order, each with its values, every name and value prefixed by its
// length, and the values by their count plus one (zero: a nil list).
func headerText(h http.Header) string {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	var b []byte
	for _, k := range names {
		vs := h[k]
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		if vs == nil {
			b = append(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(vs))+1)
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return string(b)
}

// parseHeader reads a header written by headerText. Its strings are copies:
// the map may outlive the chunk's other records, and must not keep it.
func parseHeader(b []byte) http.Header {
	h := make(http.Header)
	next := func() int {
		v, n := binary.Uvarint(b)
		b = b[n:]
		return int(v)
	}
	for len(b) > 0 {
		n := next()
		k := string(b[:n])
		b = b[n:]
		count := next()
		if count == 0 {
			h[k] = nil
			continue
		}
		vs := make([]string, count-1)
		for j := range vs {
			n := next()
			vs[j] = string(b[:n])
			b = b[n:]
		}
		h[k] = vs
	}
	return h
}
