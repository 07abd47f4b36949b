package decoder

// The bytes and headers of the events of a transaction are carved out of
// shared blocks, so that a transaction of many rows takes a few
// allocations instead of two per event. A block is only ever appended to:
// the decoder never writes a byte it has handed out, so the part of a block
// given to earlier events (even of a transaction already handed out and
// being published on other goroutines) stays as it is while later events
// take the rest. Every piece is capped at its own end, so an append to one
// never writes into the next. A block outlives the Decoder's use of it for
// as long as any event carved from it is alive; with blocks of a few tens of
// KiB that holds back at most one block's worth beyond the events in
// flight.

const (
	// byteBlock is the size of a block of payload and header value bytes;
	// a piece larger than a quarter of it is allocated on its own, so that
	// a large payload wastes no block tail.
	byteBlock = 32 << 10
	// headerBlock is how many Headers a block holds; more than a quarter
	// of it for one event are allocated on their own.
	headerBlock = 256
)

// slabs holds the current blocks. The zero value is ready to use.
type slabs struct {
	bytes []byte   // the unused rest of the current byte block (length 0)
	hdrs  []Header // the unused rest of the current header block (length 0)
}

// take returns n bytes (length n, capped) that no one else refers to.
func (s *slabs) take(n int) []byte { return carve(&s.bytes, n, byteBlock) }

// headers returns n zeroed Headers (length n, capped) that no one else
// refers to.
func (s *slabs) headers(n int) []Header { return carve(&s.hdrs, n, headerBlock) }

// carve cuts n elements (length n, capped) off the front of *rest, the
// unused rest of a block of size block, starting a new block when they do
// not fit; a piece over a quarter of a block gets its own allocation.
func carve[T any](rest *[]T, n, block int) []T {
	if n > block/4 {
		return make([]T, n)
	}
	if cap(*rest) < n || *rest == nil { // never nil, even for n == 0
		*rest = make([]T, 0, block)
	}
	b := (*rest)[:n:n]
	*rest = (*rest)[n:n:cap(*rest)]
	return b
}
