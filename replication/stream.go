package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/rs/zerolog"
)

// Handler receives each XLogData payload in WAL order, on the stream's loop
// goroutine. It may block (backpressure): status updates keep flowing while it
// does. walData is only valid until the handler returns. A returned error
// stops the relay (it is treated as fatal).
type Handler func(ctx context.Context, walStart pglogrepl.LSN, walData []byte) error

// Progress is the ack side as the stream sees it; the pipeline implements it.
type Progress interface {
	// Flushed is the position every event before which is acked; it goes
	// into Flush and Apply of each status update. Any goroutine.
	Flushed() pglogrepl.LSN
	// AdvanceIdle asks to move Flushed up to walEnd (a keepalive's WAL end,
	// or the slot's confirmed position at session start); the
	// implementation does so only when nothing is in flight and no
	// transaction is open.
	AdvanceIdle(walEnd pglogrepl.LSN)
	// Reset moves Flushed to lsn, down as well as up, for a session that
	// starts at lsn on a server whose history the watermark may not be on.
	// The stream calls it only after Drain, when nothing is in flight; the
	// implementation refuses otherwise.
	Reset(lsn pglogrepl.LSN) error
	// Session tells the progress the history of the session about to
	// stream (package history), after Reset or AdvanceIdle and before any
	// WAL of it is handled, on the loop goroutine: it decides which kept
	// position, if any, the session skips up to. An error ends the session
	// (fault.Fatal stops the relay).
	Session(ctx context.Context, now history.Now) error
	// Drain blocks until every event handed over so far is acked (or ctx
	// ends) and forgets any partially received transaction. The stream calls
	// it before reconnecting and at shutdown.
	Drain(ctx context.Context) error
	// Restarting reports that the progress wants the session restarted
	// from Flushed (a rewind after a publish error): the loop ends the
	// session and the next one starts after Drain. Any goroutine; cheap.
	Restarting() bool
	// Advanced receives, without blocking its sender, after Flushed
	// moved; one receive may stand for several moves. The stream then
	// confirms promptly instead of at the next status interval.
	Advanced() <-chan struct{}
}

// confirmGap is the least time between two status updates sent because the
// watermark moved: a burst of acks makes a few updates a second, not one
// per transaction.
const confirmGap = 100 * time.Millisecond

// ErrRestart ends a session so that the next starts from the progress's
// Flushed position; a handler returns it (wrapped or not) to ask for that.
var ErrRestart = errors.New("replication restarts from the ack watermark")

// Stream runs the replication session. Create with NewStream, then Run once.
type Stream struct {
	cfg      Config
	log      zerolog.Logger
	metrics  *Metrics
	progress Progress

	mu      sync.Mutex // guards conn: pgconn is not safe for concurrent use
	conn    *pgconn.PgConn
	catchUp *catchUpReader // conn's reader; the loop tells it how far behind the stream is

	// prepare checks the server, slot and publication before each session
	// (pgsetup.Prepare; a test scripting a walsender replaces it).
	prepare      func(ctx context.Context, cfg pgsetup.Config, createSlot bool, prev pg.Identity, log zerolog.Logger) (pgsetup.SlotInfo, error)
	slotSeen     bool          // the slot existed or was created in this process
	identity     pg.Identity   // the server history the progress's watermark is on; the loop goroutine's
	received     atomic.Uint64 // highest WAL position seen
	serverEnd    atomic.Uint64 // the server's WAL end as last learnt (IDENTIFY_SYSTEM, ServerAt)
	streaming    atomic.Bool
	lastSentTime time.Time     // guarded by mu, like every status update
	lastSentLSN  pglogrepl.LSN // Flush of the last status update; guarded by mu

	stopMu sync.Mutex
	stop   context.CancelFunc // ends the running session gracefully; set by Run
	closed bool               // Close was called
	// Fence, when set, guards the slot against this process after it lost
	// its leadership: no session starts unless Check passes, and no status
	// update is sent unless Valid.
	Fence Fence
	// Messages asks pgoutput for Messages (the relay's heartbeats) on a
	// server that has the option (PostgreSQL 14+); set before Run.
	Messages bool
	// MessagePrefix is messages.prefix (message events, the table-less
	// outbox); "" when off. Set, it needs Messages and a server with them:
	// on an older one the session is refused as fatal. Set before Run.
	MessagePrefix string
	// OnCatchUp, when set, hears when the stream starts or stops catching
	// up (far behind the server's WAL end: catchUpReader), from the loop
	// goroutine: the relay's producer batches harder meanwhile. Set before Run.
	OnCatchUp func(catchingUp bool)
	// OnPrepared, when set, hears what each session's check of the server
	// found (pgsetup.Prepare), from the loop goroutine, before any WAL of
	// the session is handled: the relay's decoder learns which columns
	// each outbox table must be streamed with. Set before Run.
	OnPrepared func(pgsetup.SlotInfo)
	catchingUp bool             // what OnCatchUp last heard; the loop goroutine's
	oldWarned  bool             // the server is too old for Messages; said once
	warned     map[string]bool  // the failover warnings (pgsetup.SlotInfo.Warnings) logged so far
	registry   pgsetup.Registry // the slot's registry row, as this session's prepare raised it
}

