// Package standby keeps the relay from publishing a transaction that a
// standby which may be promoted has not flushed yet (postgres.standby_slots):
// such an event would be in Kafka but not in the promoted standby's history,
// a phantom event. It applies the rule PostgreSQL 17+ applies itself with
// synchronized_standby_slots, on any version: a transaction goes out once
// every named physical slot's restart_lsn (the flush position its standby
// reports) is at or past the transaction's end.
//
// A Gate polls the slots on a normal connection, quickly while a Wait
// blocks and slowly while none does. The leader's term runs one (Run) and
// the pipeline calls Wait before publishing each transaction, on the
// replication loop goroutine: blocking there is like backpressure, the
// stream keeps sending status updates meanwhile.
package standby

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/internal/metric"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// Timing of a Gate (not config keys: the defaults suit every setup seen).
const (
	// FastPoll is the pause between polls while a Wait blocks: the gate
	// adds at most about this plus a round trip once the standby flushed.
	FastPoll = 2 * time.Millisecond
	// IdlePoll is the pause between polls while nothing waits: they keep
	// the metrics current and often let the next Wait pass at once.
	IdlePoll = time.Second
	// StallAfter: a Wait blocked this long, or a slot missing, logical,
	// invalidated or inactive this long, makes the leader not ready and is
	// logged every LogEvery, naming the slot and the fix.
	StallAfter = 10 * time.Second
	LogEvery   = 10 * time.Second
)

const key = "postgres.standby_slots"

// Metrics are the gate's, one set per leadership term. Build with
// NewMetrics; safe for concurrent use.
type Metrics struct {
	wait       prometheus.Histogram
	lag        *prometheus.GaugeVec
	ready      *prometheus.GaugeVec
	pollErrors prometheus.Counter
}

// NewMetrics registers the metrics on reg (nil: unregistered). Any
// goroutine; does not block.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_relay_standby_wait_seconds",
			Help:    "Time each transaction waited before publishing for the standbys of postgres.standby_slots to flush it: the latency the gate adds (0 when they already had).",
			Buckets: []float64{0, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}),
		lag: metric.GaugeVec("outbox_relay_standby_lag_bytes",
			"pg_current_wal_lsn() - restart_lsn of each slot of postgres.standby_slots: WAL its standby has not flushed.", "slot"),
		ready: metric.GaugeVec("outbox_relay_standby_slot_ready",
			"1 while a slot of postgres.standby_slots is an active physical slot; 0 while it is missing, logical, invalidated or inactive (the relay then waits once the standby is behind).", "slot"),
		pollErrors: metric.Counter("outbox_relay_standby_poll_errors_total",
			"Failed reads of the slots of postgres.standby_slots (a failed connect counts too); meanwhile transactions the standbys are not known to have wait."),
	}
	metric.Register(reg, m.wait, m.lag, m.ready, m.pollErrors)
	return m
}

// poll reads the named slots on conn.
type poll func(ctx context.Context, conn *pgx.Conn, slots []string) ([]pgsetup.StandbySlot, error)

func readSlots(ctx context.Context, conn *pgx.Conn, slots []string) ([]pgsetup.StandbySlot, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return pgsetup.ReadStandbySlots(qctx, conn, slots)
}

// Gate holds transactions back until the standbys have them. New, then
// Run once on its own goroutine; Wait and Ready from any goroutine.
type Gate struct {
	url   string
	slots []string
	log   zerolog.Logger
	m     *Metrics
	now   func() time.Time
	fast  time.Duration
	idle  time.Duration

	// covered: at the last poll every slot had flushed this far (0 while
	// one is missing, logical or invalidated). Waits compare against it.
	covered atomic.Uint64
	waiting atomic.Int32
	wake    chan struct{} // a Wait began: poll now

	mu        sync.Mutex
	polled    chan struct{} // closed at the end of each poll, then replaced
	last      []pgsetup.StandbySlot
	lastPoll  time.Time
	pollErr   error       // of the last poll; nil after a success
	badSince  []time.Time // per slot: since when it has its problem; zero while fine
	waitSince time.Time   // since when a Wait blocks; zero while none does
	waitLSN   pglogrepl.LSN
	logged    time.Time // the last stall log line
}

// New allocates a gate for slots (postgres.standby_slots, not empty) on
// the server at url; it does not connect. m may be nil (unregistered).
func New(url string, slots []string, log zerolog.Logger, m *Metrics) *Gate {
	if m == nil {
		m = NewMetrics(nil)
	}
	g := &Gate{url: url, slots: append([]string(nil), slots...), m: m, now: time.Now, fast: FastPoll, idle: IdlePoll,
		log:  log.With().Str("component", "standby").Strs("standby_slots", slots).Logger(),
		wake: make(chan struct{}, 1), polled: make(chan struct{}), badSince: make([]time.Time, len(slots))}
	for _, s := range slots {
		g.m.ready.WithLabelValues(s).Set(0)
	}
	return g
}

