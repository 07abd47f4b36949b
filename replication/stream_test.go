package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// These tests run the Stream's real loop against a scripted walsender: a
// fake server on a loopback socket that answers the replication
// connection's startup, SHOW wal_sender_timeout, IDENTIFY_SYSTEM, the slot
// query and START_REPLICATION, then sends what each test scripts
// (XLogData, keepalives, CopyDone) and reports every standby status update
// the stream sends back. Only prepare (the normal connection's checks) is
// replaced.

const (
	slotConfirmed = pglogrepl.LSN(0x1000000) // the slot's confirmed_flush_lsn: the watermark at start
	serverWALEnd  = pglogrepl.LSN(0x1010000) // IDENTIFY_SYSTEM's xlogpos: close, so the stream is live, not catching up
	testWait      = 10 * time.Second         // deadline of every wait: only reached when a test fails
)

// statusUpdate is a decoded StandbyStatusUpdate ('r').
type statusUpdate struct {
	Write, Flush, Apply pglogrepl.LSN
	ReplyRequested      bool
}

func (u statusUpdate) String() string {
	return fmt.Sprintf("write %s flush %s apply %s reply %v", u.Write, u.Flush, u.Apply, u.ReplyRequested)
}

// clientMsg is what the stream sent in COPY mode: a status update, a
// CopyDone or the end of the connection (Terminate or EOF).
type clientMsg struct {
	status   *statusUpdate
	copyDone bool
	end      bool
}

// walScript is what one replication connection answers before streaming.
type walScript struct {
	confirmed pglogrepl.LSN
	// silentCopyDone: do not answer the client's CopyDone (a server that
	// hangs at shutdown).
	silentCopyDone bool
}

// fakeWalsender accepts replication connections on a loopback listener and
// scripts each one; sessions delivers each after START_REPLICATION.
type fakeWalsender struct {
	t        *testing.T
	ln       net.Listener
	script   func(n int) walScript // n counts connections from 0
	sessions chan *walConn
	n        atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn // closed at the end of the test
}

func newFakeWalsender(t *testing.T, script func(n int) walScript) *fakeWalsender {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeWalsender{t: t, ln: ln, script: script, sessions: make(chan *walConn, 16)}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakeWalsender) url() string {
	return "postgres://relay@" + f.ln.Addr().String() + "/outbox?sslmode=disable&connect_timeout=5"
}

func (f *fakeWalsender) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		n := int(f.n.Add(1)) - 1
		w := &walConn{conn: c, be: pgproto3.NewBackend(c, c), from: make(chan clientMsg, 4096), script: f.script(n)}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			w.serve(f.sessions)
		}()
	}
}

// next waits for the next replication session (START_REPLICATION done).
func (f *fakeWalsender) next(t *testing.T) *walConn {
	t.Helper()
	select {
	case w := <-f.sessions:
		return w
	case <-time.After(testWait):
		t.Fatal("no replication session started")
		return nil
	}
}

// walConn is one scripted replication connection.
type walConn struct {
	conn   net.Conn
	be     *pgproto3.Backend
	script walScript
	sendMu sync.Mutex // the test and the reader both send
	start  pglogrepl.LSN
	from   chan clientMsg
}

// serve answers the startup and the commands before START_REPLICATION on
// this goroutine, hands the session over, then reads the client's COPY
// messages until the connection ends. Errors just end the connection: the
// test sees them as a missing session or message.
func (w *walConn) serve(sessions chan<- *walConn) {
	defer close(w.from)
	if _, err := w.be.ReceiveStartupMessage(); err != nil {
		return
	}
	w.send(&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "server_version", Value: "16.4"},
		&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: []byte{1, 2, 3, 4}},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	for {
		msg, err := w.be.Receive()
		if err != nil {
			return
		}
		q, ok := msg.(*pgproto3.Query)
		if !ok {
			return // Terminate, or something this script does not know
		}
		switch {
		case q.String == "SHOW wal_sender_timeout":
			w.rows("wal_sender_timeout", "0") // off: any status interval is accepted
		case q.String == "IDENTIFY_SYSTEM":
			w.send(textRow([]string{"systemid", "timeline", "xlogpos", "dbname"},
				[]string{"7000000000000000001", "1", serverWALEnd.String(), "outbox"})...)
		case strings.HasPrefix(q.String, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots"):
			w.rows("confirmed_flush_lsn", w.script.confirmed.String())
		case strings.HasPrefix(q.String, "START_REPLICATION SLOT"):
			f := strings.Fields(q.String) // START_REPLICATION SLOT name LOGICAL lsn (...)
			lsn, err := pglogrepl.ParseLSN(f[4])
			if err != nil {
				return
			}
			w.start = lsn
			w.send(&pgproto3.CopyBothResponse{OverallFormat: 0})
			sessions <- w
			w.copyMode()
			return
		default:
			w.send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: "unscripted: " + q.String},
				&pgproto3.ReadyForQuery{TxStatus: 'I'})
		}
	}
}

