//go:build e2e

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

type (
	event  = testkit.Event
	record = testkit.Record
	result = testkit.Report
)

// --- one scenario's private outbox -------------------------------------------

// env is one scenario's outbox on the shared services: its own schema,
// table, publication, slot and topics.
type env struct {
	*testkit.Outbox
	t     *testing.T
	name  string
	mode  delivery
	other string   // schema.orders: a non-outbox table in the same publication
	kafka []string // the brokers: the single one, or the three-node cluster's (scenario.cluster)
	logs  int      // relay logs started
}

// aggTypes route events to two topics (prefix.order, prefix.payment).
var aggTypes = []string{"order", "payment"}

func newEnv(t *testing.T, name string, mode delivery) *env {
	return newEnvOn(t, name, mode, brokers, 1)
}

// newEnvOn is newEnv on the brokers kafka, its topics with rf replicas.
func newEnvOn(t *testing.T, name string, mode delivery, kafka []string, rf int16) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := name
	if mode == exactlyOnce {
		id = "eos_" + name
	}
	on := *svcs // the outbox's topics are deleted where they were made
	on.Brokers = kafka
	o, err := testkit.NewOutbox(ctx, &on, "chaos", id)
	if err != nil {
		t.Fatal(err)
	}
	// On the three-node cluster the topics stay (it is thrown away after
	// the suite): Kafka 4.2's controller was seen to fail every later
	// broker registration ("Topic ID ... existed in isrMembers, but not in
	// the topics map") after topics that had been reassigned were deleted.
	o.KeepTopics = rf > 1
	e := &env{Outbox: o, t: t, name: name, mode: mode, other: o.Schema + ".orders", kafka: kafka}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := o.Close(ctx); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	if code, out, err := testkit.Run(ctx, os.Environ(), relayBin, "migrate", "--postgres-url", pgURL, "--slot", e.Slot, "--publication", e.Pub,
		"--table", e.Table, "--kafka-brokers", strings.Join(e.kafka, ",")); err != nil || code != 0 {
		t.Fatalf("migrate: exit %d %v\n%s", code, err, out)
	}
	// The other table is in the publication, so the relay really decodes
	// (and must drop) its rows.
	for _, q := range []string{
		"CREATE TABLE " + e.other + " (id bigserial PRIMARY KEY, note text)",
		"ALTER PUBLICATION " + e.Pub + " ADD TABLE " + e.other,
	} {
		if _, err := e.DB.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Topics made up front with a known partition count: the partition
	// check needs several, and no first-produce LEADER_NOT_AVAILABLE. The
	// relay creates none (kafka.auto_create_topics is off), so the
	// dead-letter topic is made here too.
	if err := testkit.CreateTopicsRF(e.kafka, 4, rf, nil, append(e.topics(), e.Prefix+".dlq")...); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) topics() []string {
	var out []string
	for _, a := range aggTypes {
		out = append(out, e.Prefix+"."+a)
	}
	return out
}

// lsn runs a query returning one pg_lsn (as text); 0 when it yields NULL.
func (e *env) lsn(q string, args ...any) (pglogrepl.LSN, error) {
	return e.LSN(context.Background(), q, args...)
}

// confirmed is the slot's confirmed_flush_lsn; a missing slot fails.
func (e *env) confirmed(t *testing.T) pglogrepl.LSN {
	t.Helper()
	l, err := e.Confirmed(context.Background())
	return testkit.Must(t, l, err)
}

// walsender returns the pid serving the slot, 0 if none.
func (e *env) walsender(t *testing.T) int {
	t.Helper()
	pid, err := e.WalsenderPID(context.Background())
	return testkit.Must(t, pid, err)
}

// --- the relay process -------------------------------------------------------

// relay is one relay process, configured by OUTBOX_RELAY_* variables.
type relay struct {
	*testkit.Relay
	t *testing.T
}