// Fence is what the stream needs from leader election.
type Fence interface {
	// Check verifies with a round trip that this process may stream.
	Check(ctx context.Context) error
	// Valid reports, without blocking, whether it may still confirm.
	Valid() bool
}

// errFenced is returned by sendStatus when the Fence forbids confirming.
var errFenced = errors.New("not the leader any more: confirming nothing")

// NewStream validates cfg and allocates; it starts nothing.
func NewStream(cfg Config, progress Progress, log zerolog.Logger, m *Metrics) (*Stream, error) {
	if err := cfg.Validate("postgres."); err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Stream{
		cfg: cfg, progress: progress, metrics: m, warned: map[string]bool{}, prepare: pgsetup.Prepare,
		log: log.With().Str("component", "replication").Logger(), // the caller's logger carries slot
	}, nil
}

// SetIdentity tells the stream which server history the progress's starting
// watermark was acked on: an earlier stream's Identity (an earlier
// leadership term of this process), or zero if none. Call before Run.
func (s *Stream) SetIdentity(id pg.Identity) { s.identity = id }

// Identity returns the server history of the last session that started
// (what SetIdentity set if none did). Call after Run returned.
func (s *Stream) Identity() pg.Identity { return s.identity }

// Streaming reports whether a replication session is currently streaming.
// Any goroutine; used by /readyz.
func (s *Stream) Streaming() bool { return s.streaming.Load() }

// track judges, with the stream at at, whether it is catching up, and
// tells the metric, the log and OnCatchUp when that changed.
func (s *Stream) track(at pglogrepl.LSN) {
	if s.catchUp == nil {
		return // a stream tested without a connection
	}
	s.catchUp.observe(at, pglogrepl.LSN(s.serverEnd.Load()))
	if b := s.catchUp.behind.Load(); b != s.catchingUp {
		s.catchingUp = b
		if b {
			s.metrics.catchingUp.Set(1)
		} else {
			s.metrics.catchingUp.Set(0)
		}
		s.log.Debug().Bool("catching_up", b).Str("received", s.Received().String()).
			Str("server_wal_end", pglogrepl.LSN(s.serverEnd.Load()).String()).Msg("replication stream catching up (batched reads and requests) or caught up")
		if s.OnCatchUp != nil {
			s.OnCatchUp(b)
		}
	}
}

// ServerAt tells the stream that the server's WAL reached end (a
// heartbeat's position): far ahead of the stream, it reads in batches (see
// catchUpReader). Safe from any goroutine.
func (s *Stream) ServerAt(end pglogrepl.LSN) { raise(&s.serverEnd, uint64(end)) }

