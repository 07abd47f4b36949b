// Package headernametest holds the cases of the header-name rule
// (outboxschema.CheckHeaderName) that every side applying it is tested on:
// the relay's decoder (rows and message events), outbox.Write and
// outbox.WriteMessage, and outbox-relay check. One table, so that the sides
// are proven to give the same verdict on the same names. For tests only.
package headernametest

import "unicode/utf8"

// Verdict is what a side does with a header name.
type Verdict string

const (
	OK       Verdict = "ok"       // published as written
	Bad      Verdict = "bad"      // a bad name: bad_row / bad_message, refused by outbox.Write
	Reserved Verdict = "reserved" // one of the relay's own: reserved_header, refused by outbox.Write
)

// Case is one header name and its verdict.
type Case struct {
	Name    string
	Verdict Verdict
}

// Cases are the names every side is tested on.
var Cases = []Case{
	{"tenant_id", OK},
	{"x-event_id", OK},
	{"event_ids", OK},
	{"traceparent", OK},
	{"tenant id", OK}, // a space inside is allowed
	{"a\u00a0b", OK},  // so is a no-break space inside
	{"événement", OK}, // any printable Unicode
	{"ａｂｃ", OK},       // fullwidth letters: no NFKC, a distinct name
	{"evеnt_id", OK},  // a Cyrillic е: exact bytes, not event_id to a consumer comparing names
	{"dlq", OK},       // only the prefix "dlq." is reserved
	{"dlqx.reason", OK},
	{"event_id", Reserved},
	{"EVENT_ID", Reserved},
	{"Aggregate_Id", Reserved},
	{"pg_lsn", Reserved},
	{"pg_lſn", Reserved}, // long s: Unicode simple folding makes it s
	{"outbox_id", Reserved},
	{"outbox_replayed_from", Reserved},
	{"OUTBOX_REPLAY", Reserved},
	{"dlq.reason", Reserved},
	{"DLQ.anything", Reserved},
	{"dlq.", Reserved},
	{"", Bad},
	{" ", Bad},
	{"   ", Bad},
	{"event_id ", Bad}, // whitespace at an end is judged before the reserved name
	{" event_id", Bad},
	{"event_id\t", Bad},
	{"\tx", Bad},
	{"a\nb", Bad},
	{"a\rb", Bad},
	{"a\x00b", Bad},
	{"a\x1fb", Bad},
	{"a\x7fb", Bad},
	{"a\u0085b", Bad},      // NEL, a C1 control
	{"event\u200bid", Bad}, // zero-width space
	{"x\u200d", Bad},       // zero-width joiner
	{"x\u202e", Bad},       // right-to-left override
	{"\u2066x\u2069", Bad}, // bidi isolates
	{"\ufeffx", Bad},       // BOM
	{"\u00adx", Bad},       // soft hyphen
	{"a\u2028b", Bad},      // line separator
	{"a\u2029b", Bad},      // paragraph separator
	{"x\u00a0", Bad},       // no-break space at the end
	{"\u3000x", Bad},       // ideographic space at the start
	{"x\u2003", Bad},       // em space at the end
	{"a\ufffdb", Bad},      // the replacement character
	{"a\xffb", Bad},        // not UTF-8
	{"\xc3", Bad},          // a cut UTF-8 sequence
}

// Headers is the headers document {name: value} as PostgreSQL's jsonb
// output renders it, which is what the relay reads from the WAL: '"', '\'
// and the control characters below U+0020 escaped (\b \f \n \r \t, else
// \u00XX), everything else as is. Bytes that are not UTF-8, which
// PostgreSQL cannot store, are each U+FFFD, as encoding/json writes them.
func Headers(name, value string) string {
	return "{" + jsonString(name) + ": " + jsonString(value) + "}"
}

func jsonString(s string) string {
	const hex = "0123456789abcdef"
	b := []byte{'"'}
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x80 {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, "\uFFFD"...)
			} else {
				b = append(b, s[i:i+n]...)
			}
			i += n
			continue
		}
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, `\b`...)
		case '\f':
			b = append(b, `\f`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			} else {
				b = append(b, c)
			}
		}
		i++
	}
	return string(append(b, '"'))
}