func (w *walConn) copyMode() {
	for {
		msg, err := w.be.Receive()
		if err != nil {
			w.from <- clientMsg{end: true}
			return
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 34 && m.Data[0] == pglogrepl.StandbyStatusUpdateByteID {
				d := m.Data[1:]
				w.from <- clientMsg{status: &statusUpdate{
					Write:          pglogrepl.LSN(binary.BigEndian.Uint64(d[0:])),
					Flush:          pglogrepl.LSN(binary.BigEndian.Uint64(d[8:])),
					Apply:          pglogrepl.LSN(binary.BigEndian.Uint64(d[16:])),
					ReplyRequested: d[32] != 0,
				}}
			}
		case *pgproto3.CopyDone:
			w.from <- clientMsg{copyDone: true}
			if !w.script.silentCopyDone {
				w.send(&pgproto3.CopyDone{}, &pgproto3.CommandComplete{CommandTag: []byte("START_REPLICATION")},
					&pgproto3.ReadyForQuery{TxStatus: 'I'})
			}
		case *pgproto3.Terminate:
			w.from <- clientMsg{end: true}
			return
		}
	}
}

func (w *walConn) send(msgs ...pgproto3.BackendMessage) {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	for _, m := range msgs {
		w.be.Send(m)
	}
	_ = w.be.Flush() // a failed write shows as a missing reply
}

// rows answers a one-column, one-row text query.
func (w *walConn) rows(col, val string) {
	w.send(textRow([]string{col}, []string{val})...)
}

func textRow(cols, vals []string) []pgproto3.BackendMessage {
	fields := make([]pgproto3.FieldDescription, len(cols))
	row := make([][]byte, len(vals))
	for i, c := range cols {
		fields[i] = pgproto3.FieldDescription{Name: []byte(c), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}
		row[i] = []byte(vals[i])
	}
	return []pgproto3.BackendMessage{&pgproto3.RowDescription{Fields: fields}, &pgproto3.DataRow{Values: row},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'}}
}

// keepalive is a PrimaryKeepaliveMessage ('k').
func keepalive(walEnd pglogrepl.LSN, reply bool) []byte {
	b := []byte{pglogrepl.PrimaryKeepaliveMessageByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(walEnd))
	b = binary.BigEndian.AppendUint64(b, 0) // server time
	if reply {
		return append(b, 1)
	}
	return append(b, 0)
}

// xlogData is an XLogData message ('w'); a logical walsender puts WALStart
// in ServerWALEnd too.
func xlogData(walStart pglogrepl.LSN, data string) []byte {
	b := []byte{pglogrepl.XLogDataByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(walStart))
	b = binary.BigEndian.AppendUint64(b, uint64(walStart))
	b = binary.BigEndian.AppendUint64(b, 0)
	return append(b, data...)
}

// copyData sends each payload as CopyData, in one write.
func (w *walConn) copyData(payloads ...[]byte) {
	msgs := make([]pgproto3.BackendMessage, len(payloads))
	for i, p := range payloads {
		msgs[i] = &pgproto3.CopyData{Data: p}
	}
	w.send(msgs...)
}

// recv waits for the stream's next COPY message.
func (w *walConn) recv(t *testing.T) clientMsg {
	t.Helper()
	select {
	case m, ok := <-w.from:
		if !ok {
			return clientMsg{end: true}
		}
		return m
	case <-time.After(testWait):
		t.Fatal("nothing from the stream")
		return clientMsg{}
	}
}

// status waits for the next status update; anything else fails the test.
func (w *walConn) status(t *testing.T) statusUpdate {
	t.Helper()
	m := w.recv(t)
	if m.status == nil {
		t.Fatalf("want a status update, got %+v", m)
	}
	return *m.status
}

// fakeProgress is a Progress that records the stream's calls. Idle, it
// raises Flushed on AdvanceIdle (nothing in flight); otherwise AdvanceIdle
// leaves it, as with events in flight.
type fakeProgress struct {
	mu       sync.Mutex
	flushed  pglogrepl.LSN
	idle     bool
	calls    []string
	drain    func(ctx context.Context) error // optional, run by Drain after the first (session start) call
	drains   int
	restart  atomic.Bool
	advanced chan struct{}
	sessions []history.Now // Session's arguments, apart from calls
}

func newFakeProgress(flushed pglogrepl.LSN, idle bool) *fakeProgress {
	return &fakeProgress{flushed: flushed, idle: idle, advanced: make(chan struct{}, 1)}
}

func (p *fakeProgress) record(format string, a ...any) {
	p.calls = append(p.calls, fmt.Sprintf(format, a...))
}

func (p *fakeProgress) Flushed() pglogrepl.LSN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flushed
}

