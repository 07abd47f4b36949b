package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/sink"
)

// CommitLSN is the pg_lsn header of a replayed record: a row read from the
// table has no commit LSN (the relay's records carry the transaction's).
const CommitLSN = "0/0"

// Deps are what a Replayer takes from its host program.
type Deps struct {
	Log zerolog.Logger
	// Progress gets a live line (rows done/total, rate, ETA) every second
	// when Terminal is true; otherwise progress is an info log line every
	// LogEvery. nil: no live line.
	Progress io.Writer
	Terminal bool
	LogEvery time.Duration // default 5s
	PageSize int           // rows per SELECT; default 500
	// Encoder writes each record in its topic's format, as the relay does
	// (*encode.Stage: serialization, envelope); nil: the payload as it is.
	Encoder Encoder
}

// Encoder writes a routed record in its topic's format (*encode.Stage): a
// refused event comes back with its dead-letter reason, an error without
// one is ctx's.
type Encoder interface {
	Encode(ctx context.Context, m *sink.Message, ev *decoder.Event) (reason string, err error)
}

// Summary is what a replay did.
type Summary struct {
	Total        int64 // rows in the range when it started (count(*))
	Read         int64 // rows read
	Published    int64 // rows acked by Kafka on their topic
	DeadLettered int64 // poison rows whose dead letter Kafka acked
	Failed       int64 // rows neither published nor dead-lettered
	Marked       int64 // published rows whose published_at was set
	Elapsed      time.Duration
}

// Replayer is one replay. New, then Run once, from one goroutine.
type Replayer struct {
	cfg    Config
	opts   Options
	deps   Deps
	table  outboxschema.Table
	from   string // the FROM item of the rows the slot streams (pgsetup.From): ONLY for a plain table; set by plan
	policy record.Policy
	router *sink.Router
	dec    *decoder.Decoder
	log    zerolog.Logger

	pub interface {
		Publish(context.Context, *sink.Message) error
	}
	budget  *budget
	retries chan retry
	marks   markQueue
	stop    context.CancelFunc // stops reading (a halt)
	reading context.Context    // the reader's: ends with Run's ctx or a halt
	lim     *limiter           // --rate; nil: unlimited
	// mark is the outbox_replay header of every record: the start of Run,
	// RFC 3339 UTC, so a consumer tells a replayed copy (and which replay
	// it came from) from the first delivery, whose event_id it shares.
	mark string

	total, read, published, dead, failed, marked atomic.Int64
	errMu                                        sync.Mutex
	errs                                         []error // rows that failed for good; the first few
}

// New validates and allocates; it does no I/O.
func New(cfg Config, opts Options, deps Deps) (*Replayer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.FromID == 0 && opts.Since.IsZero() {
		return nil, errors.New("replay: one of --since or --from-id is required")
	}
	tbl, err := outboxschema.ParseTable(cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("postgres.table: %w", err)
	}
	tmpl, err := sink.ParseTemplate(cfg.Kafka.TopicTemplate)
	if err != nil {
		return nil, fmt.Errorf("kafka.topic_template: %w", err)
	}
	allow, err := sink.ParseAllowlist(cfg.Kafka.TopicAllowlist)
	if err != nil {
		return nil, fmt.Errorf("kafka.topic_allowlist: %w", err)
	}
	router, err := sink.NewRouter(tmpl, cfg.Kafka.MaxTopics, allow, cfg.Policy.Topic)
	if err != nil {
		return nil, err
	}
	dec, err := decoder.New(cfg.Table)
	if err != nil {
		return nil, err
	}
	if deps.LogEvery <= 0 {
		deps.LogEvery = 5 * time.Second
	}
	if deps.PageSize <= 0 {
		deps.PageSize = 500
	}
	return &Replayer{cfg: cfg, opts: opts, deps: deps, table: tbl, router: router, dec: dec,
		log:     deps.Log.With().Str("component", "replay").Logger(),
		policy:  cfg.Policy,
		budget:  newBudget(cfg.MaxEvents, cfg.MaxBytes),
		retries: make(chan retry, cfg.MaxEvents+1),
	}, nil
}

