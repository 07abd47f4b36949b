package main

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/proxy"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// The "curves" part (issue 16): how the relay's cost grows with the work.
// Five families, each a few backlogs drained by a fresh relay (defaults,
// --leader-election=false) from a slot made before the backlog:
//
//   - payload: 100 B .. 100 KB per event, the same payload bytes per point,
//     next to a plain sarama producer writing the same records (the broker's
//     own ingest limit, the reference);
//   - topics: 1 .. 1,000 distinct topics (aggregate_type), RSS and goroutines;
//   - aggregates: keys drawn from 10k .. 10M key spaces, RSS;
//   - bigtxn: one transaction of many rows, committed before the relay
//     starts: relay start -> first ack, peak RSS;
//   - rtt: the 100-row drain direct, and through test/proxy with +0 and
//     +1 ms round trip to Kafka and to PostgreSQL.
//
// The fill is the bench's kind (a PL/pgSQL procedure that COMMITs in its
// loop) with the payload size, key space and topic count as parameters.

// curveScale is the size of each family's backlogs.
type curveScale struct {
	PayloadBytes  int64 // payload bytes per payload point (events = bytes/size)
	TopicEvents   int
	AggEvents     int
	BigTxnRows    int
	RTTEvents     int
	Payloads      []int
	Topics        []int
	Aggregates    []int
	PerTxn        int           // rows per transaction (all but bigtxn)
	RTT           time.Duration // added round trip
	TopicParts    int32         // partitions of each topic of the topics family
	DefaultParts  int32
	ReferenceReps int
}

func curveScaleFor(name string) curveScale {
	c := curveScale{Payloads: []int{100, 1000, 10_000, 100_000}, Topics: []int{1, 10, 100, 1000},
		Aggregates: []int{10_000, 100_000, 1_000_000, 10_000_000}, PerTxn: 100, RTT: time.Millisecond,
		TopicParts: 1, DefaultParts: 4, ReferenceReps: 1}
	if strings.HasPrefix(name, "small") {
		c.PayloadBytes, c.TopicEvents, c.AggEvents, c.BigTxnRows, c.RTTEvents = 5<<20, 10_000, 20_000, 50_000, 10_000
	} else {
		c.PayloadBytes, c.TopicEvents, c.AggEvents, c.BigTxnRows, c.RTTEvents = 50<<20, 200_000, 300_000, 1_000_000, 200_000
	}
	return c
}

// curvePoint is one measured point.
type curvePoint struct {
	Family  string
	Label   string
	X       float64
	Events  int
	Bytes   int64   // payload bytes of the backlog
	Seconds float64 // relay start -> every event acked
	FirstS  float64 // relay start -> first event acked
	ConfS   float64 // relay start -> confirmed_flush_lsn >= end
	EvPerS  float64
	MBPerS  float64 // payload MB/s (1e6 bytes)
	// Broker reference (payload family): a plain sarama producer, same records.
	RefEvPerS  float64
	RefMBPerS  float64
	RefBroker  float64 // broker CPU s during the reference
	RefSeconds float64
	RelayCPU   float64 // s, whole process life
	Walsender  float64 // s
	Broker     float64 // s
	PeakRSS    int64   // VmHWM
	Goroutines float64 // largest go_goroutines sampled
	Distinct   int64   // distinct aggregate_ids (aggregates family)
	FillS      float64
	Note       string
	Load       string // 1-minute load average at the end of the drain
	DiskW      int64  // bytes the relay wrote to / read from disk (/proc/<pid>/io: the spool)
	DiskR      int64
	// Whole machine over the drain, from /proc/stat: busy (not idle, not
	// iowait) and iowait shares of all CPUs' time (NaN if unread).
	MachBusy   float64
	MachIOWait float64
	Binds      string
	Err        string
}

// coreShare is CPU seconds per wall second (cores).
func coreShare(cpu, wall float64) float64 {
	if wall <= 0 || math.IsNaN(cpu) {
		return math.NaN()
	}
	return cpu / wall
}

