//go:build e2e

package chaos

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
)

// --- one scenario's private outbox -------------------------------------------

// env is one scenario's outbox on the shared services: its own schema,
// table, publication, slot and topics.
type env struct {
	t      *testing.T
	name   string
	schema string
	table  string // schema.outbox
	other  string // schema.orders: a non-outbox table in the same publication
	slot   string
	pub    string
	prefix string // topic prefix
	db     *pgxpool.Pool
	logs   int // relay logs started
}

// aggTypes route events to two topics (prefix.order, prefix.payment).
var aggTypes = []string{"order", "payment"}

func newEnv(t *testing.T, name string) *env {
	t.Helper()
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	id := "chaos_" + name + "_" + suffix
	e := &env{t: t, name: name, schema: id, slot: id, pub: id, prefix: "chaos." + name + "." + suffix}
	e.table, e.other = e.schema+".outbox", e.schema+".orders"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatalf("connect postgres: %v", err)
	}
	e.db = db
	t.Cleanup(e.cleanup)
	if out, err := exec.CommandContext(ctx, relayBin, "migrate", "--postgres-url", pgURL, "--slot", e.slot, "--publication", e.pub,
		"--table", e.table, "--kafka-brokers", strings.Join(brokers, ",")).CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	// The other table is in the publication, so the relay really decodes
	// (and must drop) its rows.
	for _, q := range []string{
		"CREATE TABLE " + e.other + " (id bigserial PRIMARY KEY, note text)",
		"ALTER PUBLICATION " + e.pub + " ADD TABLE " + e.other,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Topics made up front with a known partition count: the partition
	// check needs several, and no first-produce LEADER_NOT_AVAILABLE.
	admin := newAdmin(t)
	defer admin.Close()
	for _, tp := range e.topics() {
		if err := admin.CreateTopic(tp, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1}, false); err != nil &&
			!errors.Is(err, sarama.ErrTopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", tp, err)
		}
	}
	return e
}

func (e *env) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The walsender lets go of the slot shortly after the relay is gone.
	for i := 0; i < 200; i++ {
		var active bool
		if err := e.db.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name=$1", e.slot).Scan(&active); err != nil || !active {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.db.Exec(ctx, "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name=$1", e.slot)
	e.db.Exec(ctx, "DROP PUBLICATION IF EXISTS "+e.pub)
	e.db.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE")
	e.db.Close()
	if admin, err := sarama.NewClusterAdmin(brokers, saramaConfig()); err == nil {
		for _, tp := range e.topics() {
			admin.DeleteTopic(tp)
		}
		admin.Close()
	}
}

func (e *env) topics() []string {
	var out []string
	for _, a := range aggTypes {
		out = append(out, e.prefix+"."+a)
	}
	return out
}

func saramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Consumer.Return.Errors = true
	return cfg
}

func newAdmin(t *testing.T) sarama.ClusterAdmin {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("kafka admin: %v", err)
	}
	return admin
}

// lsn runs a query returning one pg_lsn (as text); 0 when it yields NULL.
func (e *env) lsn(q string, args ...any) (pglogrepl.LSN, error) {
	var s *string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.db.QueryRow(ctx, q, args...).Scan(&s); err != nil {
		return 0, fmt.Errorf("%s: %w", q, err)
	}
	if s == nil {
		return 0, nil
	}
	return pglogrepl.ParseLSN(*s)
}

// confirmed is the slot's confirmed_flush_lsn; a missing slot is an error,
// never 0 (which would make every comparison pass).
func (e *env) confirmed(t *testing.T) pglogrepl.LSN {
	t.Helper()
	l, err := e.lsn("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name=$1", e.slot)
	if err != nil || l == 0 {
		t.Fatalf("slot %s: confirmed_flush_lsn %s, %v", e.slot, l, err)
	}
	return l
}

// walsender returns the pid serving the slot, 0 if none.
func (e *env) walsender(t *testing.T) int {
	t.Helper()
	var pid *int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.db.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name=$1", e.slot).Scan(&pid); err != nil {
		t.Fatalf("slot %s: %v", e.slot, err)
	}
	if pid == nil {
		return 0
	}
	return *pid
}