// Run replays the range: count, read page by page, publish, wait for every
// ack, set published_at on the acked rows. It returns nil only when every
// row was published or dead-lettered and marked; the summary either way.
// ctx ending stops reading; acks are then awaited for at most
// shutdown_timeout.
func (r *Replayer) Run(ctx context.Context) (Summary, error) {
	start := time.Now()
	r.mark = start.UTC().Format(time.RFC3339)
	sum := func() Summary {
		return Summary{Total: r.total.Load(), Read: r.read.Load(), Published: r.published.Load(), DeadLettered: r.dead.Load(),
			Failed: r.failed.Load(), Marked: r.marked.Load(), Elapsed: time.Since(start)}
	}
	pc, err := pgxpool.ParseConfig(r.cfg.PostgresURL)
	if err != nil {
		return sum(), errors.New("postgres.url: cannot be parsed as a PostgreSQL connection string or URL")
	}
	pc.MaxConns = 2
	pc.ConnConfig.ConnectTimeout = 10 * time.Second
	db, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return sum(), fmt.Errorf("open postgres pool: %w", err)
	}
	defer db.Close()
	store, err := deadletter.Open(ctx, r.cfg.PostgresURL, r.table.Schema, r.table.Name)
	if err != nil {
		return sum(), err
	}
	defer store.Close()

	q, lo, hi, err := r.plan(ctx, db)
	if err != nil {
		return sum(), err
	}
	r.log.Info().Str("table", r.table.String()).Str("range", r.opts.Describe()).Int64("from_id", lo).Int64("to_id", hi).Str(outboxschema.HeaderReplay, r.mark).
		Int64("rows", r.total.Load()).Float64("rate", r.opts.Rate).Msg("replay starting")
	if r.total.Load() == 0 {
		r.log.Info().Msg("replay done: no rows in the range")
		return sum(), nil
	}

	// hard ends the waits for acks: shutdown_timeout after ctx ends.
	hard, stopHard := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHard()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, stopHard) })()
	producer, err := sink.New(r.cfg.Kafka, r.deps.Log, nil)
	if err != nil {
		return sum(), err
	}
	r.pub = producer
	prodDone := make(chan error, 1)
	go func() { prodDone <- producer.Run(hard) }()
	select {
	case <-producer.Ready():
	case err := <-prodDone:
		if err == nil {
			err = ctx.Err()
		}
		return sum(), fmt.Errorf("connect to kafka: %w", err)
	case <-ctx.Done():
		producer.Close()
		<-prodDone
		return sum(), fmt.Errorf("replay interrupted before kafka was reachable: %w", ctx.Err())
	}

	reading, stop := context.WithCancel(ctx)
	defer stop()
	r.stop, r.reading, r.lim = stop, reading, newLimiter(r.opts.Rate)
	var wg sync.WaitGroup
	wg.Add(3)
	quit := make(chan struct{})
	go func() { defer wg.Done(); r.retryLoop(hard, quit) }()
	markDone := make(chan struct{})
	go func() { defer wg.Done(); defer close(markDone); r.markLoop(hard, db, store) }()
	progDone := make(chan struct{})
	go func() { defer wg.Done(); r.progress(progDone, start) }()

	page := func(ctx context.Context, after int64, limit int) ([]row, error) {
		return r.page(ctx, db, q, after, hi, limit)
	}
	readErr := readPages(reading, page, lo-1, r.deps.PageSize, r.emit)
	if errors.Is(readErr, errHalted) || reading.Err() != nil {
		readErr = nil // a halt (its error is in r.errs) or an interruption (said below)
	}
	if err := r.budget.drained(hard); err != nil {
		r.log.Warn().Int("in_flight", r.budget.inFlight()).Msg("replay: acks not all received by shutdown_timeout")
	}
	notAcked := int64(r.budget.inFlight())
	producer.Close()
	<-prodDone
	r.marks.close()
	<-markDone
	close(progDone)
	close(quit) // a late verdict after a hard stop may still push to r.retries: never closed
	wg.Wait()

	s := sum()
	s.Failed += notAcked
	var errs []error
	if readErr != nil {
		errs = append(errs, fmt.Errorf("read outbox rows of %s: %w", r.table, readErr))
	}
	if ctx.Err() != nil {
		errs = append(errs, fmt.Errorf("replay interrupted after %d of %d rows: run the same command again (rows already published are published again; consumers deduplicate on event_id)", s.Read, s.Total))
	}
	r.errMu.Lock()
	errs = append(errs, r.errs...)
	r.errMu.Unlock()
	if s.Failed > 0 {
		errs = append(errs, fmt.Errorf("%d row(s) were neither published nor dead-lettered", s.Failed))
	}
	if n := s.Published - s.Marked; n > 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%d published row(s) could not be marked published_at; they are in Kafka, but retention cannot prove them delivered: fix the error above and run the replay again", n))
	}
	ev := r.log.Info()
	if len(errs) > 0 {
		ev = r.log.Error()
	}
	ev.Int64("total", s.Total).Int64("read", s.Read).Int64("published", s.Published).Int64("dead_lettered", s.DeadLettered).
		Int64("failed", s.Failed).Int64("marked_published_at", s.Marked).Dur("elapsed", s.Elapsed.Round(time.Millisecond)).
		Msg("replay done; consumers see duplicates of rows the relay already delivered and deduplicate them on event_id")
	return s, errors.Join(errs...)
}