// curvesResult is the curves part.
type curvesResult struct {
	Scale   curveScale
	Points  []*curvePoint
	Elapsed time.Duration
	Cores   int
}

func (c *curvesResult) family(f string) []*curvePoint {
	var out []*curvePoint
	for _, p := range c.Points {
		if p.Family == f {
			out = append(out, p)
		}
	}
	return out
}

const curvesFillSQL = `CREATE OR REPLACE PROCEDURE %[1]s.curves_fill(p_from bigint, p_n bigint, p_per_txn int, p_aggs bigint, p_topics int, p_size int, p_prefix text)
LANGUAGE plpgsql AS $proc$
DECLARE
	i bigint := p_from;
	stop bigint := p_from + p_n;
	k bigint;
	pad text := '';
BEGIN
	-- Incompressible-looking filler (hex of md5s), so TOAST compression does
	-- not shrink the WAL of the big payloads; the payload column is stored
	-- EXTERNAL (uncompressed) for the same reason.
	WHILE length(pad) < greatest(p_size - 32, 1) LOOP
		pad := pad || md5(length(pad)::text);
	END LOOP;
	pad := substr(pad, 1, greatest(p_size - 32, 1));
	WHILE i < stop LOOP
		k := least(p_per_txn, stop - i);
		INSERT INTO %[2]s (aggregate_type, aggregate_id, event_type, payload)
		SELECT CASE WHEN p_topics = 1 THEN p_prefix ELSE p_prefix || (g %% p_topics) END,
			'agg-' || ((hashint8(g)::bigint + 2147483648) %% p_aggs), 'curve',
			jsonb_build_object('seq', g, 'pad', pad)
		FROM generate_series(i, i + k - 1) AS g;
		i := i + k;
		COMMIT;
	END LOOP;
END
$proc$`

func (b *bench) curvesSetup(ctx context.Context) error {
	for _, s := range []string{
		fmt.Sprintf(curvesFillSQL, b.pg.schema, b.pg.table),
		`ALTER TABLE ` + b.pg.table + ` ALTER COLUMN payload SET STORAGE EXTERNAL`,
	} {
		if _, err := b.pg.pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("curves setup: %w", err)
		}
	}
	return nil
}

// curvesFill commits n events from `sessions` procedures and returns the WAL
// position after the last commit, flushed.
func (b *bench) curvesFill(ctx context.Context, n, perTxn int, aggs int64, topics, size int, prefix string) (int64, error) {
	sessions := max(1, min(b.fillSessions, n/max(perTxn, 1)))
	per := (n + sessions - 1) / sessions
	per = (per + perTxn - 1) / perTxn * perTxn
	errc := make(chan error, sessions)
	launched := 0
	for s := 0; s < sessions; s++ {
		from, cnt := s*per, min(per, n-s*per)
		if cnt <= 0 {
			break
		}
		launched++
		go func(from, cnt int) {
			conn, err := b.pg.pool.Acquire(ctx)
			if err != nil {
				errc <- err
				return
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
				errc <- err
				return
			}
			_, err = conn.Exec(ctx, "CALL "+b.pg.schema+".curves_fill($1, $2, $3, $4, $5, $6, $7)",
				int64(from), int64(cnt), perTxn, aggs, topics, size, prefix)
			conn.Exec(context.WithoutCancel(ctx), "RESET synchronous_commit")
			errc <- err
		}(from, cnt)
	}
	for i := 0; i < launched; i++ {
		if err := <-errc; err != nil {
			return 0, fmt.Errorf("curves fill: %w", err)
		}
	}
	end, err := b.pg.lsn(ctx, "pg_current_wal_insert_lsn()")
	if err != nil {
		return 0, err
	}
	if _, err := b.pg.pool.Exec(ctx, "SELECT pg_current_wal_flush_lsn()"); err != nil {
		return 0, err
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		f, err := b.pg.lsn(ctx, "pg_current_wal_flush_lsn()")
		if err != nil {
			return 0, err
		}
		if f >= end {
			return end, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("WAL not flushed to %s after 1m", fmtLSN(end))
		}
	}
}