func (p *fakeProgress) AdvanceIdle(walEnd pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record("AdvanceIdle %s", walEnd)
	if p.idle && walEnd > p.flushed {
		p.flushed = walEnd
	}
}

func (p *fakeProgress) Reset(lsn pglogrepl.LSN) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record("Reset %s", lsn)
	p.flushed = lsn
	return nil
}

func (p *fakeProgress) Session(_ context.Context, now history.Now) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sessions = append(p.sessions, now)
	return nil
}

func (p *fakeProgress) Drain(ctx context.Context) error {
	p.mu.Lock()
	p.record("Drain")
	p.drains++
	hook := p.drain
	n := p.drains
	p.mu.Unlock()
	p.restart.Store(false) // as the pipeline: a drained progress has nothing to rewind
	if hook != nil && n > 1 {
		return hook(ctx)
	}
	return nil
}

func (p *fakeProgress) Restarting() bool { return p.restart.Load() }

func (p *fakeProgress) Advanced() <-chan struct{} { return p.advanced }

// ack moves the watermark, as acks arriving would, and notifies.
func (p *fakeProgress) ack(lsn pglogrepl.LSN) {
	p.mu.Lock()
	p.flushed = lsn
	p.mu.Unlock()
	select {
	case p.advanced <- struct{}{}:
	default:
	}
}

func (p *fakeProgress) recorded() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

// streamRun is a Stream running against a fake walsender.
type streamRun struct {
	s      *Stream
	p      *fakeProgress
	ws     *fakeWalsender
	cancel context.CancelFunc
	done   chan error
}

// startStream runs a Stream with handler h against a fake walsender.
// statusInterval is long (a minute) in tests that count status updates:
// then every update is prompt (a reply, a moved watermark or the end).
func startStream(t *testing.T, p *fakeProgress, statusInterval time.Duration, script func(n int) walScript, h Handler) *streamRun {
	t.Helper()
	ws := newFakeWalsender(t, script)
	cfg := DefaultConfig()
	cfg.URL = ws.url()
	cfg.StatusInterval = statusInterval
	cfg.ReceiveTimeout = 5 * time.Minute
	cfg.ReconnectMin, cfg.ReconnectMax = 10*time.Millisecond, 20*time.Millisecond
	s, err := NewStream(cfg, p, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.prepare = func(context.Context, pgsetup.Config, bool, pg.Identity, zerolog.Logger) (pgsetup.SlotInfo, error) {
		return pgsetup.SlotInfo{}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &streamRun{s: s, p: p, ws: ws, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx, h) }()
	t.Cleanup(func() {
		s.Close()
		cancel()
		select {
		case <-r.done:
		case <-time.After(testWait):
			t.Error("Run did not return")
		}
	})
	return r
}

// wait waits for Run to return.
func (r *streamRun) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(testWait):
		t.Fatal("Run did not return")
		return nil
	}
}