// relayEnv is the base configuration; later entries override earlier ones.
func (e *env) relayEnv(metrics string) []string {
	env := []string{
		"OUTBOX_RELAY_POSTGRES_URL=" + pgURL,
		"OUTBOX_RELAY_SLOT=" + e.Slot,
		"OUTBOX_RELAY_PUBLICATION=" + e.Pub,
		"OUTBOX_RELAY_TABLE=" + e.Table,
		"OUTBOX_RELAY_KAFKA_BROKERS=" + strings.Join(e.kafka, ","),
		"OUTBOX_RELAY_TOPIC_TEMPLATE=" + e.Prefix + ".{aggregate_type}",
		"OUTBOX_RELAY_METRICS_ADDR=" + metrics,
		"OUTBOX_RELAY_LOG_FORMAT=json",
		"OUTBOX_RELAY_RECONNECT_MAX=2s",
		// Read back with the other topics: a transient fault taken for a
		// poison event would show up as an event in the wrong topic.
		"OUTBOX_RELAY_DLQ_TOPIC=" + e.Prefix + ".dlq",
	}
	if e.mode == exactlyOnce {
		// The checkpoint topic stays the default one (shared by the
		// scenarios, keyed by each slot's transactional id): it is not under
		// the prefix, so the delivery check never reads it.
		env = append(env, "OUTBOX_RELAY_DELIVERY=exactly_once")
	}
	return env
}

