package decoder

import (
	"bytes"
	"encoding/binary"
	"math/bits"

	"github.com/jackc/pglogrepl"
)

// maxScanKeys and maxScanDepth bound what scanEnvelope takes: an envelope
// with more top-level keys, or a value nested deeper, goes to envelopeJSON.
const (
	maxScanKeys  = 16
	maxScanDepth = 64
)

// scanEnvelope builds the Event of an envelope in one pass over content,
// which is valid UTF-8 and within the size limit: the payload is passed
// through as the bytes it is (validated, never unmarshalled), the headers
// are read by parseHeaders. It answers only for an envelope that is
// accepted and whose keys and four required strings have no escapes;
// for anything else (a refusal, an escape, a deep value) it reports false
// and envelopeJSON decides, so the refusals and their words are
// envelopeJSON's. A fuzz test holds the two equal wherever it answers.
//
// With d.toTxn the event's bytes come from the slabs and its ids are left
// to handout (d.idSpan), as for a row.
func (d *Decoder) scanEnvelope(lsn pglogrepl.LSN, content []byte) (Event, bool) {
	var (
		req           [4][]byte // id, aggregate_type, aggregate_id, event_type
		got           [4]bool
		payload, hdrs []byte
		keys          [maxScanKeys][]byte
		nkeys         int
	)
	i := skipSpace(content, 0)
	if i >= len(content) || content[i] != '{' {
		return Event{}, false
	}
	i = skipSpace(content, i+1)
	for {
		key, next, ok := validString(content, i)
		if !ok || nkeys == maxScanKeys {
			return Event{}, false // also {}: fields are missing
		}
		for _, k := range keys[:nkeys] {
			if bytes.Equal(k, key) {
				return Event{}, false
			}
		}
		keys[nkeys] = key
		nkeys++
		i = skipSpace(content, next)
		if i >= len(content) || content[i] != ':' {
			return Event{}, false
		}
		i = skipSpace(content, i+1)
		if r := requiredField(key); r >= 0 {
			s, next, ok := validString(content, i)
			if !ok {
				return Event{}, false
			}
			req[r], got[r], i = s, true, next
		} else {
			end := valueEnd(content, i, 0)
			if end < 0 {
				return Event{}, false
			}
			switch string(key) {
			case EnvelopePayload:
				payload = content[i:end]
			case EnvelopeHeaders:
				hdrs = content[i:end]
			}
			i = end
		}
		i = skipSpace(content, i)
		if i >= len(content) {
			return Event{}, false
		}
		if content[i] == '}' {
			if skipSpace(content, i+1) != len(content) {
				return Event{}, false
			}
			break
		}
		if content[i] != ',' {
			return Event{}, false
		}
		i = skipSpace(content, i+1)
	}
	if got != [4]bool{true, true, true, true} || len(req[0]) == 0 || len(req[2]) == 0 {
		return Event{}, false
	}
	hasHeaders := hdrs != nil && string(hdrs) != "null"
	if hasHeaders {
		if d.parseHeaders(hdrs) != nil {
			return Event{}, false
		}
		for _, h := range d.hdrs {
			if h.refused {
				return Event{}, false
			}
		}
	}
	if payload == nil {
		payload = []byte("null")
	}

	ev := Event{LSN: lsn, Source: SourceMessage}
	ev.AggregateType = d.strLast(req[1], &d.last.aggType)
	ev.EventType = d.strLast(req[3], &d.last.eventType)
	// One piece for the payload and all header values, as for a row.
	var vals []byte
	if hasHeaders {
		vals = d.vals.Bytes()
	}
	var buf []byte
	if d.toTxn {
		start := len(d.ids)
		d.ids = append(d.ids, req[2]...)
		end := len(d.ids)
		d.ids = append(d.ids, req[0]...)
		d.idSpan = idSpan{start: start, end: end, evEnd: end, msgEnd: len(d.ids)}
		buf = d.slabs.take(len(payload) + len(vals))
	} else {
		ev.MessageID, ev.AggregateID = string(req[0]), string(req[2])
		buf = make([]byte, len(payload)+len(vals))
	}
	p := copy(buf, payload)
	copy(buf[p:], vals)
	ev.Payload = buf[:p:p]
	if hasHeaders {
		if d.toTxn {
			ev.Headers = d.slabs.headers(len(d.hdrs))
		} else {
			ev.Headers = make([]Header, len(d.hdrs))
		}
		for i, h := range d.hdrs {
			ev.Headers[i] = Header{Key: h.key, Value: buf[p+h.start : p+h.end : p+h.end]}
		}
	}
	return ev, true
}

