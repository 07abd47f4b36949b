package decoder

import "github.com/jackc/pglogrepl"

// RowText is one outbox row read with SQL instead of from pgoutput: each
// column in PostgreSQL's text output (what pgoutput sends for it, e.g.
// SELECT payload::text), nil for SQL NULL. Headers, EventID and ReplayOf
// are nil too when the table has no such column (EventID must be read
// only from a uuid column, ReplayOf from a bigint one, as Decode does).
type RowText struct {
	ID, AggregateType, AggregateID, EventType, Payload, Headers []byte
	EventID, ReplayOf                                           []byte
}

// Row builds the Event of r with exactly the checks and the bytes Decode
// gives an Insert of the same row (a bad row comes back with Err set, like
// Decode's); lsn becomes Event.LSN and appears in errors (0 when unknown).
// Used by outbox-relay replay, so a row republished from the table is the
// same event the relay streamed. Same goroutine rules as Decode: not
// concurrently with it; it does not block.
func (d *Decoder) Row(r RowText, lsn pglogrepl.LSN) Event {
	col := func(b []byte) field {
		if b == nil {
			return field{kind: 'n'}
		}
		return field{kind: 't', data: b}
	}
	d.fields = [numRoles]field{
		roleID:            col(r.ID),
		roleAggregateType: col(r.AggregateType),
		roleAggregateID:   col(r.AggregateID),
		roleEventType:     col(r.EventType),
		rolePayload:       col(r.Payload),
		roleHeaders:       col(r.Headers),
		roleEventID:       col(r.EventID),
		roleReplayOf:      col(r.ReplayOf),
	}
	d.extras = d.extras[:0]
	ev, rowErr := d.event(&relation{table: d.maps[0].full, idInt: true}, lsn)
	if rowErr != nil {
		ev = d.poison(ev, rowErr)
	}
	return ev
}
