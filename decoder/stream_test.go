package decoder_test

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

var (
	streamStart  = pgoutputtest.StreamStart
	streamStop   = pgoutputtest.StreamStop
	streamCommit = pgoutputtest.StreamCommit
	streamAbort  = pgoutputtest.StreamAbort
	streamed     = pgoutputtest.Streamed
)

// ev is an outbox Insert of id, made by (sub)transaction xid inside a
// stream block.
func ev(xid uint32, id int) []byte {
	return streamed(xid, insert(outboxID, row(fmt.Sprint(id), "order", "o-1", "E", fmt.Sprintf(`{"n": %d}`, id), null)...))
}

// plain is an outbox Insert of id outside streaming.
func plain(id int) []byte {
	return insert(outboxID, row(fmt.Sprint(id), "order", "o-1", "E", fmt.Sprintf(`{"n": %d}`, id), null)...)
}

// got is one Txn as the tests compare it.
type got struct {
	Xid       uint32
	CommitLSN pglogrepl.LSN
	EndLSN    pglogrepl.LSN
	Partial   bool
	IDs       []int64
}

// decodeAll feeds msgs and collects every Txn, including the further
// chunks Next hands out after a Stream Commit.
func decodeAll(t *testing.T, d *decoder.Decoder, msgs [][]byte) ([]got, error) {
	t.Helper()
	var out []got
	add := func(txn *decoder.Txn) {
		g := got{Xid: txn.Xid, CommitLSN: txn.CommitLSN, EndLSN: txn.EndLSN, Partial: txn.Partial, IDs: []int64{}}
		for _, e := range txn.Events {
			g.IDs = append(g.IDs, e.ID)
		}
		out = append(out, g)
	}
	for i, m := range msgs {
		txn, err := d.Decode(pglogrepl.LSN(0x1000+i), m)
		if err != nil {
			return out, fmt.Errorf("message %d (%q): %w", i, m[0], err)
		}
		for txn != nil {
			add(txn)
			if txn, err = d.Next(); err != nil {
				return out, fmt.Errorf("message %d: Next: %w", i, err)
			}
		}
	}
	return out, nil
}

