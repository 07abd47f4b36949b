package decoder

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// ErrProtocol is wrapped by every Decode error about the byte stream itself:
// a truncated or malformed message, a message out of transaction order, or an
// Insert for a relation id never announced. The stream cannot continue. The
// replication loop matches it with errors.Is to classify the error as fatal.
var ErrProtocol = errors.New("malformed pgoutput stream")

func protocolError(lsn pglogrepl.LSN, msg, format string, args ...any) error {
	return fmt.Errorf("decode %s at LSN %s: %w: %s", msg, lsn, ErrProtocol, fmt.Sprintf(format, args...))
}

// RowError is returned by Decode for an outbox row that cannot become an
// event: a required column that is NULL, missing or not text, an empty
// aggregate_id, an id that is not an integer, or headers that are not a JSON
// object. The row is in the WAL and the slot resumes before it, so the relay
// stops on it again at every restart until someone acts. The error text says
// what to do. The replication loop matches it with errors.As.
type RowError struct {
	Table  string        // schema.name
	ID     int64         // outbox.id; 0 if unknown
	LSN    pglogrepl.LSN // of the Insert
	Column string
	Reason string // what is wrong with the column, e.g. "is NULL"
	hint   string // what to do about it
}

// Hints that end a RowError's text.
const (
	hintProducer = "fix the producer that wrote it; the relay stops at this row on every restart " +
		"until the slot is advanced past its transaction (pg_replication_slot_advance)"
	hintMissing = "restore the column (ALTER TABLE ... ADD COLUMN) and restart the relay, which resumes " +
		"from the slot; rows inserted while the column was missing still fail and must be skipped by " +
		"advancing the slot past them (pg_replication_slot_advance)"
	hintToast  = "check that the slot uses the pgoutput plugin"
	hintBinary = "start replication without the binary option"
)

// Error describes the row, the column and the fix, for example:
//
//	outbox row public.outbox id=42 at LSN 0/16B3F28: column "aggregate_id": is NULL; fix the producer ...
func (e *RowError) Error() string {
	id := "?"
	if e.ID != 0 {
		id = strconv.FormatInt(e.ID, 10)
	}
	s := fmt.Sprintf("outbox row %s id=%s at LSN %s: column %q: %s", e.Table, id, e.LSN, e.Column, e.Reason)
	if e.hint != "" {
		s += "; " + e.hint
	}
	return s
}