// plan checks the table's columns, resolves the id range and counts it.
func (r *Replayer) plan(ctx context.Context, db *pgxpool.Pool) (q queries, lo, hi int64, err error) {
	var cols, types []string
	if err := db.QueryRow(ctx, `SELECT COALESCE(array_agg(attname::text), '{}'), COALESCE(array_agg(format_type(atttypid, NULL)), '{}') FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, r.table.Quoted()).Scan(&cols, &types); err != nil {
		return q, 0, 0, fmt.Errorf("read the columns of outbox table %s: %w", r.table, err)
	}
	has := map[string]string{} // column -> type
	for i, c := range cols {
		has[c] = types[i]
	}
	for _, c := range append(append([]string(nil), outboxschema.RequiredColumns...), colCreatedAt) {
		if has[c] == "" {
			return q, 0, 0, fmt.Errorf("outbox table %s has no column %s: replay reads it", r.table, c)
		}
	}
	// Exactly the rows the slot streams: an inheritance child's rows are
	// not the outbox's (pgsetup.Inheritance).
	if r.from, err = pgsetup.From(ctx, db, r.table); err != nil {
		return q, 0, 0, err
	}
	// The identity columns are read as the decoder reads them: only of
	// their types (a table not migrated to 0006 has neither).
	q = buildQueries(r.from, columns{headers: has[outboxschema.ColHeaders] != "",
		eventID: has[outboxschema.ColEventID] == "uuid", replayOf: has[outboxschema.ColDLQReplayOf] == "bigint"}, r.opts)
	lo, hi = r.opts.FromID, r.opts.ToID
	bound := func(sql string, args []any, dst *int64) error {
		var v *int64
		if err := db.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
			return fmt.Errorf("find the id range of %s: %w", r.table, err)
		}
		if v == nil {
			*dst = -1 // no row: nothing to replay
		} else {
			*dst = *v
		}
		return nil
	}
	if q.lo != "" {
		if err := bound(q.lo, []any{r.opts.Since}, &lo); err != nil {
			return q, 0, 0, err
		}
	}
	if q.hi != "" {
		var args []any
		if !r.opts.Until.IsZero() {
			args = []any{r.opts.Until}
		}
		if err := bound(q.hi, args, &hi); err != nil {
			return q, 0, 0, err
		}
	}
	if lo < 0 || hi < 0 || hi < lo {
		return q, lo, hi, nil
	}
	var n int64
	if err := db.QueryRow(ctx, q.count, append([]any{lo, hi}, q.args...)...).Scan(&n); err != nil {
		return q, 0, 0, fmt.Errorf("count the rows to replay in %s: %w", r.table, err)
	}
	r.total.Store(n)
	return q, lo, hi, nil
}

func (r *Replayer) page(ctx context.Context, db *pgxpool.Pool, q queries, after, hi int64, limit int) ([]row, error) {
	rows, err := db.Query(ctx, q.page, append([]any{after, hi, limit}, q.args...)...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(c pgx.CollectableRow) (row, error) {
		var x row
		t := &x.text
		err := c.Scan(&x.id, &t.ID, &t.AggregateType, &t.AggregateID, &t.EventType, &t.Payload, &t.Headers, &t.EventID, &t.ReplayOf, &x.created)
		return x, err
	})
}

// colCreatedAt is the column --since and --until compare.
const colCreatedAt = "created_at"

// errHalted stops reading after a halt (on_poison: halt).
var errHalted = errors.New("replay halted")

// item is one row on its way to Kafka, through retries and maybe the
// dead-letter topic. Its done runs on the producer's goroutines.
type item struct {
	r        *Replayer
	id       int64
	msg      sink.Message
	size     int64
	attempts int
	letter   *deadletter.Letter
}

// emit publishes one row: the reader goroutine.
func (r *Replayer) emit(x row) error {
	if err := r.lim.wait(r.reading); err != nil {
		return err
	}
	ev := r.dec.Row(x.text, 0)
	it := &item{r: r, id: x.id, size: int64(len(ev.Payload))}
	it.msg = record.Replayed(&ev, CommitLSN, x.created, r.mark)
	topic, reason, perr := record.Route(r.router, r.table.String(), &ev)
	it.msg.Topic = topic
	if err := r.budget.acquire(r.reading, it.size); err != nil {
		return err
	}
	r.read.Add(1)
	if perr == nil && r.deps.Encoder != nil {
		reason, perr = r.deps.Encoder.Encode(r.reading, &it.msg, &ev)
		if perr != nil && reason == "" {
			return fmt.Errorf("encode outbox row %s id=%d for topic %s: %w", r.table, it.id, topic, perr)
		}
	}
	if perr != nil {
		it.attempts = 1
		if record.Decide(record.Failure{Kind: fault.Poison, Attempts: 1, Permanent: true}, r.policy) == record.Halt {
			r.halt(it, perr)
			return errHalted
		}
		r.toDeadLetter(it, reason, perr)
	}
	it.msg.Done = it.done
	if err := r.pub.Publish(context.Background(), &it.msg); err != nil { // returns once the producer stopped
		r.fail(it, fmt.Errorf("publish outbox row %s id=%d: %w", r.table, it.id, err))
		return err
	}
	return nil
}

func (r *Replayer) toDeadLetter(it *item, reason string, cause error) {
	it.msg, it.letter = record.RowLetter(r.table.String(), r.policy, it.id, "", 0, it.msg, reason, it.attempts, cause, time.Now())
	it.msg.Done = it.done
	r.log.Error().Err(cause).Int64("id", it.id).Str("reason", reason).Str("dlq_topic", r.policy.Topic).
		Int("attempts", it.attempts).Msg("poison row: dead-lettering it")
}

// done is the broker's verdict; it runs on the producer's goroutines and
// does not block.
func (it *item) done(err error) {
	r := it.r
	if err == nil {
		if it.letter == nil {
			r.published.Add(1)
			r.marks.push(mark{id: it.id})
		} else {
			r.dead.Add(1)
			r.marks.push(mark{id: it.id, dead: it.letter})
		}
		r.budget.release(it.size)
		return
	}
	it.attempts++
	reason, kind := sink.Classify(err)
	if it.letter != nil && reason == "message_too_large" && kind == fault.Poison {
		// The dead-letter topic's limit is below kafka.max_message_bytes:
		// cut the letter down further (the row keeps the payload).
		if msg, ok := record.Shrink(it.letter, it.msg); ok {
			it.msg = msg
			r.retries <- retry{it: it, due: time.Now()}
			return
		}
		err = fmt.Errorf("%w; even the least dead letter is too large: raise max.message.bytes of topic %s", err, it.msg.Topic)
	}
	action := record.Decide(record.Failure{Kind: kind, Attempts: it.attempts, DeadLetter: it.letter != nil, Certain: sink.Certain(err)}, r.policy)
	switch action {
	case record.RetryTransient, record.RetryPoison:
		if it.attempts&(it.attempts-1) == 0 {
			r.log.Warn().Err(err).Int64("id", it.id).Str("reason", reason).Int("attempt", it.attempts).Msg("publish failed; retrying")
		}
		r.retries <- retry{it: it, due: time.Now().Add(r.policy.Delay(action, it.attempts))}
	case record.DeadLetter:
		r.toDeadLetter(it, reason, fmt.Errorf("publish to topic %s: %w", it.msg.Topic, err))
		r.retries <- retry{it: it, due: time.Now()}
	default:
		if it.letter != nil {
			err = fmt.Errorf("write dead letter of outbox row %s id=%d to topic %s: %w", r.table, it.id, it.msg.Topic, err)
		} else {
			err = fmt.Errorf("publish outbox row %s id=%d: %w", r.table, it.id, err)
		}
		r.halt(it, err)
	}
}

// halt stops reading: the row fails for good and its row records why.
func (r *Replayer) halt(it *item, err error) {
	r.log.Error().Err(err).Int64("id", it.id).Msg("replay halted at a poison row (on_poison: halt); fix the row or use on_poison: dlq, then replay again from it")
	r.marks.push(mark{id: it.id, failed: err.Error(), attempts: it.attempts})
	r.fail(it, err)
	r.stop()
}

func (r *Replayer) fail(it *item, err error) {
	r.failed.Add(1)
	r.errMu.Lock()
	if len(r.errs) < 10 {
		r.errs = append(r.errs, err)
	}
	r.errMu.Unlock()
	r.budget.release(it.size)
}

type retry struct {
	it  *item
	due time.Time
}

// retryLoop republishes failed rows in the order they failed, each once
// due, until quit closes.
func (r *Replayer) retryLoop(hard context.Context, quit <-chan struct{}) {
	for {
		var x retry
		select {
		case x = <-r.retries:
		case <-quit:
			return
		}
		if sleepCtx(hard, time.Until(x.due)) != nil {
			r.fail(x.it, fmt.Errorf("outbox row %s id=%d: not published by shutdown_timeout", r.table, x.it.id))
			continue
		}
		if err := r.pub.Publish(hard, &x.it.msg); err != nil {
			r.fail(x.it, fmt.Errorf("resend outbox row %s id=%d: %w", r.table, x.it.id, err))
		}
	}
}

// mark is a row to update once its record is acked.
type mark struct {
	id       int64
	dead     *deadletter.Letter // dead-lettered: MarkDead
	failed   string             // halted at it: MarkFailed
	attempts int
}

// markQueue is an unbounded FIFO of marks: pushed from the producer's
// goroutines (never blocking), worked off by markLoop.
type markQueue struct {
	mu     sync.Mutex
	items  []mark
	closed bool
	wake   chan struct{}
	once   sync.Once
}

func (q *markQueue) init() { q.once.Do(func() { q.wake = make(chan struct{}, 1) }) }

func (q *markQueue) push(m mark) {
	q.init()
	q.mu.Lock()
	q.items = append(q.items, m)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *markQueue) close() {
	q.init()
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns up to n marks, waiting up to linger for more once it has
// some; ok is false once the queue is closed and empty.
func (q *markQueue) take(n int, linger time.Duration) (ms []mark, ok bool) {
	q.init()
	deadline := time.Now().Add(linger)
	for {
		q.mu.Lock()
		k, closed := len(q.items), q.closed
		if k >= n || closed || (k > 0 && !time.Now().Before(deadline)) {
			k = min(k, n)
			ms = append(ms, q.items[:k]...)
			q.items = q.items[k:]
			q.mu.Unlock()
			return ms, len(ms) > 0 || !closed
		}
		q.mu.Unlock()
		wait := linger
		if k > 0 {
			wait = time.Until(deadline)
		}
		select {
		case <-q.wake:
		case <-time.After(wait):
		}
	}
}

// markBatch bounds one published_at UPDATE: its lock time and WAL.
const markBatch = 1000

var markBackoff = backoff.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}

// markLoop sets published_at on acked rows in batches (UPDATE ... WHERE id
// = ANY(...)), off the publish path, and records dead letters and halts on
// their rows like the relay. A transient error is retried until hard ends.
func (r *Replayer) markLoop(hard context.Context, db *pgxpool.Pool, store *deadletter.Store) {
	upd := "UPDATE " + r.from + " SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL"
	for {
		ms, ok := r.marks.take(markBatch, 200*time.Millisecond)
		if !ok {
			return
		}
		var ids []int64
		for _, m := range ms {
			switch {
			case m.dead != nil:
				r.retryMark(hard, func(ctx context.Context) error {
					_, err := store.MarkDead(ctx, m.id, m.dead.Attempts, m.dead.Err)
					return err
				})
			case m.failed != "":
				r.retryMark(hard, func(ctx context.Context) error { return store.MarkFailed(ctx, m.id, m.attempts, m.failed) })
			default:
				ids = append(ids, m.id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		if r.retryMark(hard, func(ctx context.Context) error {
			_, err := db.Exec(ctx, upd, ids)
			if err != nil {
				return fmt.Errorf("set published_at on %d replayed row(s) of %s (ids %d..%d): %w", len(ids), r.table, ids[0], ids[len(ids)-1], err)
			}
			return nil
		}) {
			r.marked.Add(int64(len(ids)))
		}
	}
}

// retryMark runs f until it succeeds (true), fails for good or hard ends.
func (r *Replayer) retryMark(hard context.Context, f func(context.Context) error) bool {
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(hard, 30*time.Second)
		err := f(ctx)
		cancel()
		if err == nil {
			return true
		}
		if fault.KindOf(err) != fault.Transient || sleepCtx(hard, markBackoff.Delay(attempt)) != nil {
			if fault.IsPrivilege(err) {
				err = fmt.Errorf("%w; GRANT UPDATE (published_at) ON %s TO the relay's role", err, r.table.Quoted())
			}
			r.log.Error().Err(err).Msg("replay: cannot update outbox rows")
			r.errMu.Lock()
			if len(r.errs) < 10 {
				r.errs = append(r.errs, err)
			}
			r.errMu.Unlock()
			return false
		}
		r.log.Warn().Err(err).Msg("replay: cannot update outbox rows yet; retrying")
	}
}

// progress reports until done closes: a live line on a terminal, else a
// log line every LogEvery; a last line at the end.
func (r *Replayer) progress(done <-chan struct{}, start time.Time) {
	every := r.deps.LogEvery
	live := r.deps.Terminal && r.deps.Progress != nil
	if live {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			if live {
				fmt.Fprintf(r.deps.Progress, "\r\033[K%s\n", r.line(start))
			}
			return
		case <-t.C:
			if live {
				fmt.Fprintf(r.deps.Progress, "\r\033[K%s", r.line(start))
			} else {
				s := r.total.Load()
				done := r.published.Load() + r.dead.Load() + r.failed.Load()
				r.log.Info().Int64("done", done).Int64("total", s).Int64("published", r.published.Load()).
					Int64("dead_lettered", r.dead.Load()).Float64("rows_per_second", rate(done, time.Since(start))).
					Str("eta", eta(done, s, time.Since(start))).Msg("replay progress")
			}
		}
	}
}

func (r *Replayer) line(start time.Time) string {
	total := r.total.Load()
	done := r.published.Load() + r.dead.Load() + r.failed.Load()
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "replay: %d/%d rows (%.0f%%), %.0f rows/s, ETA %s", done, total, pct, rate(done, time.Since(start)), eta(done, total, time.Since(start)))
	if n := r.dead.Load(); n > 0 {
		fmt.Fprintf(&b, ", %d dead-lettered", n)
	}
	return b.String()
}

func rate(done int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(done) / d.Seconds()
}

func eta(done, total int64, d time.Duration) string {
	if done <= 0 || done >= total {
		return "-"
	}
	return (time.Duration(float64(d) / float64(done) * float64(total-done))).Round(time.Second).String()
}