func TestStreamedTransactions(t *testing.T) {
	t.Parallel()
	rel := streamed(100, outboxRelation())
	tests := []struct {
		name string
		msgs [][]byte
		want []got
	}{
		{
			name: "interleaved xids, each published whole at its Stream Commit",
			msgs: [][]byte{
				streamStart(100, true), rel, ev(100, 1), ev(100, 2), streamStop(),
				streamStart(200, true), streamed(200, outboxRelation()), ev(200, 10), streamStop(),
				streamStart(100, false), ev(100, 3), streamStop(),
				streamCommit(200, 0x9000, 0x9030),
				streamStart(100, false), ev(100, 4), streamStop(),
				streamCommit(100, 0x9100, 0x9130),
			},
			want: []got{
				{Xid: 200, CommitLSN: 0x9000, EndLSN: 0x9030, IDs: []int64{10}},
				{Xid: 100, CommitLSN: 0x9100, EndLSN: 0x9130, IDs: []int64{1, 2, 3, 4}},
			},
		},
		{
			name: "a subtransaction's abort discards exactly its rows",
			msgs: [][]byte{
				streamStart(100, true), rel, ev(100, 1), ev(101, 2), ev(101, 3), streamStop(),
				streamAbort(100, 101),
				streamStart(100, false), ev(100, 4), ev(102, 5), streamStop(),
				streamCommit(100, 0x9100, 0x9130),
			},
			want: []got{{Xid: 100, CommitLSN: 0x9100, EndLSN: 0x9130, IDs: []int64{1, 4, 5}}},
		},
		{
			name: "an aborted subtransaction takes its nested ones with it",
			msgs: [][]byte{
				streamStart(100, true), rel, ev(100, 1), ev(101, 2), ev(102, 3), ev(101, 4), streamStop(),
				streamAbort(100, 102), streamAbort(100, 101),
				streamStart(100, false), ev(100, 5), streamStop(),
				streamCommit(100, 0x9100, 0x9130),
			},
			want: []got{{Xid: 100, CommitLSN: 0x9100, EndLSN: 0x9130, IDs: []int64{1, 5}}},
		},
		{
			name: "abort of a subtransaction never streamed changes nothing",
			msgs: [][]byte{
				streamStart(100, true), rel, ev(100, 1), streamStop(),
				streamAbort(100, 555),
				streamCommit(100, 0x9100, 0x9130),
			},
			want: []got{{Xid: 100, CommitLSN: 0x9100, EndLSN: 0x9130, IDs: []int64{1}}},
		},
		{
			name: "a whole streamed transaction aborted publishes nothing",
			msgs: [][]byte{
				streamStart(100, true), rel, ev(100, 1), ev(101, 2), streamStop(),
				streamAbort(100, 100),
				begin(0x9200, 300), plain(7), commit(0x9200, 0x9230),
			},
			want: []got{{Xid: 300, CommitLSN: 0x9200, EndLSN: 0x9230, IDs: []int64{7}}},
		},
		{
			name: "a stream, then a transaction sent at its commit, then the stream's commit",
			msgs: [][]byte{
				streamStart(100, true), rel, ev(100, 1), streamStop(),
				begin(0x9000, 300), plain(7), plain(8), commit(0x9000, 0x9030),
				streamCommit(100, 0x9100, 0x9130),
				begin(0x9200, 301), plain(9), commit(0x9200, 0x9230),
			},
			want: []got{
				{Xid: 300, CommitLSN: 0x9000, EndLSN: 0x9030, IDs: []int64{7, 8}},
				{Xid: 100, CommitLSN: 0x9100, EndLSN: 0x9130, IDs: []int64{1}},
				{Xid: 301, CommitLSN: 0x9200, EndLSN: 0x9230, IDs: []int64{9}},
			},
		},
		{
			name: "a streamed transaction without outbox rows still checkpoints",
			msgs: [][]byte{
				streamStart(100, true), streamed(100, relation(ordersID, "public", "orders", "id", "note")),
				streamed(100, insert(ordersID, text("1"), text("x"))), streamed(100, message(true, 0x8000, "app", "m")), streamStop(),
				streamCommit(100, 0x9100, 0x9130),
			},
			want: []got{{Xid: 100, CommitLSN: 0x9100, EndLSN: 0x9130, IDs: []int64{}}},
		},
	}
	for _, spill := range []int{0, 1 << 20} { // 0: every record goes to disk
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/spill %d", tt.name, spill), func(t *testing.T) {
				d, _ := decoder.New("public.outbox")
				dir := t.TempDir()
				d.SetSpill(dir, spill)
				defer d.Close()
				out, err := decodeAll(t, d, tt.msgs)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(out, tt.want) {
					t.Fatalf("got  %+v\nwant %+v", out, tt.want)
				}
				if d.InTxn() {
					t.Fatal("InTxn after the last commit")
				}
			})
		}
	}
}

// A committed streamed transaction larger than the chunk limits comes out
// in chunks through Next, with the Stream Commit's commit LSN on every one
// and its end LSN on the last only; spill files are gone afterwards.
func TestStreamCommitChunks(t *testing.T) {
	t.Parallel()
	for _, spill := range []int{0, 64, 1 << 20} {
		t.Run(fmt.Sprint("spill ", spill), func(t *testing.T) {
			d, _ := decoder.New("public.outbox")
			dir := t.TempDir()
			d.SetSpill(dir, spill)
			d.SetChunk(3, 0)
			msgs := [][]byte{streamStart(100, true), streamed(100, outboxRelation())}
			for i := 1; i <= 8; i++ {
				msgs = append(msgs, ev(100, i))
				if i == 4 {
					// a transaction sent at its commit between two blocks
					// is not chunked with the streamed one
					msgs = append(msgs, streamStop(), begin(0x8000, 5), plain(50), commit(0x8000, 0x8030), streamStart(100, false))
				}
			}
			msgs = append(msgs, streamStop(), streamCommit(100, 0x9100, 0x9130))
			out, err := decodeAll(t, d, msgs)
			if err != nil {
				t.Fatal(err)
			}
			want := []got{
				{Xid: 5, CommitLSN: 0x8000, EndLSN: 0x8030, IDs: []int64{50}},
				{Xid: 100, CommitLSN: 0x9100, Partial: true, IDs: []int64{1, 2, 3}},
				{Xid: 100, CommitLSN: 0x9100, Partial: true, IDs: []int64{4, 5, 6}},
				{Xid: 100, CommitLSN: 0x9100, EndLSN: 0x9130, IDs: []int64{7, 8}},
			}
			if !reflect.DeepEqual(out, want) {
				t.Fatalf("got  %+v\nwant %+v", out, want)
			}
			if c := d.Counts(); c.Txns != 2 || c.Events != 9 || c.StreamedTxns != 1 {
				t.Fatalf("counts %+v, want 2 txns (1 streamed), 9 events", c)
			}
			if files, _ := os.ReadDir(dir); len(files) != 0 {
				t.Fatalf("spill files left: %v", files)
			}
		})
	}
}