// startRelay starts a relay with the base config plus extra KEY=value
// settings and waits until it streams.
func (e *env) startRelay(extra ...string) *relay {
	e.t.Helper()
	addr, err := testkit.FreeAddr()
	if err != nil {
		e.t.Fatal(err)
	}
	e.logs++
	tr, err := testkit.StartRelay(testkit.RelayConfig{
		Bin: relayBin, Args: []string{"run"}, Metrics: addr,
		// Only our settings: an OUTBOX_RELAY_* of the caller must not leak in.
		DropEnv: "OUTBOX_RELAY_", Env: append(e.relayEnv(addr), extra...),
		LogPath: filepath.Join(runDir, "chaos-relay-logs", fmt.Sprintf("%s-%d.log", e.Slot, e.logs)),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	r := &relay{Relay: tr, t: e.t}
	e.t.Cleanup(r.Kill)
	e.waitStreaming(r, 90*time.Second, 0)
	return r
}

// startStandby starts a relay like startRelay while another one leads, and
// waits until it answers as a standby.
func (e *env) startStandby(extra ...string) *relay {
	e.t.Helper()
	addr, err := testkit.FreeAddr()
	if err != nil {
		e.t.Fatal(err)
	}
	e.logs++
	tr, err := testkit.StartRelay(testkit.RelayConfig{
		Bin: relayBin, Args: []string{"run"}, Metrics: addr,
		DropEnv: "OUTBOX_RELAY_", Env: append(e.relayEnv(addr), extra...),
		LogPath: filepath.Join(runDir, "chaos-relay-logs", fmt.Sprintf("%s-%d.log", e.Slot, e.logs)),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	r := &relay{Relay: tr, t: e.t}
	e.t.Cleanup(r.Kill)
	waitFor(e.t, 90*time.Second, "the second relay to answer as a standby", func() bool {
		r.alive()
		return r.standby()
	})
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

func (r *relay) exited() bool { return !r.Running() }

// alive fails the test if the relay exited without being told to.
func (r *relay) alive() {
	r.t.Helper()
	if err := r.Unexpected(); err != nil {
		r.t.Fatalf("relay exited on its own: %v", err)
	}
}

// logLSN returns the lsn field of the relay's last log line with message
// msg, 0 if none.
func (r *relay) logLSN(msg string) pglogrepl.LSN {
	var lsn pglogrepl.LSN
	for _, line := range strings.Split(r.Log(), "\n") {
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	code, body, err := r.Get(ctx, "/readyz")
	return err == nil && code == 200 && !strings.HasPrefix(string(body), "standby")
}

// standby: /readyz says this process waits for the lease.
func (r *relay) standby() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, body, err := r.Get(ctx, "/readyz")
	return err == nil && strings.HasPrefix(string(body), "standby")
}

func (r *relay) metric(name string) float64 { return r.Metric(name) }

// stop sends sig and waits (bounded) for the exit; it returns the exit code
// (negative: killed by that signal).
func (r *relay) stop(sig syscall.Signal, d time.Duration) int {
	r.t.Helper()
	code, err := r.Stop(sig, d)
	if err != nil {
		r.t.Fatal(err)
	}
	return code
}

// --- helpers -----------------------------------------------------------------

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, d, what, cond)
}

// svc runs a test/services.sh command (kafka-kill, pg-restart fast, ...).
func svc(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := svcs.Run(ctx, args...); err != nil {
		t.Fatal(err)
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

// writer drives testkit.Writer with the chaos workload: 1-row and 50-row
// outbox transactions, some with a row of the other table in the same
// transaction, and other-table-only transactions. It is paced over a window
// and gated: it never writes past limit, which the fault driver raises, so
// the workload cannot run out before the last fault.
type writer struct {
	*testkit.Writer
	e     *env
	limit atomic.Int64
	burst atomic.Bool // 50-event transactions as fast as possible (the schedule catches up later)
}

func newWriter(e *env, seed uint64) *writer {
	kw := testkit.NewWriter(e.DB, e.Table, rand.New(rand.NewPCG(seed, 7)), func(a int) string { return aggTypes[a%len(aggTypes)] })
	return &writer{Writer: kw, e: e}
}

// run writes total events over about window, never past limit, until done
// or ctx ends.
func (w *writer) run(ctx context.Context, total, aggregates int, window time.Duration) error {
	start := time.Now()
	for done := 0; done < total; {
		n := 0 // other-table-only transaction
		switch r := w.Rand.Float64(); {
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
			err = w.Exec(ctx, "INSERT INTO "+w.e.other+" (note) VALUES ('separate transaction')")
		} else {
			other := ""
			if w.Rand.IntN(3) == 0 {
				other = w.e.other
			}
			err = w.Write(ctx, n, aggregates, other)
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

func (w *writer) snapshot() ([]event, int) { return w.Events(), w.Retries() }
func (w *writer) last() pglogrepl.LSN      { return w.LastLSN() }

// --- reading it back ---------------------------------------------------------

// consume waits until the slot confirmed everything written before it was
// called (bounded by d; a relay that is stuck is reported as loss, not
// waited on forever), then reads every partition of every topic under the
// env's prefix from the oldest offset to the high-water mark (exactly-once:
// read_committed, to the last stable offset). The consumer uses the
// broker's direct listener, never a proxy under test.
func (e *env) consume(t *testing.T, d time.Duration) ([]record, map[string]int) {
	t.Helper()
	if end, err := e.lsn("SELECT pg_current_wal_lsn()::text"); err != nil {
		t.Errorf("read WAL end: %v", err)
	} else if err := e.WaitConfirmed(context.Background(), end, d); err != nil {
		t.Errorf("the relay is stuck: %v", err)
	}
	return e.read(t)
}

// read reads every partition of every topic under the env's prefix to its
// end now, as the mode's consumers do (exactly-once: read_committed).
func (e *env) read(t *testing.T) ([]record, map[string]int) {
	t.Helper()
	var opts []testkit.ReadOption
	if e.mode == exactlyOnce {
		opts = append(opts, testkit.ReadCommitted)
	}
	recs, parts, err := testkit.ReadToEnd(e.kafka, e.Prefix+".", time.Minute, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return recs, parts
}

// check compares the records with the committed events (testkit.CheckWith;
// exactly-once: every duplicate and partial transaction is a problem).
func check(mode delivery, events []event, recs []record, partitions map[string]int, prefix string) result {
	return testkit.CheckWith(testkit.CheckOptions{ExactlyOnce: mode == exactlyOnce}, events, recs, partitions, prefix)
}
