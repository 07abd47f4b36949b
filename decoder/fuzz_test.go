package decoder_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// frame joins messages into one fuzz input: each is a big-endian uint16
// length and the bytes.
func frame(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = be.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

// unframe splits a fuzz input back into messages; a length running past the
// end takes what is left.
func unframe(b []byte) [][]byte {
	var msgs [][]byte
	for len(b) >= 2 && len(msgs) < 64 {
		n := int(be.Uint16(b))
		b = b[2:]
		n = min(n, len(b))
		msgs = append(msgs, b[:n])
		b = b[n:]
	}
	return msgs
}

// outcome is what one Decode call returned.
type outcome struct {
	txn *decoder.Txn
	err string
}

func FuzzDecode(f *testing.F) {
	f.Add(frame(validStream()...))
	f.Add(frame(
		message(false, 0x1000, "app", "x"),
		begin(0x2000, 1),
		origin(0x1F00, "node_a"),
		typ(17000, "public", "mood"),
		outboxRelation(),
		update(outboxID, row("5", "order", "o-1", "E", `{}`, null)...),
		del(outboxID, text("5")),
		truncate(outboxID),
		insert(outboxID, row("6", "order", "o-1", "E", `{"a": "b"}`, text(`{"k": ["v", 1.0]}`))...),
		commit(0x2000, 0x2030),
		begin(0x3000, 2),
		relation(outboxID, "public", "outbox", "headers", "payload", "event_type", "aggregate_id", "aggregate_type", "id", "x"),
		insert(outboxID, text(`{"q": "\"\u00e9"}`), text(`1`), text("E"), text("o-2"), text("order"), text("7"), toast),
		commit(0x3000, 0x3030),
		begin(0x4000, 3),
		insert(outboxID, row("8", "order", "o-3", "E", `{}`, text(`{"Event_Id": "1", "dlq.reason": "x", "trace": "t"}`))...),
		insert(outboxID, row("9", "order", "o-3", "E", `{}`, text(`{"dlq": "x", "pg\u005flsn": "0/0"}`))...),
		commit(0x4000, 0x4030),
	))
	for _, m := range validStream() {
		f.Add(frame(begin(0x2000, 1), outboxRelation(), m))
	}
	// Message events: valid, hostile, non-transactional, in a streamed transaction.
	f.Add(frame(
		begin(0x2000, 4), outboxRelation(),
		message(true, 0x2008, "ev", `{"id": "m", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "E", "payload": {"a": [1]}, "headers": {"k": "v"}}`),
		insert(outboxID, row("6", "order", "o-1", "E", `{}`, null)...),
		message(true, 0x2010, "ev", `{"id": 1, "aggregate_id": ""}`),
		message(true, 0x2018, "ev", `{"id": "m", "aggregate_type": "o", "aggregate_id": "o", "event_type": "E", "headers": {"EVENT_ID": "1"}}`),
		commit(0x2000, 0x2030),
		message(false, 0x2040, "ev", `{"id": "m", "aggregate_type": "o", "aggregate_id": "o", "event_type": "E"}`),
		streamStart(300, true), streamed(300, message(true, 0x2050, "ev", `{"id": "s", "aggregate_type": "o", "aggregate_id": "o", "event_type": "E"}`)), streamStop(),
		streamCommit(300, 0x3000, 0x3030),
	))
	// Protocol 2 streaming: blocks, a subtransaction abort, commits.
	f.Add(frame(
		streamStart(100, true), streamed(100, outboxRelation()), ev(100, 1), ev(101, 2), streamStop(),
		begin(0x2000, 5), outboxRelation(), insert(outboxID, row("3", "order", "o-1", "E", `{}`, null)...), commit(0x2000, 0x2030),
		streamAbort(100, 101), streamStart(100, false), ev(100, 4), streamStop(),
		streamStart(200, true), ev(200, 5), streamStop(), streamAbort(200, 200),
		streamCommit(100, 0x3000, 0x3030),
	))

	f.Fuzz(func(t *testing.T, data []byte) {
		msgs := unframe(data)

		// First pass: through one reused, scribbled buffer, checking the
		// invariants after every call. Decoding goes on after errors, to
		// reach the states they leave behind.
		d, err := decoder.New("public.outbox")
		if err != nil {
			t.Fatal(err)
		}
		d.SetHeartbeatPrefix("app")    // the seeds' Messages: some are heartbeats
		d.SetMessagePrefix("ev", 4096) // and some message events
		d.SetSpill(t.TempDir(), 256)
		defer d.Close()
		streaming := false // once a stream began, only the generic checks apply
		var (
			got     []outcome
			pending []pglogrepl.LSN // LSNs of the outbox Inserts since Begin
			buf     = make([]byte, 0, 512)
		)
		for i, m := range msgs {
			buf = append(buf[:0], m...)
			wasIn, before := d.InTxn(), d.Counts()
			txn, err := d.Decode(lsnAt(i), buf)
			if txn != nil && txn.Partial {
				t.Fatalf("message %d: a chunk without SetChunk", i)
			}
			if next, nerr := d.Next(); next != nil || nerr != nil {
				t.Fatalf("message %d: Next = %v, %v without SetChunk", i, next, nerr)
			}
			full := buf[:cap(buf)]
			for j := range full {
				full[j] = 0xA5
			}
			after := d.Counts()
			hb, beat := d.Heartbeat()
			got = append(got, outcome{txn, errString(err)})
			if beat && (len(m) == 0 || m[0] != 'M' || err != nil || txn != nil || wasIn || d.InTxn() || after.Heartbeats != before.Heartbeats+1) {
				t.Fatalf("message %d (%q): heartbeat %+v: only a Message between transactions is one (counts %+v -> %+v)", i, m, hb, before, after)
			}

			if err != nil {
				if !errors.Is(err, decoder.ErrProtocol) && !errors.Is(err, decoder.ErrSpill) {
					t.Fatalf("message %d: error %v does not wrap ErrProtocol", i, err)
				}
				if txn != nil || after != before || d.InTxn() != wasIn {
					t.Fatalf("message %d: failed Decode changed state (txn %v, counts %+v -> %+v)", i, txn != nil, before, after)
				}
				continue
			}
			if strings.IndexByte("SEcA", m[0]) >= 0 {
				streaming = true
			}
			if streaming {
				continue
			}
			if m[0] == 'M' && after.MessageEvents != before.MessageEvents {
				if after.MessageEvents != before.MessageEvents+1 || beat {
					t.Fatalf("message %d: MessageEvents %d -> %d (heartbeat %v)", i, before.MessageEvents, after.MessageEvents, beat)
				}
				if txn == nil { // transactional: an event of the open transaction
					if !wasIn || !d.InTxn() {
						t.Fatalf("message %d: a message event outside a transaction", i)
					}
					pending = append(pending, lsnAt(i))
					continue
				}
				// Non-transactional: refused, alone.
				if wasIn || d.InTxn() || len(txn.Events) != 1 || txn.Events[0].Err == nil || txn.Events[0].Err.Column != "transactional" ||
					txn.EndLSN != txn.CommitLSN || txn.Events[0].Source != decoder.SourceMessage {
					t.Fatalf("message %d: a non-transactional message event: %+v", i, txn)
				}
				continue
			}
			switch m[0] {
			case 'B':
				if wasIn || !d.InTxn() || txn != nil || after != before {
					t.Fatalf("message %d: Begin: wasIn=%v InTxn=%v txn=%v", i, wasIn, d.InTxn(), txn != nil)
				}
				pending = pending[:0]
			case 'C':
				if !wasIn || d.InTxn() || txn == nil {
					t.Fatalf("message %d: Commit: wasIn=%v InTxn=%v txn=%v", i, wasIn, d.InTxn(), txn != nil)
				}
				if after.Txns != before.Txns+1 || after.Events != before.Events+uint64(len(txn.Events)) {
					t.Fatalf("message %d: Commit counts %+v -> %+v for %d events", i, before, after, len(txn.Events))
				}
				if len(txn.Events) != len(pending) {
					t.Fatalf("message %d: %d events, want %d", i, len(txn.Events), len(pending))
				}
				for j, ev := range txn.Events {
					if ev.LSN != pending[j] {
						t.Fatalf("message %d: event %d = %+v, want LSN %s", i, j, ev, pending[j])
					}
					if ev.Err == nil && (ev.AggregateID == "" || ev.Payload == nil) {
						t.Fatalf("message %d: event %d = %+v, want a non-empty AggregateID and Payload or Err", i, j, ev)
					}
					if ev.Err != nil && (ev.Err.LSN != ev.LSN || ev.Err.ID != ev.ID || ev.Headers != nil) {
						t.Fatalf("message %d: poison event %d = %+v: Err must match its LSN and ID, no headers", i, j, ev)
					}
					for _, h := range ev.Headers {
						if outboxschema.ReservedHeader(h.Key) {
							t.Fatalf("message %d: event %d = %+v carries the reserved header %q", i, j, ev, h.Key)
						}
					}
				}
			case 'I':
				if !wasIn || !d.InTxn() || txn != nil || after.Txns != before.Txns || after.Events != before.Events {
					t.Fatalf("message %d: Insert changed transaction state", i)
				}
				if after.OtherTableRows == before.OtherTableRows {
					pending = append(pending, lsnAt(i))
				} else if after.OtherTableRows != before.OtherTableRows+1 {
					t.Fatalf("message %d: OtherTableRows %d -> %d", i, before.OtherTableRows, after.OtherTableRows)
				}
			case 'R':
				if txn != nil || after != before || d.InTxn() != wasIn {
					t.Fatalf("message %d: Relation changed state", i)
				}
			default:
				want := before
				if beat {
					want.Heartbeats++
				} else {
					want.OtherMessages++
				}
				if txn != nil || after != want || d.InTxn() != wasIn {
					t.Fatalf("message %d: ignored message %q: counts %+v -> %+v", i, m[0], before, after)
				}
			}
		}

		// Second pass: the same messages as fresh copies. Any difference
		// means the first pass kept bytes of a buffer it did not own.
		d2, _ := decoder.New("public.outbox")
		d2.SetHeartbeatPrefix("app")
		d2.SetMessagePrefix("ev", 4096)
		d2.SetSpill(t.TempDir(), 256)
		defer d2.Close()
		for i, m := range msgs {
			txn, err := d2.Decode(lsnAt(i), append([]byte(nil), m...))
			if want := (outcome{txn, errString(err)}); !reflect.DeepEqual(got[i], want) {
				t.Fatalf("message %d: decoding through a reused buffer gave %+v, fresh copies %+v", i, got[i], want)
			}
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