// Events keep every field through the spill file, poison rows included.
func TestStreamedEventsRoundTrip(t *testing.T) {
	t.Parallel()
	rows := [][]byte{
		insert(outboxID, row("1", "order", "o-1", "Created", `{"a": [1, "é"]}`, text(`{"trace": "t1", "n": 1.50}`))...),
		insert(outboxID, row("2", "order", "o-2", "E", `{}`, null)...),
		insert(outboxID, text("3"), text("order"), null, text("E"), text(`{}`), null),       // poison: aggregate_id NULL
		insert(outboxID, row("4", "order", "o-4", "E", `{}`, text(`{"event_id": "x"}`))...), // poison: reserved header
	}
	plainMsgs := [][]byte{begin(0x9100, 100), outboxRelation()}
	plainMsgs = append(plainMsgs, rows...)
	plainMsgs = append(plainMsgs, commit(0x9100, 0x9130))
	streamMsgs := [][]byte{streamStart(100, true), streamed(100, outboxRelation())}
	for _, r := range rows {
		streamMsgs = append(streamMsgs, streamed(100, r))
	}
	streamMsgs = append(streamMsgs, streamStop(), streamCommit(100, 0x9100, 0x9130))

	decodeEvents := func(msgs [][]byte, spill int) []decoder.Event {
		d, _ := decoder.New("public.outbox")
		d.SetSpill(t.TempDir(), spill)
		defer d.Close()
		var evs []decoder.Event
		for i, m := range msgs {
			// the same LSN per row in both framings
			lsn := pglogrepl.LSN(0x1000 + i)
			if i >= 2 && i < 2+len(rows) {
				lsn = pglogrepl.LSN(0x2000 + i)
			}
			txn, err := d.Decode(lsn, m)
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			for txn != nil {
				evs = append(evs, txn.Events...)
				if txn, err = d.Next(); err != nil {
					t.Fatal(err)
				}
			}
		}
		return evs
	}
	want := decodeEvents(plainMsgs, 0)
	if len(want) != 4 || want[2].Err == nil || want[3].Err == nil || want[3].Err.ReservedHeader == "" {
		t.Fatalf("plain decode: %+v", want)
	}
	for _, spill := range []int{0, 1 << 20} {
		if got := decodeEvents(streamMsgs, spill); !reflect.DeepEqual(got, want) {
			t.Fatalf("spill %d: streamed events\n %+v\ndiffer from the same rows sent at commit\n %+v", spill, got, want)
		}
		if got := decodeEvents(streamMsgs, spill); got[2].Err.Error() != want[2].Err.Error() {
			t.Fatalf("poison text %q, want %q", got[2].Err, want[2].Err)
		}
	}
}