// TxnLSN is the position txn must be flushed to before it goes out: its
// end. A chunk of a transaction not yet complete (Partial) has no end yet,
// only its commit record's start: the standby must be past it, which it is
// once it flushed the commit record but for one that a flush cut in the
// middle (the next chunk then waits for the end). Pure.
func TxnLSN(txn *decoder.Txn) pglogrepl.LSN {
	if txn.Partial || txn.EndLSN == 0 {
		return txn.CommitLSN + 1
	}
	return txn.EndLSN
}

// WaitTxn is Wait for txn's position (TxnLSN); a transaction without
// events publishes nothing and passes at once. Blocks like Wait.
func (g *Gate) WaitTxn(ctx context.Context, txn *decoder.Txn) error {
	if len(txn.Events) == 0 {
		return nil
	}
	return g.Wait(ctx, TxnLSN(txn))
}

// Wait returns once every standby slot has flushed lsn, or with ctx's
// error when ctx ends first. It never returns earlier: a slot that is
// missing, logical, invalidated or inactive keeps it waiting (logged every
// LogEvery after StallAfter). Any goroutine; blocks.
func (g *Gate) Wait(ctx context.Context, lsn pglogrepl.LSN) error {
	if pglogrepl.LSN(g.covered.Load()) >= lsn {
		g.m.wait.Observe(0)
		return nil
	}
	start := g.now()
	g.mu.Lock()
	if g.waiting.Add(1) == 1 {
		g.waitSince, g.waitLSN = start, lsn
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if g.waiting.Add(-1) == 0 {
			g.waitSince = time.Time{}
		}
		g.mu.Unlock()
	}()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	for {
		g.mu.Lock()
		polled := g.polled
		g.mu.Unlock()
		// After taking polled: a poll ending now closes it, so none is missed.
		if pglogrepl.LSN(g.covered.Load()) >= lsn {
			g.m.wait.Observe(g.now().Sub(start).Seconds())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the standbys of %s (%s) to flush LSN %s: %w", key, strings.Join(g.slots, ", "), lsn, ctx.Err())
		case <-polled:
		}
	}
}

// Ready reports whether the gate lets transactions through: false, with
// the slot and why, once a Wait has blocked StallAfter or a slot has been
// missing, logical, invalidated or inactive that long. Any goroutine.
func (g *Gate) Ready() (bool, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	for i, since := range g.badSince {
		if !since.IsZero() && now.Sub(since) >= StallAfter && i < len(g.last) {
			return false, fmt.Sprintf("leader: %s: %s for %s", key, g.last[i].Describe(), now.Sub(since).Round(time.Second))
		}
	}
	if !g.waitSince.IsZero() && now.Sub(g.waitSince) >= StallAfter {
		return false, fmt.Sprintf("leader: waiting %s for the standbys of %s to flush LSN %s before publishing: %s",
			now.Sub(g.waitSince).Round(time.Second), key, g.waitLSN, g.behind())
	}
	return true, ""
}

// behind describes the slots that hold the waiting transaction back, or
// the poll error. Caller holds mu.
func (g *Gate) behind() string {
	if g.pollErr != nil {
		return "cannot read the slots: " + g.pollErr.Error()
	}
	var out []string
	for _, s := range g.last {
		if s.Problem() != "" || s.Flushed < g.waitLSN {
			out = append(out, s.Describe())
		}
	}
	if len(out) == 0 {
		return "no poll yet"
	}
	return strings.Join(out, "; ")
}

// Run polls until ctx ends, then returns nil. A failed poll is counted,
// logged once per outage, and retried on a new connection with backoff;
// meanwhile Waits keep waiting. Call once; blocks.
func (g *Gate) Run(ctx context.Context) error {
	g.run(ctx, func(ctx context.Context) (*pgx.Conn, error) { return pg.Connect(ctx, g.url) }, readSlots)
	return nil
}

// RunWith is Run reading the slots with read instead of a connection of
// its own (a test's fake, or a program that polls its own way).
func (g *Gate) RunWith(ctx context.Context, read func(ctx context.Context) ([]pgsetup.StandbySlot, error)) {
	// The Keeper hands its job a nil connection: read needs none.
	g.run(ctx, func(context.Context) (*pgx.Conn, error) { return nil, nil },
		func(ctx context.Context, _ *pgx.Conn, _ []string) ([]pgsetup.StandbySlot, error) { return read(ctx) })
}