// --- the relay process -------------------------------------------------------

// relay is one relay process, configured by OUTBOX_RELAY_* variables.
type relay struct {
	t       *testing.T
	cmd     *exec.Cmd
	logPath string
	metrics string // host:port of /metrics and /readyz
	done    chan struct{}
	err     error
	stopped atomic.Bool // the test signalled it: an exit is expected
}

// relayEnv is the base configuration; later entries override earlier ones.
func (e *env) relayEnv(metrics string) []string {
	return []string{
		"OUTBOX_RELAY_POSTGRES_URL=" + pgURL,
		"OUTBOX_RELAY_SLOT=" + e.slot,
		"OUTBOX_RELAY_PUBLICATION=" + e.pub,
		"OUTBOX_RELAY_TABLE=" + e.table,
		"OUTBOX_RELAY_KAFKA_BROKERS=" + strings.Join(brokers, ","),
		"OUTBOX_RELAY_TOPIC_TEMPLATE=" + e.prefix + ".{aggregate_type}",
		"OUTBOX_RELAY_METRICS_ADDR=" + metrics,
		"OUTBOX_RELAY_LOG_FORMAT=json",
		"OUTBOX_RELAY_RECONNECT_MAX=2s",
		// Read back with the other topics: a transient fault taken for a
		// poison event would show up as an event in the wrong topic.
		"OUTBOX_RELAY_DLQ_TOPIC=" + e.prefix + ".dlq",
	}
}

// startRelay starts a relay with the base config plus extra KEY=value
// settings and waits until it is ready.
func (e *env) startRelay(extra ...string) *relay {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	e.logs++
	r := &relay{t: e.t, metrics: addr, done: make(chan struct{}),
		logPath: filepath.Join(runDir, "chaos-relay-logs", fmt.Sprintf("%s-%d.log", e.slot, e.logs))}
	f, err := os.Create(r.logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	r.cmd = exec.Command(relayBin, "run")
	r.cmd.Stdout, r.cmd.Stderr = f, f
	// Only our settings: an OUTBOX_RELAY_* of the caller must not leak in.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_RELAY_") {
			r.cmd.Env = append(r.cmd.Env, kv)
		}
	}
	r.cmd.Env = append(append(r.cmd.Env, e.relayEnv(addr)...), extra...)
	if err := r.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		r.err = r.cmd.Wait()
		f.Close()
		close(r.done)
	}()
	e.t.Cleanup(func() {
		if !r.exited() {
			r.cmd.Process.Kill()
			<-r.done
		}
	})
	e.waitStreaming(r, 90*time.Second, 0)
	return r
}

// waitStreaming waits until r is ready and a walsender other than notPID
// serves the slot (a new replication session when notPID is the old one's);
// it returns that walsender's pid.
func (e *env) waitStreaming(r *relay, d time.Duration, notPID int) int {
	e.t.Helper()
	pid := 0
	waitFor(e.t, d, "the relay to stream (ready, walsender on the slot)", func() bool {
		r.alive()
		pid = e.walsender(e.t)
		return pid != 0 && pid != notPID && r.ready()
	})
	return pid
}

func (r *relay) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// alive fails the test if the relay exited without being told to.
func (r *relay) alive() {
	r.t.Helper()
	if r.exited() && !r.stopped.Load() {
		r.t.Fatalf("relay exited on its own (%v); log %s:\n%s", r.err, r.logPath, r.logTail(4096))
	}
}

func (r *relay) logTail(n int) string {
	b, _ := os.ReadFile(r.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// logLSN returns the lsn field of the relay's last log line with message
// msg, 0 if none.
func (r *relay) logLSN(msg string) pglogrepl.LSN {
	b, _ := os.ReadFile(r.logPath)
	var lsn pglogrepl.LSN
	for _, line := range strings.Split(string(b), "\n") {
		var l struct{ Message, LSN string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == msg {
			lsn, _ = pglogrepl.ParseLSN(l.LSN)
		}
	}
	return lsn
}

// ready: /readyz answers 200, and not as a standby (leader election): this
// process streams.
func (r *relay) ready() bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.metrics + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && !strings.HasPrefix(string(body), "standby")
}

// metric is the sum of a metric family's series, -1 if absent or
// unreachable.
func (r *relay) metric(name string) float64 {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			f := strings.Fields(line)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				sum, found = sum+v, true
			}
		}
	}
	if !found {
		return -1
	}
	return sum
}