func fixedSlot(confirmed pglogrepl.LSN) func(int) walScript {
	return func(int) walScript { return walScript{confirmed: confirmed} }
}

func noHandler(context.Context, pglogrepl.LSN, []byte) error { return nil }

// ready waits for the session and its first status update: the watermark
// is above the last confirmation (none), so the loop confirms it within
// confirmGap. From then on, with a long status interval, every status
// update answers something the test did.
func (r *streamRun) ready(t *testing.T) *walConn {
	t.Helper()
	w := r.ws.next(t)
	if w.start != slotConfirmed {
		t.Fatalf("START_REPLICATION at %s, want the slot's confirmed position %s", w.start, slotConfirmed)
	}
	if got := w.status(t); got.Flush != slotConfirmed || got.Apply != slotConfirmed || got.Write != slotConfirmed {
		t.Fatalf("first status update %s, want write, flush and apply at %s", got, slotConfirmed)
	}
	return w
}

// Keepalives: one that requests a reply gets one at once (long before the
// status interval), carrying the received position in Write and only the
// progress's watermark in Flush and Apply; one that does not request a
// reply gets none (the reply to the next one is the next update). Each
// keepalive's WAL end goes to AdvanceIdle, which an idle progress takes as
// its watermark (convention 5) before the reply is sent.
func TestStreamKeepalives(t *testing.T) {
	const a, b = slotConfirmed + 0x100, slotConfirmed + 0x200
	tests := []struct {
		name    string
		idle    bool
		send    [][]byte
		want    statusUpdate
		advance []string // AdvanceIdle calls after the session's start
	}{
		{"reply requested, events in flight", false, [][]byte{keepalive(a, true)},
			statusUpdate{Write: a, Flush: slotConfirmed, Apply: slotConfirmed}, []string{"AdvanceIdle " + a.String()}},
		{"reply requested, idle: advance to the WAL end", true, [][]byte{keepalive(a, true)},
			statusUpdate{Write: a, Flush: a, Apply: a}, []string{"AdvanceIdle " + a.String()}},
		{"no reply requested", false, [][]byte{keepalive(a, false), keepalive(b, true)},
			statusUpdate{Write: b, Flush: slotConfirmed, Apply: slotConfirmed}, []string{"AdvanceIdle " + a.String(), "AdvanceIdle " + b.String()}},
		{"after XLogData: received, not confirmed", false, [][]byte{xlogData(a, "x"), keepalive(a, true)},
			statusUpdate{Write: a, Flush: slotConfirmed, Apply: slotConfirmed}, []string{"AdvanceIdle " + a.String()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeProgress(slotConfirmed, tt.idle)
			r := startStream(t, p, time.Minute, fixedSlot(slotConfirmed), noHandler)
			w := r.ready(t)
			w.copyData(tt.send...)
			if got := w.status(t); got != tt.want {
				t.Errorf("status update %s, want %s", got, tt.want)
			}
			// Drain, then AdvanceIdle of the slot's position at resume.
			want := append([]string{"Drain", "AdvanceIdle " + slotConfirmed.String()}, tt.advance...)
			if got := p.recorded(); strings.Join(got, "; ") != strings.Join(want, "; ") {
				t.Errorf("progress calls %q, want %q", got, want)
			}
		})
	}
}