// curveEnv is where a relay of one point connects.
type curveEnv struct {
	pgURL   string   // "" = direct
	brokers []string // nil = direct
}

// curveDrain runs a relay from slot until every event is acked (and the slot
// confirmed end), sampling RSS, goroutines and CPU.
func (b *bench) curveDrain(ctx context.Context, p *curvePoint, slot string, end int64, prefix string, env curveEnv, extra ...string) {
	p.FirstS, p.Walsender, p.RelayCPU, p.Broker, p.ConfS = math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()
	savedURL, savedBrokers := b.pg.url, b.brokers
	if env.pgURL != "" {
		b.pg.url = env.pgURL
	}
	if env.brokers != nil {
		b.brokers = env.brokers
	}
	broker0 := b.brokerCPU()
	stat0, stat0ok := readCPUStat()
	p.MachBusy, p.MachIOWait = math.NaN(), math.NaN()
	rp, err := b.startRelay("curve-"+strings.TrimPrefix(prefix, b.topicPrefix), slot, prefix+".{aggregate_type}", extra...)
	b.pg.url, b.brokers = savedURL, savedBrokers
	if err != nil {
		p.Err = err.Error()
		return
	}
	defer rp.stop()
	var ws *cpuSampler
	if pid := b.pg.walsenderPID(ctx, slot, rp.running, 60*time.Second); pid != 0 {
		ws = sampleCPU(pid, 50*time.Millisecond)
	}
	deadline := rp.started.Add(b.drainTimeout(p.Events) + 2*time.Minute)
	for {
		if err := rp.exited(); err != nil {
			p.Err = err.Error()
			return
		}
		ss, err := rp.scrape()
		if err == nil {
			n, _ := testkit.SumMetric(ss, "outbox_relay_events_published_total", nil)
			if g, ok := testkit.SumMetric(ss, "go_goroutines", nil); ok && g > p.Goroutines {
				p.Goroutines = g
			}
			if n > 0 && math.IsNaN(p.FirstS) {
				p.FirstS = time.Since(rp.started).Seconds()
			}
			if n >= float64(p.Events) {
				p.Seconds = time.Since(rp.started).Seconds()
				break
			}
		}
		if time.Now().After(deadline) {
			p.Err = fmt.Sprintf("not every event acked after %s", time.Since(rp.started).Round(time.Second))
			return
		}
		select {
		case <-ctx.Done():
			p.Err = ctx.Err().Error()
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	if cpu, err := procCPU(rp.pid); err == nil {
		p.RelayCPU = cpu.Seconds()
	}
	if ws != nil {
		if c, ok := ws.Stop(); ok {
			p.Walsender = c.Seconds()
		}
	}
	p.Broker = b.brokerCPU() - broker0
	if stat1, ok := readCPUStat(); ok && stat0ok {
		p.MachBusy, p.MachIOWait = stat1.since(stat0)
	}
	p.EvPerS = float64(p.Events) / p.Seconds
	p.MBPerS = float64(p.Bytes) / 1e6 / p.Seconds
	// Acked means the slot may be confirmed; wait for it (not timed: the
	// status update follows within status_interval).
	for d := time.Now().Add(30 * time.Second); time.Now().Before(d); time.Sleep(50 * time.Millisecond) {
		if c, _, err := b.pg.slotState(ctx, slot); err == nil && c >= end {
			p.ConfS = time.Since(rp.started).Seconds()
			break
		}
	}
	if math.IsNaN(p.ConfS) {
		p.Err = "every event acked but the slot not confirmed to the end within 30s"
	}
	if _, hwm, err := procMem(rp.pid); err == nil {
		p.PeakRSS = hwm
	}
	p.Load = strings.Fields(loadAvg() + " ?")[0]
	p.DiskW, p.DiskR = procIO(rp.pid)
}

// cpuStat is the first line of /proc/stat: jiffies of all CPUs.
type cpuStat struct{ total, idle, iowait float64 }

func readCPUStat() (cpuStat, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuStat{}, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return cpuStat{}, false
	}
	var c cpuStat
	for i, x := range f[1:] {
		v, _ := strconv.ParseFloat(x, 64)
		if i >= 8 { // guest time is already in user
			break
		}
		c.total += v
		switch i {
		case 3:
			c.idle = v
		case 4:
			c.iowait = v
		}
	}
	return c, true
}

// since returns the busy and iowait shares of the machine's CPU time
// between two readings.
func (c cpuStat) since(c0 cpuStat) (busy, iowait float64) {
	d := c.total - c0.total
	if d <= 0 {
		return math.NaN(), math.NaN()
	}
	return (d - (c.idle - c0.idle) - (c.iowait - c0.iowait)) / d, (c.iowait - c0.iowait) / d
}

// procIO returns write_bytes and read_bytes of /proc/<pid>/io: what the
// process made the kernel write to and read from the block device (its
// spool files; 0, 0 if unreadable).
func procIO(pid int) (w, r int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "write_bytes":
			w = n
		case "read_bytes":
			r = n
		}
	}
	return w, r
}