// Only between stream blocks may an idle keepalive position be confirmed:
// the server resends a transaction whose commit is past the confirmed
// position in full, so an open streamed transaction does not hold it.
func TestStreamInTxn(t *testing.T) {
	t.Parallel()
	d, _ := decoder.New("public.outbox")
	d.SetSpill(t.TempDir(), 1<<20)
	defer d.Close()
	steps := []struct {
		msg  []byte
		inTx bool
	}{
		{streamStart(100, true), true},
		{streamed(100, outboxRelation()), true},
		{ev(100, 1), true},
		{streamStop(), false},
		{streamCommit(100, 0x9100, 0x9130), false},
	}
	for i, s := range steps {
		if _, err := d.Decode(pglogrepl.LSN(i+1), s.msg); err != nil {
			t.Fatal(err)
		}
		if d.InTxn() != s.inTx {
			t.Fatalf("after %q: InTxn %v, want %v", s.msg[0], d.InTxn(), s.inTx)
		}
	}
}

func TestStreamProtocolErrors(t *testing.T) {
	t.Parallel()
	rel := streamed(100, outboxRelation())
	tests := []struct {
		name string
		msgs [][]byte
		want string
	}{
		{"stop without start", [][]byte{streamStop()}, "no stream block is open"},
		{"start inside a block", [][]byte{streamStart(100, true), streamStart(200, true)}, "stream block of transaction 100 is open"},
		{"start inside Begin..Commit", [][]byte{begin(0x10, 1), streamStart(100, true)}, "transaction 1 is still open"},
		{"Begin inside a block", [][]byte{streamStart(100, true), begin(0x10, 1)}, "stream block of transaction 100 is open"},
		{"continuation of an unknown transaction", [][]byte{streamStart(100, false)}, "first block was never seen"},
		{"first block twice", [][]byte{streamStart(100, true), streamStop(), streamStart(100, true)}, "already streaming"},
		{"commit inside a block", [][]byte{streamStart(100, true), streamCommit(100, 1, 2)}, "stream block of transaction 100 is open"},
		{"commit of an unknown transaction", [][]byte{streamCommit(100, 1, 2)}, "transaction 100 was never streamed"},
		{"abort inside a block", [][]byte{streamStart(100, true), streamAbort(100, 100)}, "stream block of transaction 100 is open"},
		{"Stream Start truncated", [][]byte{[]byte{'S', 0, 0}}, "bytes, want 5"},
		{"Stream Commit truncated", [][]byte{streamStart(100, true), streamStop(), streamCommit(100, 1, 2)[:20]}, "bytes, want 29"},
		{"Stream Abort truncated", [][]byte{streamAbort(100, 100)[:5]}, "Stream Abort"},
		{"streamed Insert without xid", [][]byte{streamStart(100, true), rel, []byte{'I', 0, 0}}, "truncated"},
		{"streamed Insert outside a block", [][]byte{streamStart(100, true), rel, streamStop(), ev(100, 1)}, "no transaction is open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, _ := decoder.New("public.outbox")
			d.SetSpill(t.TempDir(), 1<<20)
			defer d.Close()
			_, err := decodeAll(t, d, tt.msgs)
			if err == nil || !errors.Is(err, decoder.ErrProtocol) || !contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrProtocol with %q", err, tt.want)
			}
		})
	}
}