// stop sends sig and waits (bounded) for the exit; it returns the exit code
// (negative: killed by that signal).
func (r *relay) stop(sig syscall.Signal, d time.Duration) int {
	r.t.Helper()
	r.stopped.Store(true)
	r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(d):
		r.cmd.Process.Kill()
		<-r.done
		r.t.Fatalf("relay did not exit within %s of %s; log:\n%s", d, sig, r.logTail(4096))
	}
	var ee *exec.ExitError
	switch {
	case r.err == nil:
		return 0
	case errors.As(r.err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1000
}

// --- helpers -----------------------------------------------------------------

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// svc runs a test/services.sh command (kafka-kill, pg-restart fast, ...).
func svc(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", append([]string{services}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("services.sh %v: %v\n%s", args, err, out)
	}
}

// sleepJitter sleeps a random duration in [0, d).
func sleepJitter(d time.Duration) {
	if d > 0 {
		time.Sleep(rand.N(d))
	}
}

// withHostPort returns the PostgreSQL URL u with its host:port replaced.
func withHostPort(t *testing.T, u, hostport string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatalf("parse postgres url: %v", err)
	}
	p.Host = hostport
	return p.String()
}

// withOption appends a server option (-c name=value) to a PostgreSQL URL.
func withOption(u, name, value string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	// %20, not +: libpq-style URL parsing does not turn + into a space.
	return u + sep + "options=" + strings.ReplaceAll(url.QueryEscape("-c "+name+"="+value), "+", "%20")
}

// --- the workload ------------------------------------------------------------

// event is one outbox row the writer committed.
type event struct {
	ID      int64
	Type    string // aggregate_type
	Agg     string // aggregate_id, the Kafka key
	Seq     int    // 1-based position within its aggregate, in commit order
	Written int    // events committed before this one (its place in the workload)
}

// writer commits the workload from one goroutine, so commit order is
// program order: 1-row and 50-row outbox transactions, some with a row of
// the other table in the same transaction, and other-table-only
// transactions. It is paced over a window and gated: it never writes past
// limit, which the fault driver raises, so the workload cannot run out
// before the last fault.
type writer struct {
	e    *env
	rng  *rand.Rand
	seqs map[string]int
	txn  int64 // transaction number, in the payload: finds an ambiguous commit

	mu      sync.Mutex
	events  []event
	lastLSN pglogrepl.LSN // WAL insert position inside the last event transaction (before its commit)
	retries int           // statements retried after an error (PostgreSQL restarts)

	written atomic.Int64
	limit   atomic.Int64
	burst   atomic.Bool // 50-event transactions as fast as possible (the schedule catches up later)
}

func newWriter(e *env, seed uint64) *writer {
	return &writer{e: e, rng: rand.New(rand.NewPCG(seed, 7)), seqs: map[string]int{}}
}

// run writes total events over about window, never past limit, until done
// or ctx ends.
func (w *writer) run(ctx context.Context, total, aggregates int, window time.Duration) error {
	start := time.Now()
	for done := 0; done < total; {
		n := 0 // other-table-only transaction
		switch r := w.rng.Float64(); {
		case r < 0.10 || w.burst.Load():
			n = 50
		case r < 0.88:
			n = 1
		}
		n = min(n, total-done)
		for int64(done+n) > w.limit.Load() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		var err error
		if n == 0 {
			err = w.exec(ctx, "INSERT INTO "+w.e.other+" (note) VALUES ('separate transaction')")
		} else {
			err = w.write(ctx, n, aggregates, w.rng.IntN(3) == 0)
		}
		if err != nil {
			return fmt.Errorf("after %d events: %w", done, err)
		}
		done += n
		if w.burst.Load() {
			continue
		}
		due := start.Add(time.Duration(float64(window) * float64(done) / float64(total)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(due)):
		}
	}
	return nil
}

