package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// SampleInterval is how often the leader samples the delivery horizon. Not
// a config key: the rule does not depend on it, only how soon rows are
// proven.
const SampleInterval = 5 * time.Second

// UndeliveredCap bounds outbox_relay_undelivered_events' count query.
const UndeliveredCap = 1_000_000

// keptDeadLetter is true for a row dead-lettered and not yet resolved:
// `outbox-relay dlq replay` reads it from the table, so retention keeps it
// until `dlq replay` or `dlq resolve` marks it resolved.
const keptDeadLetter = "(o." + outboxschema.ColDeadLetteredAt + " IS NOT NULL AND o." + outboxschema.ColDLQResolvedAt + " IS NULL)"

// Removable is the condition on outbox row o (with the CTE c of With) that
// retention removes it: older than the cut-off bound to cutoff, delivered
// (DeliveredCond with floor and delivered), and not an unresolved dead
// letter.
func Removable(cutoff, floor, delivered string) string {
	return "o.created_at < " + cutoff + " AND " + DeliveredCond(floor, delivered) + " AND NOT " + keptDeadLetter
}

// DeleteBatchSQL is one retention batch on outbox t (partitioned or
// plain: then read with ONLY, see pgsetup.FromItem): the oldest removable
// rows, at most $4 of them, created before now() - $1 seconds, proven with
// floor $2 and delivered $3 (State.Args). The condition is checked again
// on the rows the DELETE locks, so a row updated meanwhile is judged by
// its new version. With archive (a quoted name) and cols (quoted,
// comma-separated) the deleted rows are inserted there in the same
// statement. Exec it; RowsAffected is the rows removed.
func DeleteBatchSQL(t outboxschema.Table, partitioned bool, archive, cols string) string {
	from := pgsetup.FromItem(t, partitioned)
	cond := Removable("now() - make_interval(secs => $1)", "$2", "$3")
	del := "DELETE FROM " + from + " o USING c WHERE (o.id, o.created_at) IN (SELECT o.id, o.created_at FROM " + from + " o, c WHERE " +
		cond + " ORDER BY o.created_at LIMIT $4) AND " + cond
	if archive == "" {
		return With(t.Quoted()) + del
	}
	return With(t.Quoted()) + ", d AS (" + del + " RETURNING " + prefixed("o.", cols) + ") INSERT INTO " + archive + " (" + cols + ") SELECT " + cols + " FROM d"
}

func prefixed(p, cols string) string {
	out := ""
	for i, c := range splitCols(cols) {
		if i > 0 {
			out += ", "
		}
		out += p + c
	}
	return out
}

// DryRunSQL counts, among the rows of outbox t created before now() - $1
// seconds, those retention would remove and why the others stay: unresolved
// dead letters, written into a partition before it was attached (never
// streamed: replay them), below the slot's floor $4 (written before the
// slot existed: replay them), or not yet below the delivered horizon.
func DryRunSQL(t outboxschema.Table, partitioned bool) string {
	w := widened
	notDelivered := "NOT " + keptDeadLetter + " AND NOT " + DeliveredCond("$2", "$3")
	return With(t.Quoted()) + "SELECT count(*) FILTER (WHERE " + DeliveredCond("$2", "$3") + " AND NOT " + keptDeadLetter + "),\n" +
		"count(*) FILTER (WHERE " + keptDeadLetter + "),\n" +
		"count(*) FILTER (WHERE " + notDelivered + " AND NOT " + unstreamed + " AND " + w + " < $4),\n" +
		"count(*) FILTER (WHERE " + notDelivered + " AND NOT " + unstreamed + " AND " + w + " >= $4),\n" +
		"count(*) FILTER (WHERE " + notDelivered + " AND " + unstreamed + ")\n" +
		"FROM " + pgsetup.FromItem(t, partitioned) + " o, c WHERE o.created_at < now() - make_interval(secs => $1)"
}

// Report is what one retention run did (or, dry, would do).
type Report struct {
	State State
	Slot  Slot
	// Deleted rows (archived rows included), DroppedPartitions their names.
	Deleted           int64
	DroppedPartitions []string
	// Dry run: rows older than keep that would go, and those that stay.
	Removable, DeadLetters, BelowFloor, AboveHorizon, Unstreamed int64
	// Dry run of a partitioned outbox: the partitions past keep, each
	// with what a run would do and why.
	Partitions []PartitionVerdict
}