// Close discards open streamed transactions and removes their files: a
// new session gets them again from the server.
func TestStreamCloseRemovesSpill(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d, _ := decoder.New("public.outbox")
	d.SetSpill(dir, 0)
	msgs := [][]byte{streamStart(100, true), streamed(100, outboxRelation()), ev(100, 1), streamStop(),
		streamStart(200, true), ev(200, 2), streamStop()}
	if _, err := decodeAll(t, d, msgs); err != nil {
		t.Fatal(err)
	}
	if st := d.Spilled(); st.OpenTxns != 2 || st.Bytes == 0 {
		t.Fatalf("Spilled() = %+v, want 2 open transactions on disk", st)
	}
	d.Close()
	d.Close() // idempotent
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Fatalf("files left after Close: %v", files)
	}
	if st := d.Spilled(); st.OpenTxns != 0 || st.Bytes != 0 {
		t.Fatalf("Spilled() after Close = %+v", st)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// FuzzStreamModel drives the decoder with valid streams of interleaved,
// aborted and committed transactions chosen by the input, and compares
// what it hands out with a model: every committed event exactly once, in
// commit order, none of an aborted transaction or subtransaction.
func FuzzStreamModel(f *testing.F) {
	f.Add([]byte{0, 1, 1, 0, 4, 0, 1, 0, 3}, uint16(64), uint8(2))
	f.Add([]byte{0, 1, 0x11, 0x21, 0x11, 1, 0, 0x12, 0x13, 3, 0x10, 0, 1, 0, 3}, uint16(0), uint8(0))
	f.Add([]byte{0, 1, 0, 0x12, 0x20, 0x31, 1, 0x40, 0, 0x32, 0x41, 0x51, 2, 0x50, 0x60, 3, 0x43, 0x73}, uint16(1<<15), uint8(3))
	f.Fuzz(func(t *testing.T, ops []byte, spill uint16, chunk uint8) {
		if len(ops) > 200 {
			ops = ops[:200]
		}
		d, _ := decoder.New("public.outbox")
		d.SetSpill(t.TempDir(), int(spill))
		d.SetChunk(int(chunk), 0)
		defer d.Close()

		type rec struct {
			sub uint32
			id  int64
		}
		open := map[uint32][]rec{}
		var (
			msgs  [][]byte
			want  []int64
			cur   uint32 // open block's xid, 0: none
			id    int64
			lsn   = pglogrepl.LSN(0x10000)
			plain = uint32(900)
		)
		for _, op := range ops {
			top := uint32(100 + op>>4%3)
			switch op & 0x0F % 5 {
			case 0: // start or stop a block
				if cur != 0 {
					msgs, cur = append(msgs, streamStop()), 0
					continue
				}
				_, isOpen := open[top]
				msgs = append(msgs, streamStart(top, !isOpen))
				if !isOpen {
					open[top] = []rec{}
					msgs = append(msgs, streamed(top, outboxRelation()))
				}
				cur = top
			case 1: // a row by the block's transaction or one of its subtransactions
				if cur == 0 {
					continue
				}
				sub := cur
				if k := uint32(op >> 6); k > 0 {
					sub = cur*10 + k
				}
				id++
				msgs = append(msgs, ev(sub, int(id)))
				open[cur] = append(open[cur], rec{sub, id})
			case 2: // abort a subtransaction (truncating, as the server's order implies) or all
				rs, isOpen := open[top]
				if cur != 0 || !isOpen {
					continue
				}
				sub := top
				if k := uint32(op >> 6); k > 0 {
					sub = top*10 + k
				}
				msgs = append(msgs, streamAbort(top, sub))
				if sub == top {
					delete(open, top)
					continue
				}
				for i, r := range rs {
					if r.sub == sub {
						open[top] = rs[:i]
						break
					}
				}
			case 3: // commit
				rs, isOpen := open[top]
				if cur != 0 || !isOpen {
					continue
				}
				lsn += 0x100
				msgs = append(msgs, streamCommit(top, lsn, lsn+0x30))
				for _, r := range rs {
					want = append(want, r.id)
				}
				delete(open, top)
			case 4: // a transaction sent at its commit
				if cur != 0 {
					continue
				}
				id++
				lsn += 0x100
				plain++
				msgs = append(msgs, begin(lsn, plain), outboxRelation(), insert(outboxID, row(fmt.Sprint(id), "order", "o-1", "E", `{}`, null)...), commit(lsn, lsn+0x30))
				want = append(want, id)
			}
		}
		out, err := decodeAll(t, d, msgs)
		if err != nil {
			t.Fatal(err)
		}
		gotIDs := []int64{}
		var last pglogrepl.LSN
		for _, g := range out {
			gotIDs = append(gotIDs, g.IDs...)
			if g.CommitLSN < last {
				t.Fatalf("commit LSN %s after %s: out of commit order", g.CommitLSN, last)
			}
			last = g.CommitLSN
		}
		if want == nil {
			want = []int64{}
		}
		if !reflect.DeepEqual(gotIDs, want) {
			t.Fatalf("handed out %v, want %v", gotIDs, want)
		}
		if st := d.Spilled(); st.OpenTxns != len(open) {
			t.Fatalf("Spilled %+v, model has %d open", st, len(open))
		}
	})
}