// retry runs f until it succeeds, riding out PostgreSQL restarts (bounded).
func (w *writer) retry(ctx context.Context, f func(context.Context) error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := f(sctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if time.Now().After(deadline) {
			return err
		}
		w.mu.Lock()
		w.retries++
		w.mu.Unlock()
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *writer) exec(ctx context.Context, q string) error {
	return w.retry(ctx, func(ctx context.Context) error {
		_, err := w.e.db.Exec(ctx, q)
		return err
	})
}

// write commits one transaction of n events (one statement, so one round
// trip), plus a row of the other table when withOther.
func (w *writer) write(ctx context.Context, n, aggregates int, withOther bool) error {
	w.txn++
	types, aggs, seqs := make([]string, n), make([]string, n), make([]int32, n)
	next := map[string]int{}
	for i := range n {
		a := w.rng.IntN(aggregates)
		types[i] = aggTypes[a%len(aggTypes)]
		aggs[i] = fmt.Sprintf("%s-%d", types[i], a)
		next[aggs[i]]++
		seqs[i] = int32(w.seqs[aggs[i]] + next[aggs[i]])
	}
	q := `WITH other AS (INSERT INTO ` + w.e.other + ` (note) SELECT 'same transaction' WHERE $5)
		INSERT INTO ` + w.e.table + ` (aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT t, a, t || '.updated', jsonb_build_object('aggregate', a, 'seq', s, 'txn', $4::bigint),
		       jsonb_build_object('trace_id', 'trace-' || a || '-' || s, 'tenant_id', 'acme')
		FROM unnest($1::text[], $2::text[], $3::int[]) WITH ORDINALITY AS u(t, a, s, n) ORDER BY n
		RETURNING id, aggregate_type, aggregate_id, (payload->>'seq')::int, pg_current_wal_insert_lsn()::text`
	var got []event
	var last pglogrepl.LSN // stays 0 for a recovered commit: position unknown
	tried := false
	err := w.retry(ctx, func(ctx context.Context) error {
		got, last = got[:0], 0
		if tried {
			// The outcome of a statement cut off by a restart is unknown:
			// look for its rows before writing them again.
			if err := w.scan(ctx, &got, nil, `SELECT id, aggregate_type, aggregate_id, (payload->>'seq')::int FROM `+w.e.table+
				` WHERE payload->>'txn' = $1 ORDER BY id`, strconv.FormatInt(w.txn, 10)); err != nil || len(got) > 0 {
				return err
			}
		}
		tried = true
		return w.scan(ctx, &got, &last, q, types, aggs, seqs, w.txn, withOther)
	})
	if err != nil {
		return err
	}
	if len(got) != n {
		return fmt.Errorf("transaction %d: %d rows back, want %d", w.txn, len(got), n)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	base := len(w.events)
	for i := range got {
		got[i].Written = base + i
		w.seqs[got[i].Agg] = max(w.seqs[got[i].Agg], got[i].Seq)
	}
	w.events = append(w.events, got...)
	w.lastLSN = max(w.lastLSN, last)
	w.written.Store(int64(len(w.events)))
	return nil
}

// scan runs q and appends its rows (id, type, aggregate, seq[, lsn]) to got;
// with last non-nil the fifth column is a WAL position, maximised into it.
func (w *writer) scan(ctx context.Context, got *[]event, last *pglogrepl.LSN, q string, args ...any) error {
	rows, err := w.e.db.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var ev event
		var l string
		dest := []any{&ev.ID, &ev.Type, &ev.Agg, &ev.Seq}
		if last != nil {
			dest = append(dest, &l)
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		*got = append(*got, ev)
		if x, err := pglogrepl.ParseLSN(l); err == nil && last != nil {
			*last = max(*last, x)
		}
	}
	return rows.Err()
}

func (w *writer) snapshot() ([]event, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]event(nil), w.events...), w.retries
}

func (w *writer) last() pglogrepl.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastLSN
}

// --- reading it back ---------------------------------------------------------