// runCurves measures every family.
func (b *bench) runCurves(ctx context.Context) *curvesResult {
	t0 := time.Now()
	cs := curveScaleFor(b.sc.Name)
	res := &curvesResult{Scale: cs, Cores: b.cores()}
	defer func() { res.Elapsed = time.Since(t0) }()
	if err := b.curvesSetup(ctx); err != nil {
		res.Points = append(res.Points, &curvePoint{Family: "setup", Err: err.Error()})
		return res
	}
	add := func(p *curvePoint) {
		p.Binds = bindsAt(p, res.Cores)
		res.Points = append(res.Points, p)
		if p.Err != "" {
			logf("curves %s %s: FAILED: %s", p.Family, p.Label, p.Err)
			return
		}
		logf("curves %s %s: %d events in %.2fs (%.0f events/s, %.1f MB/s; first ack %.2fs), relay CPU %.2fs, walsender %.2fs, broker %.2fs, HWM %d MiB, goroutines %.0f; binds: %s",
			p.Family, p.Label, p.Events, p.Seconds, p.EvPerS, p.MBPerS, p.FirstS, p.RelayCPU, p.Walsender, p.Broker, p.PeakRSS>>20, p.Goroutines, p.Binds)
	}
	// One backlog behind one slot per point: fill, drain, drop, truncate.
	one := func(p *curvePoint, tag string, aggs int64, topics, size int, parts int32, topicNames func(prefix string) []string) {
		var extra []string
		if topics > 100 { // kafka.max_topics defaults to 100: more would be poison
			extra = []string{"--kafka-max-topics", fmt.Sprint(topics)}
		}
		if ctx.Err() != nil {
			return
		}
		slot := fmt.Sprintf("%s_c_%s", b.pg.schema, tag)
		prefix := b.topicPrefix + "c" + tag
		defer b.pg.truncate(context.WithoutCancel(ctx))
		if _, err := b.pg.createSlot(ctx, slot); err != nil {
			p.Err = err.Error()
			add(p)
			return
		}
		defer b.pg.dropSlot(context.WithoutCancel(ctx), slot)
		names := topicNames(prefix)
		if err := b.kafka.createTopicsBatch(names, parts); err != nil {
			p.Err = err.Error()
			add(p)
			return
		}
		defer b.kafka.deleteTopicsBatch(names)
		ft := time.Now()
		end, err := b.curvesFill(ctx, p.Events, cs.PerTxn, aggs, topics, size, "t")
		if err != nil {
			p.Err = err.Error()
			add(p)
			return
		}
		p.FillS = time.Since(ft).Seconds()
		if p.Family == "aggregates" {
			b.pg.pool.QueryRow(ctx, "SELECT count(DISTINCT aggregate_id) FROM "+b.pg.table).Scan(&p.Distinct)
		}
		b.curveDrain(ctx, p, slot, end, prefix, curveEnv{}, extra...)
		add(p)
	}
	single := func(prefix string) []string { return []string{prefix + ".t"} }
	fams := map[string]bool{}
	for _, f := range strings.Split(getenv("OUTBOX_BENCH_CURVES", "payload,topics,aggregates,bigtxn,rtt"), ",") {
		fams[strings.TrimSpace(f)] = true
	}

	// Payload size: the same payload bytes per point.
	for _, size := range cs.Payloads {
		if !fams["payload"] {
			break
		}
		n := int(cs.PayloadBytes / int64(size))
		p := &curvePoint{Family: "payload", Label: sizeLabel(size), X: float64(size), Events: n, Bytes: int64(n) * int64(size)}
		one(p, fmt.Sprintf("p%d", size), 10_000, 1, size, cs.DefaultParts, single)
		if p.Err == "" && ctx.Err() == nil {
			b.brokerReference(p, size, cs.DefaultParts)
			p.Binds = bindsAt(p, res.Cores)
			logf("curves payload %s: broker reference (plain sarama producer) %.0f events/s, %.1f MB/s; relay/reference %.2f", p.Label, p.RefEvPerS, p.RefMBPerS, p.EvPerS/p.RefEvPerS)
		}
	}
	// Topics.
	for _, nt := range cs.Topics {
		if !fams["topics"] {
			break
		}
		p := &curvePoint{Family: "topics", Label: fmt.Sprint(nt), X: float64(nt), Events: cs.TopicEvents, Bytes: int64(cs.TopicEvents) * 400}
		one(p, fmt.Sprintf("t%d", nt), 10_000, nt, 400, cs.TopicParts, func(prefix string) []string {
			if nt == 1 {
				return single(prefix)
			}
			out := make([]string, nt)
			for i := range out {
				out[i] = fmt.Sprintf("%s.t%d", prefix, i)
			}
			return out
		})
	}
	// Aggregates: keys drawn uniformly from the key space.
	for _, na := range cs.Aggregates {
		if !fams["aggregates"] {
			break
		}
		p := &curvePoint{Family: "aggregates", Label: countLabel(na), X: float64(na), Events: cs.AggEvents, Bytes: int64(cs.AggEvents) * 400}
		one(p, fmt.Sprintf("a%d", na), int64(na), 1, 400, cs.DefaultParts, single)
	}
	if ctx.Err() == nil && fams["bigtxn"] {
		add(b.curveBigTxn(ctx, cs))
	}
	if fams["rtt"] {
		for _, p := range b.curveRTT(ctx, cs) {
			add(p)
		}
	}
	return res
}