func (g *Gate) run(ctx context.Context, connect func(context.Context) (*pgx.Conn, error), read poll) {
	pg.NewKeeper(pg.KeeperConfig{
		Connect: connect,
		// The pause after each poll; the job itself waits while idle.
		Every:  g.fast,
		Retry:  backoff.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second},
		Errors: g.m.pollErrors,
		Failed: func(f pg.Failure) {
			g.polledWith(nil, f.Err)
			if f.First {
				g.log.Warn().Err(f.Err).Dur("retry_in", f.Wait).Msg("cannot read the standby slots: transactions wait until they are read again (outbox_relay_standby_poll_errors_total)")
			}
		},
		Recovered: func() { g.log.Info().Msg("standby slots read again") },
	}).Run(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		if !g.due(ctx) {
			return nil // ctx ended
		}
		slots, err := read(ctx, conn, g.slots)
		if err != nil {
			return err // Failed reports it
		}
		g.polledWith(slots, nil)
		return nil
	})
}

// due waits until a poll is due: at once while a Wait blocks, else when
// IdlePoll passed since the last poll or a Wait begins. False when ctx
// ended.
func (g *Gate) due(ctx context.Context) bool {
	if g.waiting.Load() > 0 {
		return true
	}
	g.mu.Lock()
	next := g.lastPoll.Add(g.idle).Sub(g.now())
	g.mu.Unlock()
	if next <= 0 {
		return true
	}
	t := time.NewTimer(next)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-g.wake:
	case <-t.C:
	}
	return true
}

// polledWith records a poll's outcome (slots, or err), wakes the Waits and
// logs a stall every LogEvery.
func (g *Gate) polledWith(slots []pgsetup.StandbySlot, err error) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lastPoll, g.pollErr = now, err
	if err == nil {
		g.last = slots
		g.covered.Store(uint64(Covered(slots)))
		for i, s := range slots {
			switch {
			case s.Problem() == "":
				g.badSince[i] = time.Time{}
				g.m.ready.WithLabelValues(s.Name).Set(1)
			case g.badSince[i].IsZero():
				g.badSince[i] = now
				fallthrough
			default:
				g.m.ready.WithLabelValues(s.Name).Set(0)
			}
			if s.LagBytes != nil {
				g.m.lag.WithLabelValues(s.Name).Set(float64(*s.LagBytes))
			}
		}
	}
	close(g.polled)
	g.polled = make(chan struct{})
	g.logStall(now)
}

// logStall logs, every LogEvery, each slot with a problem for StallAfter
// and a Wait blocked that long. Caller holds mu.
func (g *Gate) logStall(now time.Time) {
	if now.Sub(g.logged) < LogEvery {
		return
	}
	stalled := false
	for i, since := range g.badSince {
		if since.IsZero() || now.Sub(since) < StallAfter || i >= len(g.last) {
			continue
		}
		s := g.last[i]
		stalled = true
		g.log.Warn().Str("slot", s.Name).Str("problem", s.Problem()).Dur("for", now.Sub(since).Round(time.Second)).
			Msg(fmt.Sprintf("%s: %s: the relay publishes nothing this standby has not flushed, so it waits once the standby is behind; %s",
				key, s.Describe(), pgsetup.StandbyFix(key, s.Name, s.Problem())))
	}
	if !g.waitSince.IsZero() && now.Sub(g.waitSince) >= StallAfter {
		stalled = true
		ev := g.log.Warn().Str("lsn", g.waitLSN.String()).Dur("waiting", now.Sub(g.waitSince).Round(time.Second))
		if g.pollErr != nil {
			ev = ev.Err(g.pollErr)
		}
		ev.Msg(fmt.Sprintf("not publishing: waiting for the standbys of %s to flush the next transaction: %s; %s",
			key, g.behind(), g.fixes()))
	}
	if stalled {
		g.logged = now
	}
}

// fixes names what to do about the slots holding the wait. Caller holds mu.
func (g *Gate) fixes() string {
	var out []string
	for _, s := range g.last {
		if s.Problem() != "" || s.Flushed < g.waitLSN {
			out = append(out, s.Name+": "+pgsetup.StandbyFix(key, s.Name, s.Problem()))
		}
	}
	if len(out) == 0 {
		return "check that the relay reaches PostgreSQL (postgres.url)"
	}
	return strings.Join(out, "; ")
}

// Covered is how far every slot has flushed: the least restart_lsn, or 0
// when a slot is missing, logical or invalidated (it cannot vouch for
// anything). An inactive slot still vouches for what it flushed before its
// standby went away, as with synchronized_standby_slots. Pure.
func Covered(slots []pgsetup.StandbySlot) pglogrepl.LSN {
	var low pglogrepl.LSN
	for i, s := range slots {
		switch s.Problem() {
		case pgsetup.SlotMissing, pgsetup.SlotLogical, pgsetup.SlotInvalidated:
			return 0
		}
		if i == 0 || s.Flushed < low {
			low = s.Flushed
		}
	}
	return low
}