// record is one Kafka record, as the check needs it.
type record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   map[string]string
}

// consume waits until the slot confirmed everything written before it was
// called (bounded by d; a relay that is stuck is reported as loss, not
// waited on forever), then reads every partition of every topic under the
// env's prefix from the oldest offset to the high-water mark. The consumer
// uses the broker's direct listener, never a proxy under test.
func (e *env) consume(t *testing.T, d time.Duration) ([]record, map[string]int) {
	t.Helper()
	deadline := time.Now().Add(d)
	if end, err := e.lsn("SELECT pg_current_wal_lsn()::text"); err != nil {
		t.Errorf("read WAL end: %v", err)
	} else {
		for e.confirmed(t) < end && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if c := e.confirmed(t); c < end {
			t.Errorf("slot confirmed only %s of %s after %s: the relay is stuck", c, end, d)
		}
	}
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatalf("kafka consumer: %v", err)
	}
	defer consumer.Close()
	if err := client.RefreshMetadata(); err != nil {
		t.Fatalf("kafka metadata: %v", err)
	}
	all, err := client.Topics()
	if err != nil {
		t.Fatal(err)
	}
	partitions := map[string]int{}
	var out []record
	for _, tp := range all {
		if !strings.HasPrefix(tp, e.prefix+".") {
			continue
		}
		parts, err := client.Partitions(tp)
		if err != nil {
			t.Fatalf("partitions of %s: %v", tp, err)
		}
		partitions[tp] = len(parts)
		for _, p := range parts {
			hwm, err := client.GetOffset(tp, p, sarama.OffsetNewest)
			if err != nil {
				t.Fatalf("high-water mark of %s/%d: %v", tp, p, err)
			}
			if hwm == 0 {
				continue
			}
			pc, err := consumer.ConsumePartition(tp, p, sarama.OffsetOldest)
			if err != nil {
				t.Fatalf("consume %s/%d: %v", tp, p, err)
			}
			for done := false; !done; {
				select {
				case m := <-pc.Messages():
					h := make(map[string]string, len(m.Headers))
					for _, rh := range m.Headers {
						h[string(rh.Key)] = string(rh.Value)
					}
					out = append(out, record{m.Topic, m.Partition, m.Offset, string(m.Key), m.Value, h})
					done = m.Offset >= hwm-1
				case err := <-pc.Errors():
					t.Fatalf("consume %s/%d: %v", tp, p, err)
				case <-time.After(time.Minute):
					t.Fatalf("consume %s/%d: stuck before offset %d", tp, p, hwm-1)
				}
			}
			pc.Close()
		}
	}
	return out, partitions
}

// result is what the delivery check found.
type result struct {
	Written, Delivered, Records, Lost, Duplicates, OrderViolations, WrongPartition int
	Extra                                                                          map[int64]int           // event id -> copies beyond the first
	CommitLSN                                                                      map[int64]pglogrepl.LSN // of each duplicated event
	Problems                                                                       []string
}

func (r *result) problem(format string, a ...any) {
	if len(r.Problems) < 20 {
		r.Problems = append(r.Problems, fmt.Sprintf(format, a...))
	}
}