// raise sets a to v if v is larger; safe from any goroutine.
func raise(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// Received returns the highest WAL position received.
func (s *Stream) Received() pglogrepl.LSN { return pglogrepl.LSN(s.received.Load()) }

// Run streams until Close, ctx's end or a fatal error. Connection losses
// are retried with capped exponential backoff and jitter, resuming from the
// slot. Close is the graceful stop: Run stops reading, waits for in-flight
// acks until ctx ends, sends a final status update and returns nil. ctx
// ending is the hard stop: the wait for acks ends and so does Run.
func (s *Stream) Run(ctx context.Context, h Handler) error {
	hard := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.stopMu.Lock()
	s.stop = cancel
	if s.closed {
		cancel()
	}
	s.stopMu.Unlock()
	// Jitter (the default) keeps relays from reconnecting in step.
	b := backoff.Backoff{Policy: backoff.Policy{Initial: s.cfg.ReconnectMin, Max: s.cfg.ReconnectMax}}
	for {
		started := time.Now()
		err := s.session(ctx, hard, h)
		if ctx.Err() != nil {
			return nil
		}
		if fault.KindOf(err) == fault.Fatal {
			return err
		}
		if time.Since(started) > time.Minute {
			b.Reset() // the session was healthy for a while
		}
		sleep := b.Next()
		if errors.Is(err, ErrRestart) {
			s.log.Info().Dur("retry_in", sleep).Msg("restarting replication from the ack watermark")
		} else {
			s.metrics.reconnects.Inc()
			s.log.Warn().Err(err).Dur("retry_in", sleep).Msg("replication session ended; reconnecting")
		}
		if backoff.Sleep(ctx, sleep) != nil {
			return nil
		}
	}
}

// Close asks Run to stop gracefully (see Run). Idempotent, does not block;
// before Run it makes Run return at once.
func (s *Stream) Close() {
	s.stopMu.Lock()
	defer s.stopMu.Unlock()
	s.closed = true
	if s.stop != nil {
		s.stop()
	}
}

// session runs one replication connection from setup to end. ctx ends at
// Close; hard bounds the final wait for acks.
func (s *Stream) session(ctx, hard context.Context, h Handler) error {
	// Everything handed over in an earlier session must be acked before the
	// new one starts, so the start position covers it and nothing is sent
	// twice by the server.
	if err := s.progress.Drain(ctx); err != nil {
		return err
	}
	// Only a process that has never seen its slot may create it; a slot
	// that disappears mid-run is an operator error worth stopping for.
	info, err := s.prepare(ctx, s.cfg.Config, !s.slotSeen, s.identity, s.log)
	if err != nil {
		return err
	}
	s.slotSeen = true
	s.registry = info.Registry
	if s.OnPrepared != nil {
		s.OnPrepared(info)
	}
	if w := info.Registry.Warning; w != "" && !s.warned[w] {
		s.warned[w] = true
		s.log.Warn().Msg(w)
	}
	if info.Created {
		s.log.Warn().Bool("failover", info.Failover).Msg("created replication slot; outbox rows committed before now are not streamed (republish them from the table if needed)")
	}
	if info.FailoverSet {
		s.log.Info().Msg("turned failover on for the slot (postgres.slot_failover): standbys with sync_replication_slots keep a copy of it")
	}
	for _, w := range info.Warnings {
		if !s.warned[w] { // once per process and text: each session prepares again
			s.warned[w] = true
			s.log.Warn().Msg(w)
		}
	}
	var catchUp *catchUpReader
	conn, err := pg.ConnectReplication(ctx, s.cfg.URL, func(r io.Reader) io.Reader {
		c, br := newCatchUpReader(r)
		catchUp = c
		return br
	})
	if err != nil {
		return err
	}
	catchUp.onSocket(conn.Conn())
	s.catchUp = catchUp
	if err := s.checkSenderTimeout(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return err
	}
	if s.Fence != nil {
		// Just before taking the slot: a leader that lost its lease while
		// reconnecting must not grab the slot from its successor.
		if err := s.Fence.Check(ctx); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return err
		}
	}
	start, err := s.resume(ctx, conn)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return err
	}
	version := conn.ParameterStatus("server_version")
	args, ok, streamed, err := pluginArgs(s.cfg.Publication, version, s.Messages, s.cfg.Streaming)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return err
	}
	if streamed {
		s.metrics.streaming.Set(1)
	} else {
		s.metrics.streaming.Set(0)
	}
	if err := checkMessageEvents(s.MessagePrefix, version); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return err
	}
	if !ok && !s.oldWarned {
		s.oldWarned = true
		s.log.Warn().Str("server_version", version).
			Msg("PostgreSQL before 14 cannot stream messages: heartbeats are still written and time outbox_relay_lag_seconds through the ack watermark, but are not decoded")
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, start, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: args,
	})
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return fmt.Errorf("start replication on slot %q: slot is used by another process (pid %d); is another relay running? %w", s.cfg.Slot, info.ActivePID, err)
		}
		return fmt.Errorf("start replication on slot %q at %s: %w", s.cfg.Slot, start, err)
	}
	s.log.Info().Str("lsn", start.String()).Str("system_id", s.identity.SystemID).Int32("timeline", s.identity.Timeline).
		Bool("streaming", streamed).Msg("replication started")
	if uint64(start) > s.received.Load() {
		s.received.Store(uint64(start))
	}

	s.mu.Lock()
	s.conn = conn
	s.mu.Unlock()
	s.streaming.Store(true)
	// The pinger outlives ctx: it must keep answering during the final drain.
	pingCtx, stopPing := context.WithCancel(hard)
	pinged := make(chan struct{})
	go func() {
		defer close(pinged)
		s.pinger(pingCtx)
	}()
	defer func() {
		s.streaming.Store(false)
		s.finish(ctx, hard, func() { stopPing(); <-pinged })
	}()

	return s.loop(ctx, h)
}