// A handler blocked on backpressure does not stop status updates: the
// pinger takes the connection (TryLock: the loop does not hold it while in
// the handler) every status interval and, promptly, whenever the watermark
// moves, and never confirms past the watermark, though far more was
// received. The keepalives the server sent meanwhile are answered once the
// handler returns.
func TestStreamBackpressureKeepsConfirming(t *testing.T) {
	const (
		moved = slotConfirmed + 0x80  // acked while the handler blocks
		wal   = slotConfirmed + 0x100 // received, handed to the blocked handler
		end   = slotConfirmed + 0x200 // the server's keepalives
	)
	tests := []struct {
		name     string
		interval time.Duration
		periodic int // status updates to see while blocked, before the ack
	}{
		{"every status interval", 20 * time.Millisecond, 5},
		// A minute: no update is due, so the one after the ack is prompt.
		{"when the watermark moves", time.Minute, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entered, release := make(chan struct{}), make(chan struct{})
			h := func(ctx context.Context, _ pglogrepl.LSN, _ []byte) error {
				close(entered)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}
			p := newFakeProgress(slotConfirmed, false)
			r := startStream(t, p, tt.interval, fixedSlot(slotConfirmed), h)
			// After a first status update: with the minute's interval no
			// update is due, so only the prompt path can send one.
			w := r.ready(t)
			w.copyData(xlogData(wal, "x"))
			select {
			case <-entered:
			case <-time.After(testWait):
				t.Fatal("handler not called")
			}
			// Blocked: the server asks for replies the loop cannot read.
			w.copyData(keepalive(end, true), keepalive(end, true))
			check := func(u statusUpdate, watermark pglogrepl.LSN) {
				t.Helper()
				if u.Flush > watermark || u.Apply != u.Flush || u.Flush < slotConfirmed {
					t.Fatalf("status update %s while the watermark is %s", u, watermark)
				}
				if u.Write < wal || u.Write > end {
					t.Fatalf("status update %s: write not between the received %s and %s", u, wal, end)
				}
			}
			// Those with Write at wal were sent after the loop received the
			// XLogData and before the handler was released: by the pinger.
			// Earlier ones, the loop's, are skipped.
			for n := 0; n < tt.periodic; {
				if u := w.status(t); u.Write == wal {
					check(u, slotConfirmed)
					n++
				}
			}
			p.ack(moved)
			for {
				u := w.status(t)
				if u.Write < wal {
					continue // the loop's, before the XLogData
				}
				check(u, moved)
				if u.Flush == moved {
					break
				}
			}
			for range tt.periodic {
				check(w.status(t), moved)
			}
			close(release)
			// The queued keepalives are answered: Write reaches their WAL end.
			for {
				u := w.status(t)
				check(u, moved)
				if u.Write == end {
					break
				}
			}
		})
	}
}

// The server ending COPY (CopyDone) ends the session, not the stream: the
// watermark is sent once more, the connection closed, and a new session
// starts (after a Drain) from the slot.
func TestStreamServerCopyDone(t *testing.T) {
	p := newFakeProgress(slotConfirmed, false)
	r := startStream(t, p, time.Minute, fixedSlot(slotConfirmed), noHandler)
	w := r.ready(t)
	w.send(&pgproto3.CopyDone{})
	if got := w.status(t); got.Flush != slotConfirmed || got.Apply != slotConfirmed {
		t.Errorf("last status update %s, want flush and apply %s", got, slotConfirmed)
	}
	if m := w.recv(t); !m.end {
		t.Errorf("after the last status update: %+v, want the connection closed", m)
	}
	w2 := r.ws.next(t)
	if w2.start != slotConfirmed {
		t.Errorf("second session starts at %s, want %s", w2.start, slotConfirmed)
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run returned %v after the server's CopyDone", err)
	default:
	}
	if got, want := p.recorded()[:3], []string{"Drain", "AdvanceIdle " + slotConfirmed.String(), "Drain"}; strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("progress calls %q, want %q first", got, want)
	}
	r.s.Close()
	if err := r.wait(t); err != nil {
		t.Errorf("Run after Close: %v", err)
	}
}

