package relay

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// maxBeats bounds the heartbeats a term remembers: over an hour at the
// default heartbeat.interval of 1s before entries start to merge.
const maxBeats = 4096

// beats is the lag clock: the heartbeats this leadership term emitted
// through the slot (replication.Heartbeater) that the ack watermark has not
// passed yet, oldest first. A heartbeat is passed once every event before
// its WAL record is acked or dead-lettered: the watermark reached the
// record's start (known once decoded) or its end (the emitter's LSN). The
// lag is then the age of the oldest heartbeat not passed: an event
// committed before a heartbeat was emitted and not yet acked keeps it
// unpassed, read or not. All methods are safe for concurrent use.
type beats struct {
	mu   sync.Mutex
	now  func() time.Time
	max  int
	list []beat
}

// beat is one emitted heartbeat, or several merged when the list was full:
// sent is the oldest one's emission time, last and pos the newest one's
// content and position, so a merged beat passes late, never early.
type beat struct {
	sent time.Time
	last int64         // content of the newest heartbeat merged in: its local Unix nanos
	pos  pglogrepl.LSN // passed once the watermark reaches this
}

// newBeats returns an empty lag clock keeping at most max entries (0:
// maxBeats), reading time from now.
func newBeats(max int, now func() time.Time) *beats {
	if max < 2 {
		max = maxBeats
	}
	return &beats{now: now, max: max}
}

// emitted records a heartbeat written at local time sent whose WAL record
// ends at end (pg_logical_emit_message's result), after forgetting those
// watermark passed. Called from the emitter's goroutine, in emission order.
func (b *beats) emitted(end pglogrepl.LSN, sent time.Time, watermark pglogrepl.LSN) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(watermark)
	if len(b.list) >= b.max {
		// Full (a long stall): halve the resolution rather than forget the
		// oldest heartbeat or the newest, pairing neighbours. The lag may
		// then be over, never under, by the span of a pair.
		n := 0
		for i := 0; i < len(b.list); i += 2 {
			m := b.list[i]
			if i+1 < len(b.list) {
				m.last, m.pos = b.list[i+1].last, b.list[i+1].pos
			}
			b.list[n] = m
			n++
		}
		clear(b.list[n:])
		b.list = b.list[:n]
	}
	b.list = append(b.list, beat{sent: sent, last: sent.UnixNano(), pos: end})
}

// decoded records that the stream delivered the heartbeat hb: it is passed
// once the watermark reaches its record's start. A heartbeat this term did
// not emit (an earlier term's, another process's) is ignored. Called from
// the replication loop's goroutine.
func (b *beats) decoded(hb decoder.Heartbeat) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.list {
		if e := &b.list[i]; e.last == hb.Sent && hb.Sent != 0 {
			e.pos = min(e.pos, hb.LSN)
			return
		}
	}
}

// lag forgets the heartbeats watermark passed and returns the age of the
// oldest one left, or of the oldest unacked event in memory (added at
// oldest, when unacked) if that is older; 0 when there is neither. Any
// goroutine.
func (b *beats) lag(watermark pglogrepl.LSN, oldest time.Time, unacked bool) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(watermark)
	now := b.now()
	var lag time.Duration
	if len(b.list) > 0 {
		lag = now.Sub(b.list[0].sent)
	}
	if unacked {
		lag = max(lag, now.Sub(oldest))
	}
	return max(lag, 0)
}

// prune forgets the heartbeats watermark passed. Caller holds b.mu.
func (b *beats) prune(watermark pglogrepl.LSN) {
	n := 0
	for n < len(b.list) && b.list[n].pos <= watermark {
		n++
	}
	if n > 0 {
		k := copy(b.list, b.list[n:])
		clear(b.list[k:])
		b.list = b.list[:k]
	}
}

// len returns how many entries are kept (tests).
func (b *beats) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.list)
}