// resume picks the session's start on conn (startFrom) and sets the
// progress to it. Nothing is in flight (the session drained first).
// Everything before the slot's confirmed position is durable downstream, so
// the watermark is at least that, and status updates never carry less than
// the server already has.
func (s *Stream) resume(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	cur, confirmed, end, err := identify(ctx, conn, s.cfg.Slot)
	if err != nil {
		return 0, err
	}
	s.serverEnd.Store(uint64(end)) // this server's, not a raise of the last session's
	prev, watermark := s.identity, s.progress.Flushed()
	start, why := startFrom(prev, cur, watermark, confirmed)
	switch why {
	case keepWatermark:
		s.progress.AdvanceIdle(confirmed)
	default:
		if err := s.progress.Reset(confirmed); err != nil {
			return 0, fmt.Errorf("resume slot %q from %s (%s): %w", s.cfg.Slot, confirmed, why, err)
		}
	}
	switch why {
	case historyChanged:
		s.metrics.historyChanges.Inc()
		s.log.Warn().Str("previous_system_id", prev.SystemID).Int32("previous_timeline", prev.Timeline).
			Str("system_id", cur.SystemID).Int32("timeline", cur.Timeline).
			Str("watermark", watermark.String()).Str("confirmed_flush_lsn", confirmed.String()).
			Msg("server history changed (failover, promoted replica or another cluster): discarding the in-memory ack watermark and resuming from the slot's confirmed position; events after it are published again")
	case slotBehind:
		// Usual after a lost connection (the last status updates never
		// arrived) or a PostgreSQL crash; also a slot put back by an operator.
		s.log.Info().Str("watermark", watermark.String()).Str("confirmed_flush_lsn", confirmed.String()).
			Msg("slot's confirmed position is behind the acked watermark: resuming from the slot, events acked after it are published again")
	}
	now := history.Now{Mark: history.Mark{SystemID: cur.SystemID, Timeline: cur.Timeline, Slot: s.cfg.Slot,
		SlotLSN: s.registry.SlotLSN, SlotXid: s.registry.SlotXid, Generation: s.registry.Generation},
		Raised: s.registry.Raised, Confirmed: confirmed, ServerEnd: end}
	if err := s.progress.Session(ctx, now); err != nil {
		return 0, fmt.Errorf("resume slot %q: %w", s.cfg.Slot, err)
	}
	s.identity = cur
	return start, nil
}

