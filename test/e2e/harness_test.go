//go:build e2e

// Package e2e proves the relay against a real PostgreSQL and a real Kafka
// broker, started by test/services.sh (make test does that). Without them
// the tests fail: they are never skipped.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/test/proxy"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

var (
	svcs     *testkit.Services
	pgURL    string
	brokers  []string
	relayBin string
	logDir   string // relay logs, kept after the run for post-mortems
)

type (
	written = testkit.Event
	record  = testkit.Record
	report  = testkit.Report
)

func TestMain(m *testing.M) {
	os.Exit(mainErr(m))
}

func mainErr(m *testing.M) int {
	var err error
	if svcs, err = testkit.LoadServices(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	pgURL, brokers = svcs.PGURL, svcs.Brokers
	dir, err := os.MkdirTemp("", "outbox-relay-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	relayBin = filepath.Join(dir, "outbox-relay")
	logDir = filepath.Join(dir, "relay-logs")
	if run := os.Getenv("OUTBOX_TEST_RUN_DIR"); run != "" {
		logDir = filepath.Join(run, "relay-logs")
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	// Built with -race: the end-to-end runs double as a race check of the daemon.
	if err := testkit.BuildRelay(context.Background(), "go", relayBin, true); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	return m.Run()
}

// env is one test's private outbox: its own schema, table, publication, slot
// and topics on the shared services.
type env struct {
	*testkit.Outbox
	t     *testing.T
	name  string
	extra []string // extra relay env
	url   string   // the relay's postgres.url: the services' pgURL unless newEnvAt says
	args  []string // the relay's config flags instead of flags()' (newMappedEnv)
}

// newEnv makes a test's private outbox and migrates it; configure, when
// given, changes the outbox's names before the migration.
func newEnv(t *testing.T, name string, configure ...func(*testkit.Outbox)) *env {
	t.Helper()
	return newEnvAt(t, name, pgURL, configure...)
}

// newEnvAt is newEnv on the PostgreSQL at url (a server the test started)
// with the shared Kafka.
func newEnvAt(t *testing.T, name, url string, configure ...func(*testkit.Outbox)) *env {
	t.Helper()
	e := newEnvUnmigrated(t, name, url, configure...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append([]string{"migrate"}, e.flags()...)...); err != nil || code != 0 {
		t.Fatalf("migrate: exit %d %v\n%s", code, err, out)
	}
	return e
}

// newEnvUnmigrated is newEnvAt without the migrate: the test runs it.
func newEnvUnmigrated(t *testing.T, name, url string, configure ...func(*testkit.Outbox)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := *svcs
	s.PGURL = url
	o, err := testkit.NewOutbox(ctx, &s, "e2e", name)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range configure {
		f(o)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := o.Close(ctx); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return &env{Outbox: o, t: t, name: name, url: url}
}

func (e *env) flags() []string {
	if e.args != nil {
		return e.args
	}
	return []string{"--postgres-url", e.url, "--kafka-brokers", strings.Join(brokers, ","),
		"--slot", e.Slot, "--publication", e.Pub, "--table", e.Table,
		"--topic-template", e.Prefix + ".{aggregate_type}", "--log-format", "json",
		// The tests' topics are per test and made by the relay's first
		// produce; a test of a missing topic passes --kafka-auto-create-topics=false.
		"--kafka-auto-create-topics"}
}

func (e *env) topics() []string { return []string{e.Prefix + ".order", e.Prefix + ".payment"} }

// relay is one running relay process.
type relay struct {
	*testkit.Relay
	t *testing.T
}

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := testkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startRelay starts a relay and waits until it is ready.
func (e *env) startRelay(extraFlags ...string) *relay {
	e.t.Helper()
	r := e.launchRelay(extraFlags...)
	r.waitReady(60 * time.Second)
	return r
}

// launchRelay starts a relay without waiting for it to become ready.
func (e *env) launchRelay(extraFlags ...string) *relay {
	e.t.Helper()
	metrics := freePort(e.t)
	args := append(append([]string{"run"}, e.flags()...), "--metrics-addr", metrics)
	tr, err := testkit.StartRelay(testkit.RelayConfig{
		Bin: relayBin, Args: append(args, extraFlags...), Env: e.extra, Metrics: metrics,
		LogPath: filepath.Join(logDir, fmt.Sprintf("%s-%s-%d.log", strings.ReplaceAll(e.t.Name(), "/", "_"), e.Slot, time.Now().UnixNano()%1e6)),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	r := &relay{Relay: tr, t: e.t}
	e.t.Cleanup(func() {
		r.Kill()
		if e.t.Failed() {
			e.t.Logf("relay log %s (last 4k):\n%s", r.LogPath, r.LogTail(4096))
		}
	})
	return r
}

func tail(b []byte, n int) []byte { return []byte(testkit.Tail(string(b), n)) }

func (r *relay) waitReady(d time.Duration) {
	r.t.Helper()
	if err := r.WaitReady(d); err != nil {
		r.t.Fatalf("relay not ready: %v", err)
	}
}

func (r *relay) readyStatus() int { return r.ReadyStatus() }

// get returns the status code and body of an HTTP endpoint of the relay (0
// if it does not answer).
func (r *relay) get(path string) (int, string) {
	code, body, _ := r.Get(context.Background(), path)
	return code, string(body)
}

func (r *relay) running() bool              { return r.Running() }
func (r *relay) metric(name string) float64 { return r.Metric(name) }
func (r *relay) log() string                { return r.Log() }

// stop sends sig and waits for the exit; it returns the exit code.
func (r *relay) stop(sig syscall.Signal, d time.Duration) int {
	r.t.Helper()
	code, err := r.Stop(sig, d)
	if err != nil {
		r.t.Fatal(err)
	}
	return code
}

func svc(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := svcs.Run(ctx, args...); err != nil {
		t.Fatal(err)
	}
}

// --- writing and reading events ----------------------------------------------

// writer commits outbox rows in real transactions from one goroutine, so
// commit order is program order.
type writer struct{ *testkit.Writer }

func (e *env) newWriter(seed uint64) *writer {
	return &writer{testkit.NewWriter(e.DB, e.Table, rand.New(rand.NewPCG(seed, 99)), func(a int) string {
		if a%3 == 2 {
			return "payment"
		}
		return "order"
	})}
}

// run writes total events in transactions of 1..maxTxn events over k
// aggregates, plus a row of other in each when other != "", pacing so the
// writes take about d.
func (w *writer) run(ctx context.Context, total, maxTxn, k int, d time.Duration, other string) error {
	start := time.Now()
	for done := 0; done < total; {
		n := min(1+w.Rand.IntN(maxTxn), total-done)
		if err := w.Write(ctx, n, k, other); err != nil {
			return fmt.Errorf("write transaction after %d events: %w", done, err)
		}
		done += n
		if d > 0 {
			due := start.Add(time.Duration(float64(d) * float64(done) / float64(total)))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(due)):
			}
		}
	}
	return nil
}

func (w *writer) written() []written                         { return w.Events() }
func (w *writer) bigTxn(ctx context.Context, n, k int) error { return w.BigTxn(ctx, n, k) }

// consume reads every partition of topics from the start until it has at
// least want records and no new record came for quiet, or d passes.
func consume(t *testing.T, topics []string, want int, d, quiet time.Duration) []record {
	t.Helper()
	rs, err := testkit.ReadUntil(brokers, topics, want, d, quiet)
	return testkit.Must(t, rs, err)
}

func partitionCount(t *testing.T, topic string) int {
	t.Helper()
	parts, err := testkit.Partitions(brokers, topic)
	return testkit.Must(t, parts, err)[topic]
}

func (e *env) partitions(t *testing.T) map[string]int {
	t.Helper()
	parts, err := testkit.Partitions(brokers, e.topics()...)
	return testkit.Must(t, parts, err)
}

// check compares what the consumer read with what was committed
// (testkit.Check: loss, duplicates, order, partition, headers). The topic
// prefix is the one of the partitions' topics (prefix.<aggregate_type>).
func check(t *testing.T, ws []written, rs []record, partitions map[string]int) report {
	t.Helper()
	prefix := ""
	for tp := range partitions {
		p := tp[:max(0, strings.LastIndex(tp, "."))]
		if prefix != "" && p != prefix {
			t.Fatalf("check: topics of two prefixes, %s and %s", prefix, p)
		}
		prefix = p
	}
	return testkit.Check(ws, rs, partitions, prefix)
}

// slotLSN returns the slot's confirmed_flush_lsn.
func (e *env) slotLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	l, err := e.Confirmed(context.Background())
	return testkit.Must(t, l, err)
}

// haltedLSN is the commit LSN of the transaction of the event a halted
// relay stopped at, as its HALTED log line names it. The slot must not be
// confirmed past it: the server resends a transaction iff its commit LSN is
// at or after the confirmed position. Neither the event's own LSN nor a WAL
// position read by the test before writing it is that bound: a heartbeat
// message or another test's commit written between the event's Insert and
// its commit is decoded first and may be confirmed (both happened in a
// `make test`: the slot 0x170 and 0x428 bytes past the Insert).
func (r *relay) haltedLSN() pglogrepl.LSN {
	r.t.Helper()
	for _, line := range strings.Split(r.log(), "\n") {
		if !strings.Contains(line, `"message":"HALTED`) {
			continue
		}
		var rec struct {
			LSN    string
			Commit string `json:"commit_lsn"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err == nil && rec.Commit != "" {
			l, err1 := pglogrepl.ParseLSN(rec.LSN)
			c, err2 := pglogrepl.ParseLSN(rec.Commit)
			if err1 == nil && err2 == nil && c >= l {
				return c
			}
		}
	}
	r.t.Fatalf("no HALTED log line with an lsn:\n%s", r.LogTail(3000))
	return 0
}

func (e *env) currentLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	l, err := e.CurrentLSN(context.Background())
	return testkit.Must(t, l, err)
}

// walsenderPID returns the pid of the walsender serving the test's slot.
func (e *env) walsenderPID(t *testing.T) int {
	t.Helper()
	pid, err := e.WalsenderPID(context.Background())
	if testkit.Must(t, pid, err) == 0 {
		t.Fatalf("slot %s has no walsender", e.Slot)
	}
	return pid
}

// runRelayToExit runs the relay with the env's flags plus extra and waits
// (bounded) for it to exit; it returns the exit code and the log.
func (e *env) runRelayToExit(d time.Duration, extra ...string) (int, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	args := append(append([]string{"run"}, e.flags()...), "--metrics-addr", "")
	code, out, err := testkit.Run(ctx, append(os.Environ(), e.extra...), relayBin, append(args, extra...)...)
	if ctx.Err() != nil {
		e.t.Fatalf("relay still running after %s; it should have stopped:\n%s", d, testkit.Tail(out, 3000))
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return code, out
}

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, d, what, cond)
}

// kafkaProxy starts the test proxy on the port the broker's PROXIED
// listener advertises (test/services.sh) and returns it with the bootstrap
// address to give the relay: the test can then refuse, blackhole or reset
// every connection of that relay to Kafka.
func kafkaProxy(t *testing.T) (*proxy.Proxy, string) {
	t.Helper()
	port, target := svcs.Get("OUTBOX_TEST_KAFKA_PROXY_PORT"), svcs.Get("OUTBOX_TEST_KAFKA_PROXY_TARGET")
	if port == "" || target == "" {
		t.Fatal("OUTBOX_TEST_KAFKA_PROXY_PORT and _TARGET are not set: start the services with test/services.sh")
	}
	return startProxy(t, "127.0.0.1:"+port, target), "127.0.0.1:" + port
}

// startProxy starts a test proxy from listen to target, closed at cleanup.
func startProxy(t *testing.T, listen, target string) *proxy.Proxy {
	t.Helper()
	px, err := proxy.New(listen, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	return px
}
