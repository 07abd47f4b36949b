package record

import (
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Header keys the relay sets on every record. The producers only read
// them, so one copy serves every event.
var (
	hdrEventID       = []byte(outboxschema.HeaderEventID)
	hdrEventType     = []byte(outboxschema.HeaderEventType)
	hdrAggregateType = []byte(outboxschema.HeaderAggregateType)
	hdrAggregateID   = []byte(outboxschema.HeaderAggregateID)
	hdrLSN           = []byte(outboxschema.HeaderLSN)
	hdrOutboxID      = []byte(outboxschema.HeaderOutboxID)
	hdrReplayedFrom  = []byte(outboxschema.HeaderReplayedFrom)
	hdrReplay        = []byte(outboxschema.HeaderReplay)
	valDLQ           = []byte(ReplayedFromDLQ)
)

// ReplayedFromDLQ is the outbox_replayed_from header of a dlq replay copy.
const ReplayedFromDLQ = "dlq"

// LSNText is l.String() ("%X/%X" of its halves) without fmt: the pipeline
// renders a transaction's commit LSN once for its records' pg_lsn headers,
// which in a drain of one-row transactions is once per event. Any
// goroutine; it does not block.
func LSNText(l pglogrepl.LSN) string {
	var b [17]byte
	out := strconv.AppendUint(b[:0], uint64(l>>32), 16)
	out = append(out, '/')
	out = strconv.AppendUint(out, uint64(uint32(l)), 16)
	for i, c := range out {
		if c >= 'a' && c <= 'f' {
			out[i] = c - 'a' + 'A'
		}
	}
	return string(out)
}

// ownHeaders is how many headers the relay sets on every record before
// the row's own (outboxschema.RelayHeaders); maxOwnHeaders with the marks
// some records carry (outboxschema.MarkHeaders).
const (
	ownHeaders    = 5
	maxOwnHeaders = ownHeaders + 3
)

// hasOutboxID: ev's record carries outbox_id, the row's integer id.
func hasOutboxID(ev *decoder.Event) bool { return ev.Source == decoder.SourceRow && ev.IDText == "" }

// ownCount is how many headers the relay sets on ev's record; mark is the
// replay's outbox_replay value ("" for none).
func ownCount(ev *decoder.Event, mark string) int {
	n := ownHeaders
	if hasOutboxID(ev) {
		n++
	}
	if ev.ReplayOf != 0 {
		n++
	}
	if mark != "" {
		n++
	}
	return n
}

// headerBytes is how many bytes headers needs for ev's keys and values.
func headerBytes(ev *decoder.Event, commitLSN, mark string) int {
	n := len(ev.MessageID) + len(ev.IDText) + len(ev.EventID) + len(ev.EventType) + len(ev.AggregateType) + len(ev.AggregateID) + len(commitLSN) + len(mark)
	if k := ev.Identity(); k == decoder.IdentityID || k == decoder.IdentityReplayOf {
		n += 20 // the identity in decimal
	}
	if hasOutboxID(ev) {
		n += 20 // outbox_id
	}
	for _, x := range ev.Headers {
		n += len(x.Key)
	}
	return n
}

// Slab holds the headers and header bytes of a transaction's records, so
// that the records of a transaction take two allocations, not two per
// event. Each record's slices are capped at its own end: an append to one
// never writes into the next record's. A Slab is used by one goroutine at
// a time (the pipeline's, building a transaction's records with To).
type Slab struct {
	hs  []sink.Header
	buf []byte
}

// NewSlab is a Slab over hs and buf, sized by SlabSize; the caller keeps
// them (the relay pools them per transaction) and must not reuse them while
// a record built from the Slab is in use.
func NewSlab(hs []sink.Header, buf []byte) Slab { return Slab{hs: hs, buf: buf} }

// SlabSize is how many headers and header bytes the records of evs need.
func SlabSize(evs []decoder.Event, commitLSN string) (nh, nb int) {
	for i := range evs {
		nh += ownCount(&evs[i], "") + len(evs[i].Headers)
		nb += headerBytes(&evs[i], commitLSN, "")
	}
	return nh, nb
}

// take returns n headers (length own) and nb bytes (length 0) from s, or
// new ones when s is nil or too small.
func (s *Slab) take(own, n, nb int) ([]sink.Header, []byte) {
	if s == nil || len(s.hs) < n || len(s.buf) < nb {
		return make([]sink.Header, own, n), make([]byte, 0, nb)
	}
	h, b := s.hs[:own:n], s.buf[:0:nb]
	s.hs, s.buf = s.hs[n:], s.buf[nb:]
	return h, b
}

// headers builds the Kafka headers of one event: the relay's own
// (RelayHeaders, then those of MarkHeaders that apply), then each
// top-level key of the row's headers column (the decoder refuses a row
// whose keys include one of the relay's, outboxschema.ReservedHeader). The
// values of all of them share one allocation, from s (nil: allocated); the
// key of the record is the aggregate_id header's value. commitLSN is the
// transaction's commit LSN, rendered once; mark is the outbox_replay
// header's value, "" for none.
func headers(s *Slab, ev *decoder.Event, commitLSN, mark string) (h []sink.Header, key []byte) {
	own := ownCount(ev, mark)
	h, buf := s.take(own, own+len(ev.Headers), headerBytes(ev, commitLSN, mark))
	add := func(s string) []byte {
		start := len(buf)
		buf = append(buf, s...)
		return buf[start:len(buf):len(buf)]
	}
	num := func(v int64) []byte {
		start := len(buf)
		buf = strconv.AppendInt(buf, v, 10)
		return buf[start:len(buf):len(buf)]
	}
	start := len(buf)
	buf = ev.AppendIdentity(buf)
	id := buf[start:len(buf):len(buf)]
	key = add(ev.AggregateID)
	h[0] = sink.Header{Key: hdrEventID, Value: id}
	h[1] = sink.Header{Key: hdrEventType, Value: add(ev.EventType)}
	h[2] = sink.Header{Key: hdrAggregateType, Value: add(ev.AggregateType)}
	h[3] = sink.Header{Key: hdrAggregateID, Value: key}
	h[4] = sink.Header{Key: hdrLSN, Value: add(commitLSN)}
	i := ownHeaders
	if hasOutboxID(ev) {
		h[i] = sink.Header{Key: hdrOutboxID, Value: num(ev.ID)}
		i++
	}
	if ev.ReplayOf != 0 {
		h[i] = sink.Header{Key: hdrReplayedFrom, Value: valDLQ}
		i++
	}
	if mark != "" {
		h[i] = sink.Header{Key: hdrReplay, Value: add(mark)}
	}
	for _, x := range ev.Headers {
		h = append(h, sink.Header{Key: add(x.Key), Value: x.Value})
	}
	return h, key
}