// checkSenderTimeout refuses a status interval that lets the walsender time
// the connection out.
func (s *Stream) checkSenderTimeout(ctx context.Context, conn *pgconn.PgConn) error {
	res, err := conn.Exec(ctx, "SHOW wal_sender_timeout").ReadAll()
	if err != nil || len(res) == 0 || len(res[0].Rows) == 0 {
		return fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	d, err := parsePGDuration(string(res[0].Rows[0][0]))
	if err != nil || d == 0 { // 0 disables the timeout
		return nil
	}
	if s.cfg.StatusInterval >= d/2 {
		return fault.Fatal.Wrap(fmt.Errorf("postgres.status_interval %s must be below wal_sender_timeout/2 (%s): lower it", s.cfg.StatusInterval, d/2))
	}
	return nil
}

// loop receives messages until ctx ends or the connection fails.
func (s *Stream) loop(ctx context.Context, h Handler) error {
	// Times are durations since base: time.Since reads only the monotonic
	// clock, time.Now the wall clock too (52-62 against 28-40 ns here, per WAL
	// message).
	base := time.Now()
	next := s.cfg.StatusInterval
	// heard is when the server last sent anything (or the handler last
	// finished: time blocked on backpressure is not silence). A connection
	// that stays silent past ReceiveTimeout although we asked for a reply is
	// dead even if TCP has not noticed (a cut network, a frozen server).
	var heard time.Duration
	handled := false
	timeout := max(s.cfg.ReceiveTimeout, 3*s.cfg.StatusInterval)
	// Reads wait on the socket's deadline, set once per status interval: a
	// context per ReceiveMessage costs pgconn a watcher, a timer and a
	// context for every WAL message. The end of ctx cuts the wait short.
	netConn := s.conn.Conn()
	stop := context.AfterFunc(ctx, func() { _ = netConn.SetReadDeadline(time.Now()) })
	defer stop()
	defer netConn.SetReadDeadline(time.Time{})
	var deadline time.Duration
	poll := confirmGap // when the loop next looks for a moved watermark
	for {
		if ctx.Err() != nil {
			return nil
		}
		if s.progress.Restarting() {
			return ErrRestart
		}
		// One clock read per WAL message for the checks below (and heard):
		// reading the clock four times was 4% of a drain's CPU, two 1.6%.
		now := time.Since(base)
		if handled {
			heard, handled = now, false // the clock read just after the handler
		}
		if silent := now - heard; silent > timeout {
			return fmt.Errorf("slot %q: no message from the server for %s (postgres.receive_timeout): connection presumed dead", s.cfg.Slot, silent.Round(time.Millisecond))
		}
		if now >= poll {
			// Every confirmGap the loop wakes to confirm a moved watermark
			// at once, not at the next status interval.
			poll = now + confirmGap
			if s.progress.Flushed() > s.lastConfirmed() {
				next = now
			}
		}
		if now >= next {
			s.mu.Lock()
			// Ask for a reply once the server has been quiet for a third of
			// the timeout, so an idle but healthy connection proves itself.
			err := s.sendStatus(now-heard > timeout/3)
			s.mu.Unlock()
			if err != nil {
				return err
			}
			next = time.Since(base) + s.cfg.StatusInterval
		}
		wake := min(next, poll)
		s.mu.Lock()
		if deadline != wake && ctx.Err() == nil {
			deadline = wake
			_ = netConn.SetReadDeadline(base.Add(wake))
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		s.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive from slot %q: %w", s.cfg.Slot, err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, h, m.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("slot %q: server error: %w", s.cfg.Slot, pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return fmt.Errorf("slot %q: server ended the replication stream", s.cfg.Slot)
		case *pgproto3.NoticeResponse:
			// before anything the server sent after it: see noticeError
			if err := noticeError(s.cfg, m, s.lastConfirmed(), time.Now()); err != nil {
				return err
			}
			s.log.Info().Str("severity", m.Severity).Str("code", m.Code).Str("notice", m.Message).Msg("server notice on the replication connection")
		default:
			s.log.Debug().Type("message", msg).Msg("unexpected message ignored")
		}
		handled = true // heard is the next clock read: time blocked on backpressure is not silence
	}
}

func (s *Stream) handleCopyData(ctx context.Context, h Handler, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		s.observe(ka.ServerWALEnd)
		// The walsender has read the WAL up to ServerWALEnd: a stream whose
		// last messages were far behind may have caught up since.
		s.track(ka.ServerWALEnd)
		// Every XLogData before this keepalive was handled on this goroutine,
		// so the progress can judge whether it is idle.
		s.progress.AdvanceIdle(ka.ServerWALEnd)
		if ka.ReplyRequested {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.sendStatus(false)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		s.observe(xld.WALStart)
		// Not xld.ServerWALEnd: a logical walsender sends WALStart there.
		s.track(xld.WALStart)
		if err := h(ctx, xld.WALStart, xld.WALData); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrRestart) {
				return err
			}
			return fault.Fatal.Wrap(fmt.Errorf("handle WAL at %s: %w", xld.WALStart, err))
		}
	}
	return nil
}

func (s *Stream) observe(lsn pglogrepl.LSN) {
	raise(&s.received, uint64(lsn))
	s.metrics.received.Set(float64(s.received.Load()))
}

// sendStatus sends a standby status update. Caller holds s.mu.
func (s *Stream) sendStatus(requestReply bool) error {
	if s.conn == nil || s.conn.IsClosed() {
		// After a receive error pgconn closes the connection from its own
		// goroutine; writing to it now would race with that close.
		return errors.New("replication connection is closed")
	}
	flushed := s.progress.Flushed()
	if flushed == 0 {
		return nil // pglogrepl would copy Write into a zero Flush: never confirm unacked data
	}
	if s.Fence != nil && !s.Fence.Valid() {
		return errFenced
	}
	write := max(s.Received(), flushed)
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write,
		WALFlushPosition: flushed,
		WALApplyPosition: flushed,
		ClientTime:       time.Now(),
		ReplyRequested:   requestReply,
	})
	if err != nil {
		return fmt.Errorf("send standby status (flush %s) on slot %q: %w", flushed, s.cfg.Slot, err)
	}
	s.metrics.confirmed.Set(float64(flushed))
	s.lastSentTime = time.Now()
	s.lastSentLSN = flushed
	return nil
}

