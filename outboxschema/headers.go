package outboxschema

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Record header keys the relay sets on every event record, and the prefix
// of the keys it adds to a dead letter. A row's headers column may use none
// of them (ReservedHeader): a consumer reading the last header of a name, or
// mapping headers to a map, would otherwise take the row's forged value for
// the relay's.
const (
	HeaderEventID       = "event_id"       // the dedup key: outbox.event_id (a UUID), else outbox.id
	HeaderEventType     = "event_type"     // outbox.event_type
	HeaderAggregateType = "aggregate_type" // outbox.aggregate_type
	HeaderAggregateID   = "aggregate_id"   // outbox.aggregate_id, also the record key
	HeaderLSN           = "pg_lsn"         // the transaction's commit LSN
	// HeaderOutboxID is the row's integer id on every record of a row
	// whose id is an integer: where the row is, not what the event is
	// (a new history or dlq replay's copy has another).
	HeaderOutboxID = "outbox_id"
	// HeaderReplayedFrom marks a record republished from elsewhere than the
	// WAL stream of its first insert: "dlq" on the copy `outbox-relay dlq
	// replay` inserted (its event_id is the dead-lettered row's).
	HeaderReplayedFrom = "outbox_replayed_from"
	// HeaderReplay marks every record `outbox-relay replay` publishes: the
	// replay's start time, RFC 3339 UTC, the same for the whole run.
	HeaderReplay = "outbox_replay"
	// DeadLetterPrefix starts every header key the relay adds to a dead
	// letter (dlq.reason, dlq.error, ...).
	DeadLetterPrefix = "dlq."
)

// RelayHeaders are the keys the relay sets on every record, in the order it
// sets them. Read only.
var RelayHeaders = []string{HeaderEventID, HeaderEventType, HeaderAggregateType, HeaderAggregateID, HeaderLSN}

// MarkHeaders are the keys the relay sets on some records only, after
// RelayHeaders and before the row's own, in this order. Read only.
var MarkHeaders = []string{HeaderOutboxID, HeaderReplayedFrom, HeaderReplay}

// ReservedHeader reports whether key may not be a top-level key of a row's
// headers column: one of RelayHeaders or MarkHeaders, or any key starting with
// DeadLetterPrefix. Keys are compared ignoring letter case (Unicode simple
// folding, as strings.EqualFold): Kafka header keys are case-sensitive, but
// consumers that map headers case-insensitively exist, and for them
// "Event_ID" would override event_id just the same. It is the reserved half
// of CheckHeaderName, the rule every writer and the relay apply. It does
// not allocate; any goroutine.
func ReservedHeader(key string) bool {
	return reservedAs(key, nil) != ""
}

// ReservedNames lists the reserved keys for messages: RelayHeaders and
// MarkHeaders, comma-separated. Any goroutine.
func ReservedNames() string {
	return strings.Join(RelayHeaders, ", ") + ", " + strings.Join(MarkHeaders, ", ")
}

// HeaderNameError says why a name may not be the key of a header an outbox
// row or message event writes (CheckHeaderName). Reserved is set when the
// name is one the relay sets itself (a dead letter's reason
// reserved_header); otherwise the name is bad (bad_row, or bad_message for
// a message event) and Problem says why.
type HeaderNameError struct {
	Name     string // the name as written
	Reserved string // the relay's name it stands for; "" for a bad name
	Problem  string // e.g. "ends with whitespace"; set for a bad name
	// Extra are the names reserved besides the relay's own that were
	// checked (compat: debezium's id), for the message.
	Extra []string
}

// Error is one phrase naming the header name, quoted (%q, cut to 64
// bytes: control characters show as escapes), and what is wrong, e.g.
//
//	header name "event_id " ends with whitespace (U+0020)
//	header name "Event_ID" is reserved: the relay sets event_id, ... and every dlq.* header itself (names compared ignoring case)
func (e *HeaderNameError) Error() string {
	if e.Reserved != "" {
		own := ReservedNames()
		if len(e.Extra) > 0 {
			own += ", " + strings.Join(e.Extra, ", ")
		}
		return "header name " + QuoteHeaderName(e.Name) + " is reserved: the relay sets " + own +
			" and every " + DeadLetterPrefix + "* header itself (names compared ignoring case)"
	}
	return "header name " + QuoteHeaderName(e.Name) + " " + e.Problem
}