// curveBigTxn: one transaction of BigTxnRows rows committed behind a slot,
// then a relay (postgres.streaming auto: the server streams it to the relay,
// which spools it to disk until the commit) from start to first and last ack.
func (b *bench) curveBigTxn(ctx context.Context, cs curveScale) *curvePoint {
	p := &curvePoint{Family: "bigtxn", Label: countLabel(cs.BigTxnRows) + " rows", X: float64(cs.BigTxnRows), Events: cs.BigTxnRows, Bytes: int64(cs.BigTxnRows) * 400}
	slot := b.pg.schema + "_c_big"
	prefix := b.topicPrefix + "cbig"
	defer b.pg.truncate(context.WithoutCancel(ctx))
	if _, err := b.pg.createSlot(ctx, slot); err != nil {
		p.Err = err.Error()
		return p
	}
	defer b.pg.dropSlot(context.WithoutCancel(ctx), slot)
	names := []string{prefix + ".t"}
	if err := b.kafka.createTopicsBatch(names, 4); err != nil {
		p.Err = err.Error()
		return p
	}
	defer b.kafka.deleteTopicsBatch(names)
	ft := time.Now()
	end, err := b.curvesFill(ctx, cs.BigTxnRows, cs.BigTxnRows, 10_000, 1, 400, "t")
	if err != nil {
		p.Err = err.Error()
		return p
	}
	p.FillS = time.Since(ft).Seconds()
	b.curveDrain(ctx, p, slot, end, prefix, curveEnv{})
	return p
}