// A handler's error is fatal: Run returns it (fault.Fatal) after sending
// the last good watermark, and does not reconnect. ErrRestart, from the
// handler or Progress.Restarting, ends only the session: after a Drain
// the next starts from the slot, resetting the watermark when the slot is
// behind it.
func TestStreamSessionEnds(t *testing.T) {
	boom := errors.New("sink refused the event")
	const (
		wal   = slotConfirmed + 0x100
		moved = slotConfirmed + 0x80 // acked in the first session, never confirmed to the slot
	)
	tests := []struct {
		name    string
		handler func(context.Context, pglogrepl.LSN, []byte) error
		trigger func(w *walConn, p *fakeProgress) // after ready
		fatal   bool
	}{
		{"handler error", func(context.Context, pglogrepl.LSN, []byte) error { return boom },
			func(w *walConn, _ *fakeProgress) { w.copyData(xlogData(wal, "x")) }, true},
		{"handler ErrRestart", func(context.Context, pglogrepl.LSN, []byte) error { return fmt.Errorf("rewind: %w", ErrRestart) },
			func(w *walConn, _ *fakeProgress) { w.copyData(xlogData(wal, "x")) }, false},
		{"progress restarting", noHandler,
			func(_ *walConn, p *fakeProgress) { p.restart.Store(true) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeProgress(slotConfirmed, false)
			r := startStream(t, p, time.Minute, fixedSlot(slotConfirmed), tt.handler)
			w := r.ready(t)
			// Acked but the slot never heard: the second session's slot is behind.
			p.mu.Lock()
			p.flushed = moved
			p.mu.Unlock()
			tt.trigger(w, p)
			// The last status update carries the watermark, never the received WAL.
			var last statusUpdate
			for {
				m := w.recv(t)
				if m.end {
					break
				}
				if m.status != nil {
					last = *m.status
				}
			}
			if last.Flush != moved || last.Apply != moved {
				t.Errorf("last status update %s, want flush and apply %s", last, moved)
			}
			if tt.fatal {
				err := r.wait(t)
				if !errors.Is(err, boom) || fault.KindOf(err) != fault.Fatal {
					t.Fatalf("Run = %v (%v), want fatal %v", err, fault.KindOf(err), boom)
				}
				if !strings.Contains(err.Error(), wal.String()) {
					t.Errorf("error %q does not name the LSN %s", err, wal)
				}
				if n := r.ws.n.Load(); n != 1 {
					t.Errorf("%d connections after a fatal error, want 1", n)
				}
				return
			}
			w2 := r.ws.next(t)
			if w2.start != slotConfirmed {
				t.Errorf("second session starts at %s, want the slot's %s", w2.start, slotConfirmed)
			}
			want := []string{"Drain", "AdvanceIdle " + slotConfirmed.String(), "Drain", "Reset " + slotConfirmed.String()}
			if got := p.recorded(); strings.Join(got, "; ") != strings.Join(want, "; ") {
				t.Errorf("progress calls %q, want %q", got, want)
			}
			// The watermark was reset to the slot's position: a reply says so.
			w2.copyData(keepalive(wal, true))
			if got := w2.status(t); got.Flush != slotConfirmed || got.Apply != slotConfirmed {
				t.Errorf("second session's status update %s, want flush and apply %s", got, slotConfirmed)
			}
		})
	}
}

// At shutdown the stream drains (Progress.Drain), sends a final status
// update with the drained watermark and ends COPY, bounded even when the
// caller's context is already over (the hard stop) or the server never
// answers the CopyDone; Run then returns nil.
func TestStreamFinalStatusAtShutdown(t *testing.T) {
	const drained = slotConfirmed + 0x80
	tests := []struct {
		name   string
		stop   func(r *streamRun)
		silent bool
		want   pglogrepl.LSN
	}{
		{"Close: drain, then confirm", func(r *streamRun) { r.s.Close() }, false, drained},
		{"context cancelled: no drain, still confirm", func(r *streamRun) { r.cancel() }, false, slotConfirmed},
		{"server silent after CopyDone", func(r *streamRun) { r.s.Close() }, true, drained},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeProgress(slotConfirmed, false)
			p.drain = func(ctx context.Context) error {
				select {
				case <-ctx.Done(): // the hard stop cut the drain short
					return ctx.Err()
				default:
				}
				p.mu.Lock()
				p.flushed = drained // the last acks arrived during the drain
				p.mu.Unlock()
				return nil
			}
			r := startStream(t, p, time.Minute, func(int) walScript {
				return walScript{confirmed: slotConfirmed, silentCopyDone: tt.silent}
			}, noHandler)
			w := r.ready(t)
			tt.stop(r)
			if got := w.status(t); got.Flush != tt.want || got.Apply != tt.want {
				t.Errorf("final status update %s, want flush and apply %s", got, tt.want)
			}
			if m := w.recv(t); !m.copyDone {
				t.Errorf("after the final status update: %+v, want CopyDone", m)
			}
			if m := w.recv(t); !m.end {
				t.Errorf("after CopyDone: %+v, want the connection closed", m)
			}
			if err := r.wait(t); err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
			if n := r.ws.n.Load(); n != 1 {
				t.Errorf("%d connections, want 1: a stopped stream does not reconnect", n)
			}
		})
	}
}
