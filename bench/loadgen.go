package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// shapeLoad is what one transaction shape of the generator did.
type shapeLoad struct {
	Txn          int     `json:"txn"`      // events per transaction
	AggType      string  `json:"agg_type"` // selects the topic
	Rate         float64 `json:"rate"`     // offered events/s of this shape
	Conns        int     `json:"conns"`
	Scheduled    int     `json:"scheduled"` // transactions due within the duration
	Executed     int     `json:"executed"`  // committed
	Events       int     `json:"events"`    // committed events
	Errors       int     `json:"errors"`
	FirstError   string  `json:"first_error,omitempty"`
	LateOver10ms int     `json:"late_over_10ms"` // transactions started >10 ms after their slot
}

// loadResult is what the load generator reports (JSON on stdout).
type loadResult struct {
	Rate        int         `json:"rate"` // offered events/s, all shapes
	DurationS   float64     `json:"duration_s"`
	Shapes      []shapeLoad `json:"shapes"`
	Executed    int         `json:"executed"`
	Events      int         `json:"events"`
	Errors      int         `json:"errors"`
	StartNs     int64       `json:"start_ns"` // schedule start (unix ns)
	EndNs       int64       `json:"end_ns"`   // last commit returned
	LateP50Ms   float64     `json:"late_p50_ms"`
	LateP99Ms   float64     `json:"late_p99_ms"`
	LateMaxMs   float64     `json:"late_max_ms"`
	LateOver10  int         `json:"late_over_10ms"`
	FirstLateS  float64     `json:"first_late_s"`  // when a transaction first started >10 ms late (s into the run), -1 never
	Conns       int         `json:"conns"`         // all shapes
	BackendCPUS float64     `json:"backend_cpu_s"` // CPU of the PostgreSQL backends serving the generator
}

// lateThreshold: a transaction that starts later than this after its slot
// in the schedule counts as the generator falling behind.
const lateThreshold = 10 * time.Millisecond

// loadgenMain is the open-loop load generator, run as a child process
// (`outbox-bench loadgen ...`) so its CPU is measured apart from the bench's
// consumer and samplers. The offered events/s are split evenly between the
// transaction shapes of -mix; each shape has its own fixed schedule and
// connections: transaction i is due at start + i*interval whatever happened
// before, so a slow database or relay cannot slow the load down, it shows up
// as lateness. A transaction not started by the end of the duration is not
// run (it counts as missed).
func loadgenMain(args []string) int {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	url := fs.String("pg-url", "", "PostgreSQL URL")
	table := fs.String("table", "", "outbox table")
	aggPrefix := fs.String("agg-prefix", "load", "aggregate_type = <prefix>n<rows per transaction> (selects the topic)")
	rate := fs.Int("rate", 1000, "events per second, all shapes together")
	mix := fs.String("mix", "1,10", "transaction shapes (events per transaction), comma-separated; the rate is split evenly between them")
	dur := fs.Duration("duration", 30*time.Second, "how long")
	conns := fs.Int("conns", 0, "connections per shape (0: one per 300 transactions/s, 4..32)")
	seed := fs.Uint64("seed", 1, "random seed")
	messages := fs.String("messages", "", "write the events as transactional logical decoding messages with this prefix (outbox.WriteMessage's envelope), not outbox rows")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var shapes []int
	for _, f := range strings.Split(*mix, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "loadgen: -mix %q: want positive integers\n", *mix)
			return 2
		}
		shapes = append(shapes, n)
	}
	res, err := loadgen(*url, *table, *aggPrefix, *rate, shapes, *dur, *conns, *seed, *messages)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// aggTypeFor names the aggregate_type (and so the topic) of a shape.
func aggTypeFor(prefix string, txn int) string { return fmt.Sprintf("%sn%d", prefix, txn) }

func insertSQL(table string, rows int) string {
	var sb strings.Builder
	sb.WriteString("INSERT INTO " + table + " (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ")
	for r := 0; r < rows; r++ {
		if r > 0 {
			sb.WriteString(", ")
		}
		b := r * 5
		fmt.Fprintf(&sb, "($%d, $%d, $%d, $%d, $%d)", b+1, b+2, b+3, b+4, b+5)
	}
	return sb.String()
}

// appendPayload is the client-side twin of payloadSQL (~400 bytes as jsonb
// prints it).
func appendPayload(buf []byte, agg, seq int) []byte {
	return fmt.Appendf(buf, `{"order_id":"agg-%d","seq":%d,"customer_id":"cust-%05d","status":"paid","currency":"EUR","amount":%d.%02d,`+
		`"items":[{"sku":"sku-%05d","qty":%d,"unit_price":19.99},{"sku":"sku-%05d","qty":1,"unit_price":5.5}],`+
		`"shipping":{"street":"221B Example Street","city":"Lyon","zip":"69001","country":"FR"},"note":"%s"}`,
		agg, seq, seq%9973, (seq%100000)/100, seq%100, seq%997, 1+seq%3, seq%991, noteFill)
}

var noteFill = strings.Repeat("x", 60)

// worker is one connection of one shape.
type worker struct {
	shape *shapeLoad
	conn  *pgx.Conn
	pid   int
}

// emitSQL writes a transaction's events as messages in one statement (its
// own transaction): $1 the prefix, $2 the envelopes in order.
const emitSQL = "SELECT count(pg_logical_emit_message(true, $1::text, e)) FROM unnest($2::text[]) AS e"

// appendEnvelope is outbox.WriteMessage's envelope of one event.
func appendEnvelope(buf []byte, rng *rand.Rand, aggType string, agg int, payload, headers string) []byte {
	a, c := rng.Uint64(), rng.Uint64()
	return fmt.Appendf(buf, `{"id":"%08x-%04x-4%03x-8%03x-%012x","aggregate_type":"%s","aggregate_id":"agg-%d","event_type":"order.updated","payload":%s,"headers":%s}`,
		a>>32, (a>>16)&0xffff, a&0xfff, c>>52&0xfff, c&0xffffffffffff, aggType, agg, payload, headers)
}