// QuoteHeaderName quotes a header name for an error as %q does (control
// and invisible characters show as escapes), cut to 64 bytes: a writer's
// name can be as long as the column. Any goroutine.
func QuoteHeaderName(k string) string {
	if len(k) <= 64 {
		return strconv.Quote(k)
	}
	return strconv.Quote(strings.ToValidUTF8(k[:64], "")) + fmt.Sprintf("... (%d bytes)", len(k))
}

// CheckHeaderName is the one rule for the name of a header an outbox row
// (the top-level keys of its headers column) or a message event (its
// envelope's headers) writes. The relay's decoder, outbox.Write and
// outbox.WriteMessage, and outbox-relay check all judge names with it, so
// they agree on every name. The rule (docs/outbox-table.md#headers):
//
//   - The name is the JSON key after JSON unescaping ("\u0065vent_id" is
//     event_id), and from then on exact bytes: no Unicode normalisation,
//     no trimming, no case folding. A Kafka header name is bytes, and a
//     consumer compares it as bytes.
//   - A bad name: empty; not valid UTF-8; starting or ending with
//     whitespace (unicode.IsSpace: a whitespace-only name too); holding a
//     control or format character anywhere (Unicode categories Cc, Cf, Zl,
//     Zp: tabs, newlines, zero-width and bidirectional controls) or U+FFFD,
//     the replacement character that stands for bytes that were not UTF-8.
//     Spaces inside a name are allowed.
//   - A reserved name: one of RelayHeaders or MarkHeaders, or any name
//     starting with DeadLetterPrefix, or one of extra, compared with
//     Unicode simple case folding (strings.EqualFold): consumers that look
//     headers up ignoring case exist (Java's equalsIgnoreCase folds "ſ" to
//     "s" too), and for them "Event_ID" or "pg_lſn" would stand for the
//     relay's own.
//
// A bad name is judged before a reserved one ("event_id " is bad). It
// returns nil or a *HeaderNameError. It allocates only for a refused name;
// any goroutine.
func CheckHeaderName(name string, extra ...string) error {
	if p := headerNameProblem(name); p != "" {
		return &HeaderNameError{Name: name, Problem: p}
	}
	if r := reservedAs(name, extra); r != "" {
		return &HeaderNameError{Name: name, Reserved: r, Extra: append([]string(nil), extra...)} // a copy: extra does not escape
	}
	return nil
}

// headerNameProblem is why name is a bad header name, or "".
func headerNameProblem(name string) string {
	if name == "" {
		return "is empty"
	}
	// The common name: printable ASCII, no space at either end.
	plain := name[0] != ' ' && name[len(name)-1] != ' '
	for i := 0; plain && i < len(name); i++ {
		plain = name[i] >= 0x20 && name[i] < 0x7f
	}
	if plain {
		return ""
	}
	if !utf8.ValidString(name) {
		return "is not valid UTF-8"
	}
	for _, r := range name {
		switch {
		case r == utf8.RuneError:
			return "contains U+FFFD, the replacement character (bytes that were not UTF-8 on the way)"
		case unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp):
			return fmt.Sprintf("contains the control or invisible character %U", r)
		}
	}
	first, _ := utf8.DecodeRuneInString(name)
	last, _ := utf8.DecodeLastRuneInString(name)
	switch {
	case strings.TrimFunc(name, unicode.IsSpace) == "":
		return "is only whitespace"
	case unicode.IsSpace(first):
		return fmt.Sprintf("starts with whitespace (%U)", first)
	case unicode.IsSpace(last):
		return fmt.Sprintf("ends with whitespace (%U)", last)
	}
	return ""
}

// reservedAs is the reserved name key stands for (compared as
// ReservedHeader compares), or "".
func reservedAs(key string, extra []string) string {
	if len(key) >= len(DeadLetterPrefix) && strings.EqualFold(key[:len(DeadLetterPrefix)], DeadLetterPrefix) {
		return DeadLetterPrefix + "*"
	}
	for _, rs := range [...][]string{RelayHeaders, MarkHeaders, extra} {
		for _, r := range rs {
			if strings.EqualFold(key, r) {
				return r
			}
		}
	}
	return ""
}
