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
func (s *slabs) take(n int) []byte {
	if n > byteBlock/4 {
		return make([]byte, n)
	}
	if cap(s.bytes) < n || s.bytes == nil { // never nil, even for n == 0
		s.bytes = make([]byte, 0, byteBlock)
	}
	b := s.bytes[:n:n]
	s.bytes = s.bytes[n:n:cap(s.bytes)]
	return b
}

// headers returns n zeroed Headers (length n, capped) that no one else
// refers to.
func (s *slabs) headers(n int) []Header {
	if n > headerBlock/4 {
		return make([]Header, n)
	}
	if cap(s.hdrs) < n || s.hdrs == nil { // never nil, even for n == 0
		s.hdrs = make([]Header, 0, headerBlock)
	}
	h := s.hdrs[:n:n]
	s.hdrs = s.hdrs[n:n:cap(s.hdrs)]
	return h
}