func loadgen(url, table, aggPrefix string, rate int, shapes []int, dur time.Duration, connsPer int, seed uint64, msgPrefix string) (*loadResult, error) {
	if rate <= 0 || len(shapes) == 0 {
		return nil, fmt.Errorf("rate and shapes must be positive")
	}
	ctx := context.Background()
	res := &loadResult{Rate: rate, DurationS: dur.Seconds(), FirstLateS: -1}
	var workers []*worker
	for _, txn := range shapes {
		sh := shapeLoad{Txn: txn, AggType: aggTypeFor(aggPrefix, txn), Rate: float64(rate) / float64(len(shapes))}
		sh.Conns = connsPer
		if sh.Conns <= 0 {
			sh.Conns = min(32, max(4, int(sh.Rate/float64(txn)/300)))
		}
		sh.Scheduled = int(dur.Seconds() * sh.Rate / float64(txn))
		res.Shapes = append(res.Shapes, sh)
	}
	sql := map[int]string{}
	for i := range res.Shapes {
		sh := &res.Shapes[i]
		sql[sh.Txn] = insertSQL(table, sh.Txn)
		if msgPrefix != "" {
			sql[sh.Txn] = emitSQL
		}
		for c := 0; c < sh.Conns; c++ {
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return nil, err
			}
			defer conn.Close(context.Background())
			w := &worker{shape: sh, conn: conn}
			if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&w.pid); err != nil {
				return nil, err
			}
			if _, err := conn.Prepare(ctx, "ins", sql[sh.Txn]); err != nil {
				return nil, err
			}
			workers = append(workers, w)
		}
		res.Conns += sh.Conns
	}
	backendCPU := func() float64 {
		var s float64
		for _, w := range workers {
			if c, err := procCPU(w.pid); err == nil {
				s += c.Seconds()
			}
		}
		return s
	}
	cpu0 := backendCPU()
	start := time.Now().Add(100 * time.Millisecond)
	deadline := start.Add(dur)
	next := make(map[*shapeLoad]*atomic.Int64)
	for i := range res.Shapes {
		next[&res.Shapes[i]] = new(atomic.Int64)
	}
	var seqs atomic.Int64
	var mu sync.Mutex
	var lates []float64 // ms
	var lastEnd time.Time
	var wg sync.WaitGroup
	for wi, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh := w.shape
			interval := float64(time.Second) * float64(sh.Txn) / sh.Rate
			rng := rand.New(rand.NewPCG(seed, uint64(wi)))
			args := make([]any, 0, 5*sh.Txn)
			var envs []string // messages: the transaction's envelopes
			var myLates []float64
			var executed, events, errs, over int
			var firstErr string
			firstLate := math.Inf(1)
			var end time.Time
			buf := make([]byte, 0, 512)
			for {
				i := next[sh].Add(1) - 1
				if i >= int64(sh.Scheduled) {
					break
				}
				due := start.Add(time.Duration(float64(i) * interval))
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				now := time.Now()
				if now.After(deadline) {
					break // behind so far that its slot is past the end: missed
				}
				late := now.Sub(due)
				myLates = append(myLates, float64(late)/float64(time.Millisecond))
				if late > lateThreshold {
					over++
					firstLate = math.Min(firstLate, due.Sub(start).Seconds())
				}
				args = args[:0]
				envs = envs[:0]
				for r := 0; r < sh.Txn; r++ {
					seq := int(seqs.Add(1))
					agg := rng.IntN(aggregates)
					buf = appendPayload(buf[:0], agg, seq)
					headers := fmt.Sprintf(`{"trace_id":"%016x%016x","tenant_id":"acme","schema_version":"2"}`, rng.Uint64(), rng.Uint64())
					if msgPrefix != "" {
						envs = append(envs, string(appendEnvelope(nil, rng, sh.AggType, agg, string(buf), headers)))
						continue
					}
					args = append(args, sh.AggType, "agg-"+strconv.Itoa(agg), "order.updated", string(buf), headers)
				}
				if msgPrefix != "" {
					args = append(args, msgPrefix, envs)
				}
				if _, err := w.conn.Exec(ctx, "ins", args...); err != nil {
					errs++
					if firstErr == "" {
						firstErr = err.Error()
					}
					continue
				}
				end = time.Now()
				executed++
				events += sh.Txn
			}
			mu.Lock()
			defer mu.Unlock()
			lates = append(lates, myLates...)
			sh.Executed += executed
			sh.Events += events
			sh.Errors += errs
			sh.LateOver10ms += over
			if sh.FirstError == "" {
				sh.FirstError = firstErr
			}
			if !math.IsInf(firstLate, 1) && (res.FirstLateS < 0 || firstLate < res.FirstLateS) {
				res.FirstLateS = firstLate
			}
			if end.After(lastEnd) {
				lastEnd = end
			}
		}()
	}
	wg.Wait()
	res.BackendCPUS = backendCPU() - cpu0
	res.StartNs = start.UnixNano()
	res.EndNs = lastEnd.UnixNano()
	for _, sh := range res.Shapes {
		res.Executed += sh.Executed
		res.Events += sh.Events
		res.Errors += sh.Errors
		res.LateOver10 += sh.LateOver10ms
	}
	slices.Sort(lates)
	res.LateP50Ms = exactQuantile(lates, 0.5)
	res.LateP99Ms = exactQuantile(lates, 0.99)
	if len(lates) > 0 {
		res.LateMaxMs = lates[len(lates)-1]
	}
	return res, nil
}