// check compares the records with the committed events: each at least once
// (distinct event_id), in the right topic with the right key, headers and
// payload; the first delivery of each aggregate's events in commit order
// within one partition, the one murmur2(key) picks.
func check(events []event, recs []record, partitions map[string]int, prefix string) result {
	res := result{Written: len(events), Records: len(recs), Extra: map[int64]int{}, CommitLSN: map[int64]pglogrepl.LSN{}}
	byID := make(map[int64]event, len(events))
	for _, ev := range events {
		byID[ev.ID] = ev
	}
	seen := make(map[int64]int, len(events))
	type first struct {
		partition int32
		offset    int64
		seq       int
	}
	firsts := map[string][]first{}
	for _, r := range recs {
		id, err := strconv.ParseInt(r.Headers["event_id"], 10, 64)
		ev, ok := byID[id]
		if err != nil || !ok {
			res.problem("record %s/%d@%d: event_id %q was not written by this scenario", r.Topic, r.Partition, r.Offset, r.Headers["event_id"])
			continue
		}
		if seen[id]++; seen[id] > 1 {
			res.Duplicates++
			res.Extra[id]++
			res.CommitLSN[id], _ = pglogrepl.ParseLSN(r.Headers["pg_lsn"])
			continue
		}
		var body struct {
			Aggregate string `json:"aggregate"`
			Seq       int    `json:"seq"`
		}
		if json.Unmarshal(r.Value, &body) != nil || body.Aggregate != ev.Agg || body.Seq != ev.Seq ||
			r.Topic != prefix+"."+ev.Type || r.Key != ev.Agg || r.Headers["aggregate_id"] != ev.Agg ||
			r.Headers["event_type"] != ev.Type+".updated" || r.Headers["trace_id"] != fmt.Sprintf("trace-%s-%d", ev.Agg, ev.Seq) {
			res.problem("event_id=%d in %s key %q headers %v payload %s: want %s, key %s, seq %d", id, r.Topic, r.Key, r.Headers, r.Value, prefix+"."+ev.Type, ev.Agg, ev.Seq)
		}
		if _, err := pglogrepl.ParseLSN(r.Headers["pg_lsn"]); err != nil {
			res.problem("event_id=%d: pg_lsn header %q is not an LSN", id, r.Headers["pg_lsn"])
		}
		if p := javaPartition([]byte(r.Key), partitions[r.Topic]); p != r.Partition {
			res.WrongPartition++
			res.problem("event_id=%d key %q in partition %d; murmur2 picks %d of %d", id, r.Key, r.Partition, p, partitions[r.Topic])
		}
		firsts[ev.Agg] = append(firsts[ev.Agg], first{r.Partition, r.Offset, ev.Seq})
	}
	res.Delivered = len(seen)
	for _, ev := range events {
		if seen[ev.ID] == 0 {
			res.Lost++
			res.problem("event_id=%d (%s seq %d, written #%d) never arrived", ev.ID, ev.Agg, ev.Seq, ev.Written)
		}
	}
	for agg, fs := range firsts {
		// One partition consumer delivers in offset order, but be exact.
		slices.SortFunc(fs, func(a, b first) int { return cmp.Compare(a.offset, b.offset) })
		for i := 1; i < len(fs); i++ {
			if fs[i].partition != fs[0].partition {
				res.WrongPartition++
				res.problem("aggregate %s in partitions %d and %d", agg, fs[0].partition, fs[i].partition)
			} else if fs[i].seq < fs[i-1].seq {
				res.OrderViolations++
				res.problem("aggregate %s: seq %d delivered after seq %d", agg, fs[i].seq, fs[i-1].seq)
			}
		}
	}
	return res
}

// javaPartition is the Java client's default partitioner for a keyed
// record, toPositive(murmur2(key)) % partitions, written from the Java
// source (seed 0x9747b28c), independent of sarama's implementation.
func javaPartition(key []byte, partitions int) int32 {
	if partitions <= 0 {
		return -1
	}
	return (murmur2(key) & 0x7fffffff) % int32(partitions)
}

// murmur2 is org.apache.kafka.common.utils.Utils.murmur2.
func murmur2(key []byte) int32 {
	const m, r = uint32(0x5bd1e995), 24
	h := uint32(0x9747b28c) ^ uint32(len(key))
	n := len(key) / 4
	for i := 0; i < n; i++ {
		k := uint32(key[i*4]) | uint32(key[i*4+1])<<8 | uint32(key[i*4+2])<<16 | uint32(key[i*4+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h = h*m ^ k
	}
	switch rest := key[n*4:]; len(rest) {
	case 3:
		h ^= uint32(rest[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(rest[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(rest[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// The partition check is only as good as its murmur2: pin it to the values
// of Kafka's own UtilsTest.testMurmur2.
func TestMurmur2MatchesKafka(t *testing.T) {
	for key, want := range map[string]int32{
		"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
		"a-little-bit-longer-string": -1486304829, "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107,
	} {
		if got := murmur2([]byte(key)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", key, got, want)
		}
	}
}