// ErrKeepForever is returned by Once when retention.keep is 0.
var ErrKeepForever = errors.New("retention.keep is 0: rows are kept for ever, nothing to clean up (set retention.keep, e.g. 168h)")

// PausedError is returned by Once while retention is paused.
type PausedError struct{ Reason string }

func (e *PausedError) Error() string { return "retention is paused: " + e.Reason }

// Cleaner is the leader's retention loop: every SampleInterval it advances
// the delivery horizon and refreshes the metrics; every retention.interval
// it removes delivered rows older than retention.keep, in bounded batches.
// New allocates; Run works until ctx ends; Close stops Run. Run keeps its
// connection on a pg.Keeper: a database error is logged (Warn, each
// time), counted (outbox_relay_retention_errors_total), and retried on a
// new connection after a backoff of 1s doubling to 1m: it never stops the
// relay.
type Cleaner struct {
	cfg     Config
	h       Horizon
	connect func(context.Context) (*pgx.Conn, error)
	m       *Metrics
	log     zerolog.Logger

	closing   chan struct{}
	closeOnce sync.Once
	started   time.Time
	lastPause string // the paused_reason report last logged; Run's goroutine
}

// New validates cfg and allocates. connect opens a normal (not
// replication) connection to the outbox's database (Run gives it 15s); m
// may be nil; connect may be nil when only Once is called. Any goroutine;
// does not block.
func New(cfg Config, h Horizon, connect func(context.Context) (*pgx.Conn, error), m *Metrics, log zerolog.Logger) (*Cleaner, error) {
	if err := cfg.Validate("retention."); err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Cleaner{cfg: cfg, h: h, connect: connect, m: m, log: log.With().Str("component", "retention").Logger(),
		closing: make(chan struct{})}, nil
}

// Close stops Run. Idempotent; does not block.
func (c *Cleaner) Close() { c.closeOnce.Do(func() { close(c.closing) }) }

// Run samples and cleans until ctx ends or Close, then zeroes the gauges
// (a standby exports 0) and returns nil. Only the leader runs it, once per
// Cleaner, on a goroutine of its term; it blocks.
func (c *Cleaner) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer c.m.zero()
	c.started = time.Now()
	c.log.Info().Str("retention", c.cfg.Describe()).Msg("delivery horizon and retention started (leader)")
	var lastRun time.Time
	pg.NewKeeper(pg.KeeperConfig{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			cn, err := c.connect(cctx)
			if err != nil {
				return nil, fmt.Errorf("connect: %w", err)
			}
			return cn, nil
		},
		Every:  SampleInterval,
		Retry:  backoff.Policy{Initial: time.Second, Max: time.Minute},
		Errors: c.m.sampleErrors,
		Failed: func(f pg.Failure) {
			c.log.Warn().Err(f.Err).Dur("retry_in", f.Wait).Msg("retention: database error; the relay goes on")
		},
	}).Run(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		st, err := c.sample(ctx, conn)
		if err != nil {
			return err
		}
		if c.cfg.Keep == 0 || time.Since(lastRun) < c.cfg.Interval || st.PausedReason != "" || !st.Proven() {
			return nil
		}
		lastRun = time.Now()
		rep, err := c.run(ctx, conn, st, true)
		if rep.Deleted > 0 || len(rep.DroppedPartitions) > 0 {
			c.log.Info().Int64("deleted", rep.Deleted).Strs("dropped_partitions", rep.DroppedPartitions).Msg("retention run")
		}
		return err
	})
	return nil
}

// report logs a change of the pause: a publication that stopped streaming
// the outbox whole at Error (every insert since is streamed stripped or
// not at all, and the relay cannot publish it right), any other pause at
// Warn, the end of a pause at Info. Run's goroutine.
func (c *Cleaner) report(reason string) {
	if reason == c.lastPause {
		return
	}
	switch {
	case strings.HasPrefix(reason, PublicationPause):
		c.log.Error().Str("reason", reason).Msg("retention paused: the publication drops or strips outbox inserts; fix it with the SQL in the reason")
	case reason != "":
		c.log.Warn().Str("reason", reason).Msg("retention paused")
	default:
		c.log.Info().Str("was", c.lastPause).Msg("retention resumed")
	}
	c.lastPause = reason
}

