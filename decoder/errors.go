package decoder

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// ErrProtocol is wrapped by every Decode error about the byte stream itself:
// a truncated or malformed message, a message out of transaction order, or an
// Insert for a relation id never announced. The stream cannot continue: the
// pipeline returns the error from its handler, and the replication stream
// stops the relay on every handler error but replication.ErrRestart, so
// nothing needs to match it. It
// tells a broken stream apart from a bad row (RowError, which is no error).
var ErrProtocol = errors.New("malformed pgoutput stream")

// ErrSpill is wrapped by errors reading or writing the temporary file of a
// streamed transaction (SetSpill): the stream cannot continue either.
var ErrSpill = errors.New("cannot spill a streamed transaction")

func (d *Decoder) spillError(lsn pglogrepl.LSN, msg string, xid uint32, err error) error {
	return fmt.Errorf("decode %s at LSN %s: %w %d in %s: %v; check the space and permissions there (TMPDIR)",
		msg, lsn, ErrSpill, xid, d.spillDirOrTemp(), err)
}

func protocolError(lsn pglogrepl.LSN, msg, format string, args ...any) error {
	return fmt.Errorf("decode %s at LSN %s: %w: %s", msg, lsn, ErrProtocol, fmt.Sprintf(format, args...))
}

// RowError says why an outbox row cannot become an event (Event.Err): a
// required column that is NULL, missing or not text, an empty key
// (aggregate_id) or text id, an integer id column whose text is not a
// 64-bit integer, a bytea payload that is not hex, headers that are not a
// JSON object or hold a bad header name, or headers with a key reserved for
// the relay (ReservedHeader is set; outboxschema.CheckHeaderName is the
// rule for both); or why a message event was refused (Prefix is
// set). The bytes in the WAL never change, so retrying cannot help: the
// relay dead-letters the row or halts publishing at it (on_poison). The
// text says what to do.
type RowError struct {
	Table  string        // schema.name
	ID     int64         // outbox.id; 0 if unknown or not an integer
	IDText string        // the id's text when the id column is not an integer (columns.id)
	LSN    pglogrepl.LSN // of the Insert
	Column string
	Reason string // what is wrong with the column, e.g. "is NULL"
	// ReservedHeader is the key of the headers column that is reserved for
	// the relay (outboxschema.ReservedHeader), as the row spelled it; ""
	// for every other bad row. The first such key in document order.
	ReservedHeader string
	// Prefix is set (the message-event prefix) when the event is a
	// message (Event.Source SourceMessage): Table and ID are then unset,
	// MessageID is the envelope's id if it could be read, and Column names
	// the envelope field ("content" for the message as a whole).
	Prefix    string
	MessageID string
	hint      string // what to do about it
}

// Hints that end a RowError's text.
const (
	hintProducer = "fix the producer that wrote it"
	hintMissing  = "restore the column (ALTER TABLE ... ADD COLUMN); rows inserted while it was missing " +
		"cannot be published as they are. If the table has the column, the publication's column list " +
		"leaves it out: publish the table whole (`outbox-relay check` prints the ALTER PUBLICATION), then " +
		"`outbox-relay dlq replay` the rows"
	hintToast    = "check that the slot uses the pgoutput plugin"
	hintBinary   = "start replication without the binary option"
	hintReserved = "rename the key in the producer that writes the outbox rows (e.g. x-event_id); the relay " +
		"sets these headers itself from the row's columns"
	hintBadName = "rename the key in the producer that writes the outbox rows: a header name is not empty, " +
		"has no whitespace at either end and no control or invisible character (docs/outbox-table.md#headers)"
)

// Error describes the row, the column and the fix, for example:
//
//	outbox row public.outbox id=42 at LSN 0/16B3F28: column "aggregate_id": is NULL; fix the producer ...
func (e *RowError) Error() string {
	if e.Prefix != "" {
		return e.messageError()
	}
	id := "?"
	if e.ID != 0 {
		id = strconv.FormatInt(e.ID, 10)
	} else if e.IDText != "" {
		id = quoteKey(e.IDText)
	}
	s := fmt.Sprintf("outbox row %s id=%s at LSN %s: column %q: %s", e.Table, id, e.LSN, e.Column, e.Reason)
	if e.hint != "" {
		s += "; " + e.hint
	}
	return s
}