// requiredField returns the index of key among id, aggregate_type,
// aggregate_id and event_type, or -1.
func requiredField(key []byte) int {
	switch string(key) {
	case EnvelopeID:
		return 0
	case EnvelopeAggregateType:
		return 1
	case EnvelopeAggregateID:
		return 2
	case EnvelopeEventType:
		return 3
	}
	return -1
}

// valueEnd returns the index after the JSON value starting at b[i], or -1
// when there is none or it nests deeper than maxScanDepth. b is valid
// UTF-8 (the string check relies on it).
func valueEnd(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '"':
		return stringEnd(b, i)
	case c == '-' || c >= '0' && c <= '9':
		return numberEnd(b, i)
	case c == 't':
		return literalEnd(b, i, "true")
	case c == 'f':
		return literalEnd(b, i, "false")
	case c == 'n':
		return literalEnd(b, i, "null")
	case c == '{' || c == '[':
		if depth == maxScanDepth {
			return -1
		}
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == closing {
			return i + 1
		}
		for {
			if c == '{' {
				if i = stringEnd(b, i); i < 0 {
					return -1
				}
				if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
					return -1
				}
				i = skipSpace(b, i+1)
			}
			if i = valueEnd(b, i, depth+1); i < 0 {
				return -1
			}
			if i = skipSpace(b, i); i >= len(b) {
				return -1
			}
			switch b[i] {
			case ',':
				i = skipSpace(b, i+1)
			case closing:
				return i + 1
			default:
				return -1
			}
		}
	}
	return -1
}

// stringEnd returns the index after the JSON string starting at b[i], or
// -1 if it is not one. b is valid UTF-8.
func stringEnd(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for j := i + 1; j < len(b); j++ {
		j = plainEnd(b, j)
		if j >= len(b) {
			return -1
		}
		switch c := b[j]; {
		case c == '"':
			return j + 1
		case c < 0x20:
			return -1
		case c == '\\':
			j++
			if j >= len(b) {
				return -1
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) {
					return -1
				}
				for _, h := range b[j+1 : j+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1
					}
				}
				j += 4
			default:
				return -1
			}
		}
	}
	return -1
}

// stringStop marks the bytes that end a run of a JSON string's plain
// characters: the quote, the backslash and the control characters.
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// plainEnd returns the index of the first byte from b[j] on that ends a
// run of plain string characters, or len(b).
func plainEnd(b []byte, j int) int {
	// Eight bytes at a time: v has a zero byte iff (v-lo)&^v&hi != 0, a
	// byte under 0x20 iff (v-0x20*lo)&^v&hi != 0. A borrow can only mark
	// bytes after a true match, so the lowest mark is the first stop.
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	for j+8 <= len(b) {
		v := binary.LittleEndian.Uint64(b[j:])
		q, bs := v^('"'*lo), v^('\\'*lo)
		if m := ((q-lo)&^q | (bs-lo)&^bs | (v-0x20*lo)&^v) & hi; m != 0 {
			return j + bits.TrailingZeros64(m)/8
		}
		j += 8
	}
	for j < len(b) && !stringStop[b[j]] {
		j++
	}
	return j
}

// validString returns the contents of the JSON string starting at b[i] and
// the index after its closing quote, if it has no escapes and no control
// characters: plainString for b known to be valid UTF-8.
func validString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	j := plainEnd(b, i+1)
	if j >= len(b) || b[j] != '"' {
		return nil, 0, false
	}
	return b[i+1 : j], j + 1, true
}

// literalEnd returns the index after lit at b[i], or -1.
func literalEnd(b []byte, i int, lit string) int {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return -1
	}
	return i + len(lit)
}