// sample advances the horizon and refreshes the metrics. The undelivered
// count waits up to ProofWait for the slot to confirm past its snapshot.
func (c *Cleaner) sample(ctx context.Context, conn *pgx.Conn) (State, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, _, err := c.h.Advance(qctx, conn)
	if err != nil {
		return st, err
	}
	if st.PausedReason != "" {
		c.m.paused.Set(1)
	} else {
		c.m.paused.Set(0)
	}
	c.report(st.PausedReason)
	if st.Proven() {
		c.m.horizonAge.Set(time.Since(st.DeliveredAt).Seconds())
	} else {
		c.m.horizonAge.Set(time.Since(c.started).Seconds())
	}
	n, err := c.h.Count(qctx, conn, st, UndeliveredCap, ProofWait)
	if err != nil {
		return st, err
	}
	c.m.undelivered.Set(float64(n.N))
	if n.Exact {
		c.m.undeliveredExact.Set(1)
	} else {
		c.m.undeliveredExact.Set(0)
	}
	oldest, ok, err := c.h.OldestRow(qctx, conn)
	if err != nil {
		return st, err
	}
	if ok {
		c.m.oldestAge.Set(max(time.Since(oldest).Seconds(), 0))
	} else {
		c.m.oldestAge.Set(0)
	}
	return st, nil
}

// Once is `outbox-relay cleanup`: one Advance, then the retention run now
// (or, with dryRun, the counts of what would go and what stays). It
// refuses with ErrKeepForever or a *PausedError. Safe beside a running
// relay: the horizon only moves forward on proof, and each batch re-checks
// its rows. It blocks on conn (the caller's, not Run's), which the caller
// must not use from another goroutine meanwhile.
func (c *Cleaner) Once(ctx context.Context, conn *pgx.Conn, dryRun bool) (Report, error) {
	if c.cfg.Keep == 0 {
		return Report{}, ErrKeepForever
	}
	st, slot, err := c.h.Advance(ctx, conn)
	rep := Report{State: st, Slot: slot}
	if err != nil {
		return rep, err
	}
	if st.PausedReason != "" {
		return rep, &PausedError{Reason: st.PausedReason}
	}
	if dryRun {
		parted, err := isPartitioned(ctx, conn, c.h.Table)
		if err != nil {
			return rep, err
		}
		floor, upto := st.Args()
		err = conn.QueryRow(ctx, DryRunSQL(c.h.Table, parted), c.cfg.Keep.Seconds(), floor, upto, int64(st.FloorXID)).
			Scan(&rep.Removable, &rep.DeadLetters, &rep.BelowFloor, &rep.AboveHorizon, &rep.Unstreamed)
		if err != nil {
			return rep, fmt.Errorf("count the rows of %s older than %s: %w", c.h.Table, c.cfg.Keep, err)
		}
		if parted {
			rep.Partitions, err = c.partitionVerdicts(ctx, conn, st)
		}
		return rep, err
	}
	r, err := c.run(ctx, conn, st, false)
	r.State, r.Slot = st, slot
	return r, err
}