// curveRTT: one 100 rows/txn backlog behind five slots, drained direct,
// through the proxy to Kafka (+0, +RTT) and to PostgreSQL (+0, +RTT).
func (b *bench) curveRTT(ctx context.Context, cs curveScale) []*curvePoint {
	type leg struct {
		label string
		kafka bool
		pg    bool
		rtt   time.Duration
	}
	legs := []leg{{"direct", false, false, 0}, {"Kafka via proxy +0", true, false, 0}, {"Kafka via proxy +" + cs.RTT.String(), true, false, cs.RTT},
		{"PostgreSQL via proxy +0", false, true, 0}, {"PostgreSQL via proxy +" + cs.RTT.String(), false, true, cs.RTT}}
	var pts []*curvePoint
	fail := func(err error) []*curvePoint {
		for _, l := range legs {
			pts = append(pts, &curvePoint{Family: "rtt", Label: l.label, Err: err.Error()})
		}
		return pts
	}
	if ctx.Err() != nil {
		return nil
	}
	proxyPort, target := b.env["OUTBOX_TEST_KAFKA_PROXY_PORT"], b.env["OUTBOX_TEST_KAFKA_PROXY_TARGET"]
	if proxyPort == "" || target == "" {
		return fail(fmt.Errorf("the env file has no OUTBOX_TEST_KAFKA_PROXY_PORT / _TARGET (the broker's PROXIED listener)"))
	}
	kp, err := proxy.New("127.0.0.1:"+proxyPort, target)
	if err != nil {
		return fail(err)
	}
	defer kp.Close()
	u, err := url.Parse(b.pg.url)
	if err != nil {
		return fail(err)
	}
	pp, err := proxy.New("127.0.0.1:0", u.Host)
	if err != nil {
		return fail(err)
	}
	defer pp.Close()
	pu := *u
	pu.Host = pp.Addr()
	slots := make([]string, len(legs))
	for i := range legs {
		slots[i] = fmt.Sprintf("%s_c_rtt%d", b.pg.schema, i)
		if _, err := b.pg.createSlot(ctx, slots[i]); err != nil {
			return fail(err)
		}
		defer b.pg.dropSlot(context.WithoutCancel(ctx), slots[i])
	}
	defer b.pg.truncate(context.WithoutCancel(ctx))
	ft := time.Now()
	end, err := b.curvesFill(ctx, cs.RTTEvents, cs.PerTxn, 10_000, 1, 400, "t")
	if err != nil {
		return fail(err)
	}
	fill := time.Since(ft).Seconds()
	for i, l := range legs {
		if ctx.Err() != nil {
			break
		}
		p := &curvePoint{Family: "rtt", Label: l.label, X: float64(i), Events: cs.RTTEvents, Bytes: int64(cs.RTTEvents) * 400, FillS: fill}
		prefix := fmt.Sprintf("%scrtt%d", b.topicPrefix, i)
		names := []string{prefix + ".t"}
		if err := b.kafka.createTopicsBatch(names, cs.DefaultParts); err != nil {
			p.Err = err.Error()
			pts = append(pts, p)
			continue
		}
		env := curveEnv{}
		kp.SetDelay(0)
		pp.SetDelay(0)
		if l.kafka {
			env.brokers = []string{"127.0.0.1:" + proxyPort}
			kp.SetDelay(l.rtt / 2)
		}
		if l.pg {
			env.pgURL = pu.String()
			pp.SetDelay(l.rtt / 2)
		}
		if l.rtt > 0 {
			p.Note = fmt.Sprintf("proxy delay %s each way", l.rtt/2)
		}
		b.curveDrain(ctx, p, slots[i], end, prefix, env)
		b.kafka.deleteTopicsBatch(names)
		pts = append(pts, p)
	}
	return pts
}

