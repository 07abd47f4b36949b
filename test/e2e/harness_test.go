//go:build e2e

// Package e2e proves the relay against a real PostgreSQL and a real Kafka
// broker, started by test/services.sh (make test does that). Without them
// the tests fail: they are never skipped.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	pgURL    string
	brokers  []string
	services string
	relayBin string
	logDir   string // relay logs, kept after the run for post-mortems
)

func TestMain(m *testing.M) {
	pgURL = os.Getenv("OUTBOX_TEST_PG_URL")
	services = os.Getenv("OUTBOX_TEST_SERVICES")
	if b := os.Getenv("OUTBOX_TEST_KAFKA_BROKERS"); b != "" {
		brokers = strings.Split(b, ",")
	}
	if pgURL == "" || len(brokers) == 0 || services == "" {
		fmt.Fprintln(os.Stderr, "FAIL: OUTBOX_TEST_PG_URL, OUTBOX_TEST_KAFKA_BROKERS and OUTBOX_TEST_SERVICES must be set; run `make test`, which starts PostgreSQL and Kafka (test/services.sh)")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "outbox-relay-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	relayBin = filepath.Join(dir, "outbox-relay")
	logDir = filepath.Join(os.Getenv("OUTBOX_TEST_RUN_DIR"), "relay-logs")
	if os.Getenv("OUTBOX_TEST_RUN_DIR") == "" {
		logDir = filepath.Join(dir, "relay-logs")
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	// Built with -race: the end-to-end runs double as a race check of the daemon.
	build := exec.Command("go", "build", "-race", "-o", relayBin, "../../cmd/outbox-relay")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: build relay:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's private outbox: its own schema, table, publication, slot
// and topics on the shared services.
type env struct {
	t      *testing.T
	name   string
	schema string
	table  string // schema.outbox
	slot   string
	pub    string
	prefix string // topic prefix
	db     *pgxpool.Pool
	extra  []string // extra relay env
}

func newEnv(t *testing.T, name string) *env {
	t.Helper()
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	e := &env{t: t, name: name,
		schema: "e2e_" + name + "_" + suffix,
		slot:   "e2e_" + name + "_" + suffix,
		pub:    "e2e_" + name + "_" + suffix,
		prefix: "e2e." + name + "." + suffix,
	}
	e.table = e.schema + ".outbox"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatalf("connect postgres: %v", err)
	}
	e.db = db
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Wait for the walsender to let go, then drop what the test made.
		for i := 0; i < 100; i++ {
			var active bool
			if err := db.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name=$1", e.slot).Scan(&active); err != nil || !active {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		db.Exec(ctx, "SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name=$1", e.slot)
		db.Exec(ctx, "DROP PUBLICATION IF EXISTS "+e.pub)
		db.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE")
		db.Close()
	})
	out, err := exec.CommandContext(ctx, relayBin, append([]string{"migrate"}, e.flags()...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	return e
}

func (e *env) flags() []string {
	return []string{"--postgres-url", pgURL, "--kafka-brokers", strings.Join(brokers, ","),
		"--slot", e.slot, "--publication", e.pub, "--table", e.table,
		"--topic-template", e.prefix + ".{aggregate_type}", "--log-format", "json"}
}

func (e *env) topics() []string { return []string{e.prefix + ".order", e.prefix + ".payment"} }

// relay is one running relay process.
type relay struct {
	t       *testing.T
	cmd     *exec.Cmd
	logPath string
	metrics string // host:port
	done    chan struct{}
	err     error
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
	r := &relay{t: e.t, metrics: freePort(e.t), done: make(chan struct{})}
	r.logPath = filepath.Join(logDir, fmt.Sprintf("%s-%s-%d.log", strings.ReplaceAll(e.t.Name(), "/", "_"), e.slot, time.Now().UnixNano()%1e6))
	f, err := os.Create(r.logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	args := append([]string{"run"}, e.flags()...)
	args = append(args, "--metrics-addr", r.metrics)
	args = append(args, extraFlags...)
	r.cmd = exec.Command(relayBin, args...)
	r.cmd.Stdout, r.cmd.Stderr = f, f
	r.cmd.Env = append(os.Environ(), e.extra...)
	if err := r.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		r.err = r.cmd.Wait()
		f.Close()
		close(r.done)
	}()
	e.t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
		if e.t.Failed() {
			b, _ := os.ReadFile(r.logPath)
			e.t.Logf("relay log %s (last 4k):\n%s", r.logPath, tail(b, 4096))
		}
	})
	return r
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (r *relay) waitReady(d time.Duration) {
	r.t.Helper()
	waitFor(r.t, d, "relay /readyz to answer 200", func() bool {
		select {
		case <-r.done:
			b, _ := os.ReadFile(r.logPath)
			r.t.Fatalf("relay exited during start: %v\n%s", r.err, tail(b, 4096))
		default:
		}
		resp, err := http.Get("http://" + r.metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func (r *relay) readyStatus() int {
	code, _ := r.get("/readyz")
	return code
}

// get returns the status code and body of an HTTP endpoint of the relay (0
// if it does not answer).
func (r *relay) get(path string) (int, string) {
	resp, err := http.Get("http://" + r.metrics + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// running reports whether the relay process has not exited.
func (r *relay) running() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// metric returns the sum of all series of a metric family, or -1 if absent.
func (r *relay) metric(name string) float64 {
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum, found := 0.0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum, found = sum+v, true
		}
	}
	if !found {
		return -1
	}
	return sum
}

// stop sends sig and waits for the exit; it returns the exit code.
func (r *relay) stop(sig syscall.Signal, d time.Duration) int {
	r.t.Helper()
	r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(d):
		r.cmd.Process.Kill()
		<-r.done
		r.t.Fatalf("relay did not exit within %s after %s", d, sig)
	}
	if r.err == nil {
		return 0
	}
	if ee, ok := r.err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

func (r *relay) log() string {
	b, _ := os.ReadFile(r.logPath)
	return string(b)
}

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

func svc(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("bash", append([]string{services}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("services.sh %v: %v\n%s", args, err, out)
	}
}

// --- writing events -------------------------------------------------------

// written is one event the test committed.
type written struct {
	ID        int64
	AggType   string
	Aggregate string
	Seq       int // 1-based position within its aggregate, in commit order
}

// writer commits outbox rows in real transactions from one goroutine, so
// commit order is program order.
type writer struct {
	e    *env
	rng  *rand.Rand
	seqs map[string]int
	mu   sync.Mutex
	all  []written
}

func (e *env) newWriter(seed uint64) *writer {
	return &writer{e: e, rng: rand.New(rand.NewPCG(seed, 99)), seqs: map[string]int{}}
}

// txn writes one transaction of n events over the given aggregates (picked
// at random from 0..k-1) plus, when other != "", one row of that table.
func (w *writer) txn(ctx context.Context, n, k int, other string) error {
	tx, err := w.e.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	var batch []written
	local := map[string]int{}
	for i := 0; i < n; i++ {
		a := w.rng.IntN(k)
		aggType := "order"
		if a%3 == 2 {
			aggType = "payment"
		}
		agg := fmt.Sprintf("%s-%d", aggType, a)
		seq := w.seqs[agg] + local[agg] + 1
		local[agg]++
		payload := fmt.Sprintf(`{"aggregate":%q,"seq":%d,"note":"caf\u00e9 \"quoted\"","amount":%d.50}`, agg, seq, a)
		headers := fmt.Sprintf(`{"trace_id":"trace-%s-%d","tenant_id":"acme","schema_version":2,"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`, agg, seq)
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO "+w.e.table+" (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ($1,$2,$3,$4,$5) RETURNING id",
			aggType, agg, aggType+".updated", payload, headers).Scan(&id); err != nil {
			return err
		}
		batch = append(batch, written{ID: id, AggType: aggType, Aggregate: agg, Seq: seq})
	}
	if other != "" {
		if _, err := tx.Exec(ctx, "INSERT INTO "+other+" (note) VALUES ('not an event')"); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	for a, c := range local {
		w.seqs[a] += c
	}
	w.all = append(w.all, batch...)
	w.mu.Unlock()
	return nil
}

// run writes total events in transactions of 1..maxTxn events over k
// aggregates, pacing so the writes take about d.
func (w *writer) run(ctx context.Context, total, maxTxn, k int, d time.Duration, other string) error {
	start := time.Now()
	done := 0
	for done < total {
		n := min(1+w.rng.IntN(maxTxn), total-done)
		if err := w.txn(ctx, n, k, other); err != nil {
			return fmt.Errorf("write transaction after %d events: %w", done, err)
		}
		done += n
		if d > 0 {
			due := start.Add(time.Duration(float64(d) * float64(done) / float64(total)))
			if s := time.Until(due); s > 0 {
				time.Sleep(s)
			}
		}
	}
	return nil
}

func (w *writer) written() []written {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]written(nil), w.all...)
}

// --- reading events -------------------------------------------------------

type record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   map[string]string
}

// consume reads every partition of topics from the start until it has at
// least want records and no new record came for quiet, or d passes.
func consume(t *testing.T, topics []string, want int, d, quiet time.Duration) []record {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Consumer.Return.Errors = true
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatalf("kafka consumer: %v", err)
	}
	defer consumer.Close()
	deadline := time.Now().Add(d)
	ch := make(chan record, 1024)
	var pcs []sarama.PartitionConsumer
	defer func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
	}()
	for _, topic := range topics {
		var parts []int32
		for {
			_ = client.RefreshMetadata(topic)
			parts, err = client.Partitions(topic)
			if err == nil && len(parts) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("topic %s never appeared: %v", topic, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, p := range parts {
			// A just-created topic may not have a leader yet: retry.
			var pc sarama.PartitionConsumer
			for {
				pc, err = consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("consume %s/%d: %v", topic, p, err)
				}
				time.Sleep(200 * time.Millisecond)
				_ = client.RefreshMetadata(topic)
			}
			pcs = append(pcs, pc)
			go func(pc sarama.PartitionConsumer) {
				for m := range pc.Messages() {
					h := map[string]string{}
					for _, rh := range m.Headers {
						h[string(rh.Key)] = string(rh.Value)
					}
					ch <- record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: m.Value, Headers: h}
				}
			}(pc)
		}
	}
	var out []record
	last := time.Now()
	for {
		select {
		case r := <-ch:
			out = append(out, r)
			last = time.Now()
		case <-time.After(50 * time.Millisecond):
		}
		if len(out) >= want && time.Since(last) >= quiet {
			return out
		}
		if time.Now().After(deadline) {
			return out
		}
	}
}

func partitionCount(t *testing.T, topic string) int {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	return len(parts)
}

// report is what a delivery check found.
type report struct {
	Written, Delivered, Lost, Duplicates, OrderViolations, PartitionViolations int
	DuplicateIDs                                                               []int64
	Problems                                                                   []string
}

// check compares what the consumer read with what was committed: every
// event at least once, per-aggregate order of first deliveries equal to
// commit order, each aggregate in the partition murmur2(key) picks, and the
// headers the relay promises.
func check(t *testing.T, ws []written, rs []record, partitions map[string]int) report {
	t.Helper()
	rep := report{Written: len(ws), Delivered: len(rs)}
	byID := map[int64]written{}
	for _, w := range ws {
		byID[w.ID] = w
	}
	seen := map[int64]int{}
	type pos struct {
		partition int32
		offset    int64
		seq       int
	}
	firsts := map[string][]pos{}
	problem := func(format string, a ...any) {
		if len(rep.Problems) < 20 {
			rep.Problems = append(rep.Problems, fmt.Sprintf(format, a...))
		}
	}
	for _, r := range rs {
		id, err := strconv.ParseInt(r.Headers["event_id"], 10, 64)
		if err != nil {
			problem("record %s/%d@%d has no numeric event_id header: %q", r.Topic, r.Partition, r.Offset, r.Headers["event_id"])
			continue
		}
		w, ok := byID[id]
		if !ok {
			problem("record event_id=%d was never written by this test", id)
			continue
		}
		seen[id]++
		if seen[id] > 1 {
			rep.Duplicates++
			rep.DuplicateIDs = append(rep.DuplicateIDs, id)
			continue
		}
		var body struct {
			Aggregate string `json:"aggregate"`
			Seq       int    `json:"seq"`
		}
		if err := json.Unmarshal(r.Value, &body); err != nil || body.Aggregate != w.Aggregate || body.Seq != w.Seq {
			problem("event_id=%d: payload %s does not match the row (aggregate %s seq %d)", id, r.Value, w.Aggregate, w.Seq)
		}
		if r.Key != w.Aggregate {
			problem("event_id=%d: key %q, want aggregate_id %q", id, r.Key, w.Aggregate)
		}
		want := map[string]string{
			"event_type": w.AggType + ".updated", "aggregate_type": w.AggType, "aggregate_id": w.Aggregate,
			"trace_id": fmt.Sprintf("trace-%s-%d", w.Aggregate, w.Seq), "tenant_id": "acme", "schema_version": "2",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		}
		for k, v := range want {
			if r.Headers[k] != v {
				problem("event_id=%d: header %s = %q, want %q", id, k, r.Headers[k], v)
			}
		}
		if _, err := pglogrepl.ParseLSN(r.Headers["pg_lsn"]); err != nil {
			problem("event_id=%d: header pg_lsn %q is not an LSN", id, r.Headers["pg_lsn"])
		}
		if n := partitions[r.Topic]; n > 0 {
			if p := javaPartition([]byte(r.Key), n); p != r.Partition {
				rep.PartitionViolations++
				problem("event_id=%d key %q in partition %d, murmur2 says %d of %d", id, r.Key, r.Partition, p, n)
			}
		}
		firsts[w.Aggregate] = append(firsts[w.Aggregate], pos{r.Partition, r.Offset, w.Seq})
	}
	for _, w := range ws {
		if seen[w.ID] == 0 {
			rep.Lost++
			problem("event_id=%d (%s seq %d) never arrived", w.ID, w.Aggregate, w.Seq)
		}
	}
	for agg, ps := range firsts {
		for i := 1; i < len(ps); i++ {
			if ps[i].partition != ps[0].partition {
				rep.PartitionViolations++
				problem("aggregate %s spread over partitions %d and %d", agg, ps[0].partition, ps[i].partition)
				break
			}
		}
		// Records of one partition were appended in offset order per
		// partition consumer; sort defensively by offset.
		sortPos(ps, func(a, b pos) bool { return a.offset < b.offset })
		for i := 1; i < len(ps); i++ {
			if ps[i].seq < ps[i-1].seq {
				rep.OrderViolations++
				problem("aggregate %s: seq %d read after seq %d", agg, ps[i].seq, ps[i-1].seq)
			}
		}
	}
	return rep
}

func sortPos[T any](s []T, less func(a, b T) bool) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && less(s[j], s[j-1]); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// javaPartition is the Java client's default partitioner for a keyed record:
// toPositive(murmur2(key)) % partitions, written from the Java source's
// algorithm (seed 0x9747b28c), independent of sarama's implementation.
func javaPartition(key []byte, partitions int) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	length := len(key)
	h := seed ^ uint32(length)
	n := length / 4
	for i := 0; i < n; i++ {
		k := uint32(key[i*4]) | uint32(key[i*4+1])<<8 | uint32(key[i*4+2])<<16 | uint32(key[i*4+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	rest := key[n*4:]
	switch len(rest) {
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
	return int32((int32(h) & 0x7fffffff) % int32(partitions))
}

func (e *env) partitions(t *testing.T) map[string]int {
	out := map[string]int{}
	for _, tp := range e.topics() {
		out[tp] = partitionCount(t, tp)
	}
	return out
}

// slotLSN returns the slot's confirmed_flush_lsn.
func (e *env) slotLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := e.db.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name=$1", e.slot).Scan(&s); err != nil {
		t.Fatalf("read slot %s: %v", e.slot, err)
	}
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (e *env) currentLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := e.db.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		t.Fatal(err)
	}
	l, _ := pglogrepl.ParseLSN(s)
	return l
}

var _ = pgx.ErrNoRows

// bigTxn commits n events in ONE transaction with a single INSERT ... SELECT,
// over k fresh "order" aggregates. Use it on a writer that wrote nothing yet.
func (w *writer) bigTxn(ctx context.Context, n, k int) error {
	rows, err := w.e.db.Query(ctx, `INSERT INTO `+w.e.table+` (aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT 'order', 'order-' || (g % $2) * 3, 'order.updated',
		       jsonb_build_object('aggregate', 'order-' || (g % $2) * 3, 'seq', g / $2 + 1),
		       jsonb_build_object('trace_id', 'trace-order-' || (g % $2) * 3 || '-' || (g / $2 + 1), 'tenant_id', 'acme',
		                          'schema_version', 2, 'traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')
		FROM generate_series(0, $1 - 1) AS g ORDER BY g
		RETURNING id, aggregate_id, (payload->>'seq')::int`, n, k)
	if err != nil {
		return err
	}
	defer rows.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	for rows.Next() {
		var x written
		if err := rows.Scan(&x.ID, &x.Aggregate, &x.Seq); err != nil {
			return err
		}
		x.AggType = "order"
		w.all = append(w.all, x)
		w.seqs[x.Aggregate] = max(w.seqs[x.Aggregate], x.Seq)
	}
	return rows.Err()
}

// walsenderPID returns the pid of the walsender serving the test's slot.
func (e *env) walsenderPID(t *testing.T) int {
	t.Helper()
	var pid *int
	if err := e.db.QueryRow(context.Background(), "SELECT active_pid FROM pg_replication_slots WHERE slot_name=$1", e.slot).Scan(&pid); err != nil {
		t.Fatalf("read slot %s: %v", e.slot, err)
	}
	if pid == nil {
		t.Fatalf("slot %s has no walsender", e.slot)
	}
	return *pid
}

// runRelayToExit runs the relay with the env's flags plus extra and waits
// (bounded) for it to exit; it returns the exit code and the log.
func (e *env) runRelayToExit(d time.Duration, extra ...string) (int, string) {
	e.t.Helper()
	args := append(append([]string{"run"}, e.flags()...), "--metrics-addr", "")
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, relayBin, append(args, extra...)...)
	cmd.Env = append(os.Environ(), e.extra...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		e.t.Fatalf("relay still running after %s; it should have stopped:\n%s", d, tail(out, 3000))
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return 0, string(out)
}