// run is one retention run: partition upkeep and drops (a partitioned
// outbox), then batches of row deletes until one removes fewer than
// batch_size rows. sampling: keep sampling the horizon every
// SampleInterval between batches (the relay's loop).
func (c *Cleaner) run(ctx context.Context, conn *pgx.Conn, st State, sampling bool) (Report, error) {
	var rep Report
	defer func() { c.m.deleted.Add(float64(rep.Deleted)) }()
	parted, err := isPartitioned(ctx, conn, c.h.Table)
	if err != nil {
		return rep, err
	}
	var arch *archive
	if c.cfg.Archive {
		if arch, err = ensureArchive(ctx, conn, c.h.Table, c.log); err != nil {
			return rep, err
		}
	}
	if parted {
		if err := c.keepAhead(ctx, conn); err != nil {
			c.log.Warn().Err(err).Msg("retention: cannot create the partitions ahead; the default partition takes the rows meanwhile")
		}
		dropped, rows, err := c.dropPartitions(ctx, conn, st, arch)
		rep.DroppedPartitions, rep.Deleted = dropped, rows
		if err != nil {
			return rep, err
		}
	}
	var sql string
	if arch == nil {
		sql = DeleteBatchSQL(c.h.Table, parted, "", "")
	} else {
		sql = DeleteBatchSQL(c.h.Table, parted, arch.name, arch.cols)
	}
	floor, upto := st.Args()
	sampled := time.Now()
	if arch != nil {
		if err := arch.ensureMonths(ctx, conn, pgsetup.FromItem(c.h.Table, parted), c.log); err != nil {
			return rep, err
		}
	}
	for ctx.Err() == nil {
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		tag, err := conn.Exec(bctx, sql, c.cfg.Keep.Seconds(), floor, upto, c.cfg.BatchSize)
		cancel()
		if err != nil {
			return rep, fmt.Errorf("delete delivered rows of %s older than %s: %w", c.h.Table, c.cfg.Keep, err)
		}
		rep.Deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(c.cfg.BatchSize) {
			break
		}
		if sampling && time.Since(sampled) >= SampleInterval {
			sampled = time.Now()
			nst, err := c.sample(ctx, conn)
			if err != nil {
				return rep, err
			}
			if nst.PausedReason != "" {
				break
			}
			floor, upto = nst.Args()
		}
	}
	_, err = conn.Exec(context.WithoutCancel(ctx), "UPDATE "+c.h.delivery()+" SET last_run_at = now(), last_deleted = $2 WHERE slot_name = $1", c.h.Slot, rep.Deleted)
	if err != nil {
		return rep, fmt.Errorf("record the retention run in %s: %w", c.h.delivery(), err)
	}
	return rep, nil
}

// Summary is the cleanup command's report, in words.
func (r Report) Summary(t outboxschema.Table, cfg Config, dryRun bool) string {
	var b strings.Builder
	horizon := "no delivered horizon yet (the slot has not confirmed past a sample): only rows with published_at set are proven"
	if r.State.Proven() {
		horizon = fmt.Sprintf("delivered horizon: transactions below xid %d, sampled at %s (floor xid %d)",
			r.State.DeliveredXID, r.State.DeliveredAt.UTC().Format(time.RFC3339), r.State.FloorXID)
	}
	fmt.Fprintf(&b, "%s\n", horizon)
	if !dryRun {
		fmt.Fprintf(&b, "removed %d rows of %s older than %s", r.Deleted, t, cfg.Keep)
		if cfg.Archive {
			fmt.Fprintf(&b, " (moved to %s)", ArchiveTable(t))
		}
		if len(r.DroppedPartitions) > 0 {
			fmt.Fprintf(&b, ", dropping %d partitions: %s", len(r.DroppedPartitions), strings.Join(r.DroppedPartitions, ", "))
		}
		b.WriteString("\n")
		return b.String()
	}
	fmt.Fprintf(&b, "dry run: %d rows of %s older than %s would be removed\n", r.Removable, t, cfg.Keep)
	if n := r.BelowFloor + r.AboveHorizon; n > 0 {
		fmt.Fprintf(&b, "%d rows older than keep are not proven delivered: %d below the slot's floor (written before the slot existed: `outbox-relay replay` them), %d newer than the delivered horizon (the relay has not confirmed past them yet)\n",
			n, r.BelowFloor, r.AboveHorizon)
	}
	if r.Unstreamed > 0 {
		fmt.Fprintf(&b, "%d rows older than keep were written into a partition before it was attached to %s: the slot never streamed them, so they are kept until `outbox-relay replay` publishes them\n", r.Unstreamed, t)
	}
	if r.DeadLetters > 0 {
		fmt.Fprintf(&b, "%d rows older than keep are unresolved dead letters, kept until `outbox-relay dlq replay` or `dlq resolve`\n", r.DeadLetters)
	}
	for _, p := range r.Partitions {
		fmt.Fprintf(&b, "%s\n", p)
	}
	return b.String()
}