// brokerReference writes the point's records (same count, key space, value
// size, partitions) with a plain sarama producer configured like the relay's
// (idempotent, acks=all, one request in flight, murmur2, 1 ms flush), and
// times first send to last ack.
func (b *bench) brokerReference(p *curvePoint, size int, parts int32) {
	topic := fmt.Sprintf("%sref%d", b.topicPrefix, size)
	if err := b.kafka.createTopicsBatch([]string{topic}, parts); err != nil {
		p.Err = "reference: " + err.Error()
		return
	}
	defer b.kafka.deleteTopicsBatch([]string{topic})
	cfg := saramaCfg()
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Partitioner = sarama.NewMurmur2Partitioner
	cfg.Producer.Flush.Frequency = time.Millisecond
	cfg.Producer.MaxMessageBytes = 1000000
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	pr, err := sarama.NewAsyncProducer(b.brokers, cfg)
	if err != nil {
		p.Err = "reference: " + err.Error()
		return
	}
	defer pr.Close()
	val := make([]byte, size)
	for i := range val {
		val[i] = "0123456789abcdef"[(i*7+i/16)%16]
	}
	broker0 := b.brokerCPU()
	t0 := time.Now()
	done := make(chan error, 1)
	go func() {
		var first error
		for i := 0; i < p.Events; i++ {
			select {
			case <-pr.Successes():
			case e := <-pr.Errors():
				if first == nil {
					first = e.Err
				}
			}
		}
		done <- first
	}()
	for i := 0; i < p.Events; i++ {
		pr.Input() <- &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("agg-%d", i%10_000)), Value: sarama.ByteEncoder(val)}
	}
	if err := <-done; err != nil {
		p.Err = "reference: " + err.Error()
		return
	}
	p.RefSeconds = time.Since(t0).Seconds()
	p.RefBroker = b.brokerCPU() - broker0
	p.RefEvPerS = float64(p.Events) / p.RefSeconds
	p.RefMBPerS = float64(p.Bytes) / 1e6 / p.RefSeconds
}

// bindsAt names the resource that limits a point, from the CPU shares
// measured over the relay's drain (cores: CPU s / wall s).
func bindsAt(p *curvePoint, cores int) string {
	if p.Err != "" || p.Seconds <= 0 {
		return "n/a"
	}
	rel, ws, br := coreShare(p.RelayCPU, p.Seconds), coreShare(p.Walsender, p.Seconds), coreShare(p.Broker, p.Seconds)
	tot := 0.0
	for _, x := range []float64{rel, ws, br} {
		if !math.IsNaN(x) {
			tot += x
		}
	}
	shares := fmt.Sprintf("relay %.2f, walsender %.2f, broker %.2f cores", rel, ws, br)
	if !math.IsNaN(p.MachBusy) {
		shares += fmt.Sprintf("; machine %.0f%% busy, %.0f%% iowait", 100*p.MachBusy, 100*p.MachIOWait)
	}
	switch {
	case p.Family == "payload" && p.RefEvPerS > 0 && p.EvPerS >= 0.8*p.RefEvPerS:
		return "broker ingest (relay >= 0.8x the plain producer; " + shares + ")"
	case ws >= 0.8:
		return "walsender CPU (" + shares + ")"
	case rel >= 0.8 && rel >= br:
		return "relay CPU (" + shares + ")"
	case br >= 0.8:
		return "broker CPU (" + shares + ")"
	case tot >= 0.85*float64(cores):
		return fmt.Sprintf("machine CPU: all %d cores busy (%s)", cores, shares)
	case p.MachBusy >= 0.9:
		// The machine is busy but not with these three: other load takes
		// the cores, and the pipeline gets what is left.
		return "machine CPU, taken by other load (" + shares + ")"
	case p.MachIOWait >= 0.2:
		return "disk (" + shares + ")"
	case strings.Contains(p.Label, "proxy +") && !strings.HasSuffix(p.Label, "+0"):
		return "network RTT (" + shares + ")"
	case strings.Contains(p.Label, "proxy"):
		return "proxy hop (" + shares + ")"
	case p.Family == "bigtxn":
		// Nothing saturated: the time goes to receiving the whole streamed
		// transaction into the spool before the first event can be sent.
		return fmt.Sprintf("streaming + spool: the relay spooled %.0f MB to disk before its first ack (%s; load %s)", float64(p.DiskW)/1e6, shares, p.Load)
	}
	// Nothing saturated (a loaded machine gives no process a whole core):
	// the largest share is the likeliest limit.
	name, top := "relay CPU", rel
	if ws > top {
		name, top = "walsender CPU", ws
	}
	if br > top {
		name = "broker CPU"
	}
	return fmt.Sprintf("none saturated; largest share: %s (%s; load %s)", name, shares, p.Load)
}