// Confirmed is the Flush of the last status update sent (0 before the
// first); safe from any goroutine.
func (s *Stream) Confirmed() pglogrepl.LSN { return s.lastConfirmed() }

// lastConfirmed is the Flush of the last status update.
func (s *Stream) lastConfirmed() pglogrepl.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSentLSN
}

// pinger keeps status updates flowing while the loop is blocked in the
// handler (backpressure), so the walsender never times the connection out,
// and confirms promptly when the watermark moves meanwhile (a drain). While
// the loop reads, the loop confirms itself (its poll): only the holder
// of the connection touches it.
func (s *Stream) pinger(ctx context.Context) {
	t := time.NewTicker(s.cfg.StatusInterval)
	defer t.Stop()
	gap := time.NewTimer(0) // confirmGap since the last prompt update
	defer gap.Stop()
	var advanced <-chan struct{} = s.progress.Advanced()
	for {
		prompt := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-advanced:
			// Coalesce: wait out the gap since the last prompt update.
			select {
			case <-ctx.Done():
				return
			case <-gap.C:
			}
			gap.Reset(confirmGap)
			prompt = true
		}
		if !s.mu.TryLock() {
			continue // the loop holds the conn and confirms on its own deadline
		}
		due := time.Since(s.lastSentTime) >= s.cfg.StatusInterval
		if due || prompt && s.progress.Flushed() > s.lastSentLSN {
			if err := s.sendStatus(false); err != nil {
				s.log.Warn().Err(err).Msg("status update from pinger failed")
			}
		}
		s.mu.Unlock()
	}
}

// finish closes the session. At shutdown it first drains acks (bounded, the
// pinger answering meanwhile) and sends the final status update; after a
// connection error there is nothing to send on, and the next session drains.
// The tail after the drain (final status, CopyDone, close) is bounded by
// finishTimeout, whatever hard says: it must happen even at the deadline.
func (s *Stream) finish(ctx, hard context.Context, stopPing func()) {
	// A fenced leader does not wait for acks it may not confirm.
	if ctx.Err() != nil && (s.Fence == nil || s.Fence.Valid()) {
		if err := s.progress.Drain(hard); err != nil {
			s.log.Warn().Err(err).Msg("in-flight events not all acked before the shutdown deadline; they will be resent after restart")
		}
	}
	stopPing()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.sendStatus(false); err != nil {
		s.log.Info().Err(err).Msg("no final status update; the server resends from its confirmed position")
	} else if ctx.Err() == nil {
		// The connection failed or went silent: do not wait on it.
		s.log.Info().Str("lsn", s.progress.Flushed().String()).Msg("status update sent on a failing connection")
	} else {
		// Shutdown: end the COPY politely and read until the server ends it too:
		// closing a socket with unread data sends an RST, and the server
		// may then drop the status update still in its receive queue.
		_ = s.conn.Conn().SetDeadline(time.Now().Add(finishTimeout))
		if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), s.conn); err != nil {
			s.log.Warn().Err(err).Msg("replication did not end cleanly after the final status update; the server may resend from an earlier position")
		} else {
			s.log.Info().Str("lsn", s.progress.Flushed().String()).Msg("final status update sent")
		}
	}
	cctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	_ = s.conn.Close(cctx)
	s.conn = nil
}

// finishTimeout bounds the end of a session after the drain: the final
// status update and CopyDone, then the close (each).
const finishTimeout = time.Second

// parsePGDuration parses a SHOW result such as "60s", "500ms", "1min" or "0".
func parsePGDuration(v string) (time.Duration, error) {
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"ms", time.Millisecond}, {"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if len(v) > len(u.suffix) && v[len(v)-len(u.suffix):] == u.suffix {
			var n int64
			if _, err := fmt.Sscanf(v[:len(v)-len(u.suffix)], "%d", &n); err != nil {
				return 0, err
			}
			return time.Duration(n) * u.unit, nil
		}
	}
	var n int64
	if _, err := fmt.Sscanf(v, "%d", &n); err != nil {
		return 0, err
	}
	return time.Duration(n) * time.Millisecond, nil
}