// cores is the number of CPUs the services share.
func (b *bench) cores() int { return b.machineCores }

func sizeLabel(n int) string {
	switch {
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%d KB", n/1000)
	}
	return fmt.Sprintf("%d B", n)
}

func countLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// createTopicsBatch creates topics in one CreateTopics request per 100 and
// waits for their leaders (1,000 topics one by one take minutes).
func (k *kafka) createTopicsBatch(topics []string, parts int32) error {
	k.mu.Lock()
	k.created = append(k.created, topics...)
	k.mu.Unlock()
	ctrl, err := k.client.Controller()
	if err != nil {
		return fmt.Errorf("kafka controller: %w", err)
	}
	for i := 0; i < len(topics); i += 100 {
		details := map[string]*sarama.TopicDetail{}
		for _, t := range topics[i:min(i+100, len(topics))] {
			details[t] = &sarama.TopicDetail{NumPartitions: parts, ReplicationFactor: 1}
		}
		req := sarama.NewCreateTopicsRequest(k.client.Config().Version, details, 30*time.Second, false)
		resp, err := ctrl.CreateTopics(req)
		if err != nil {
			return fmt.Errorf("create topics: %w", err)
		}
		for t, e := range resp.TopicErrors {
			if e != nil && e.Err != sarama.ErrNoError && e.Err != sarama.ErrTopicAlreadyExists {
				return fmt.Errorf("create topic %s: %v", t, e.Err)
			}
		}
	}
	return testkit.Poll(60*time.Second, 100*time.Millisecond, func() (bool, error) {
		if err := k.client.RefreshMetadata(topics...); err != nil {
			return false, nil
		}
		for _, t := range topics {
			ps, err := k.client.Partitions(t)
			if err != nil || len(ps) != int(parts) {
				return false, nil
			}
			for _, p := range ps {
				if _, err := k.client.Leader(t, p); err != nil {
					return false, nil
				}
			}
		}
		return true, nil
	})
}

// deleteTopicsBatch deletes topics, 100 per request.
func (k *kafka) deleteTopicsBatch(topics []string) {
	ctrl, err := k.client.Controller()
	if err != nil {
		logf("delete topics: %v", err)
		return
	}
	for i := 0; i < len(topics); i += 100 {
		req := sarama.NewDeleteTopicsRequest(k.client.Config().Version, topics[i:min(i+100, len(topics))], 30*time.Second)
		if _, err := ctrl.DeleteTopics(req); err != nil {
			logf("delete topics: %v", err)
		}
	}
	k.mu.Lock()
	drop := map[string]bool{}
	for _, t := range topics {
		drop[t] = true
	}
	out := k.created[:0]
	for _, t := range k.created {
		if !drop[t] {
			out = append(out, t)
		}
	}
	k.created = out
	k.mu.Unlock()
}
