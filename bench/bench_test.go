package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

func TestHistQuantileLikePrometheus(t *testing.T) {
	// 100 observations: 50 in (0, 1ms], 40 in (1ms, 5ms], 9 in (5ms, 10ms], 1 above 60s.
	bs := []bucket{{0.001, 50}, {0.005, 90}, {0.01, 99}, {60, 99}, {math.Inf(1), 100}}
	for _, c := range []struct{ q, want float64 }{
		{0.5, 0.001},               // rank 50: top of the first bucket
		{0.25, 0.0005},             // first bucket starts at 0
		{0.7, 0.001 + 0.004*20/40}, // linear inside (1ms, 5ms]
		{0.99, 0.01},               // rank 99 ends the (5ms, 10ms] bucket
		{0.999, 60},                // in +Inf: the highest finite bound
		{0.95, 0.005 + 0.005*5/9},  // inside (5ms, 10ms]
	} {
		if got := histQuantile(c.q, bs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q%.3f = %g, want %g", c.q, got, c.want)
		}
	}
	if got := histMax(bs); !math.IsInf(got, 1) {
		t.Errorf("max = %g, want +Inf", got)
	}
	if got := histMax(bs[:3]); got != 0.01 {
		t.Errorf("max = %g, want 0.01", got)
	}
	if got := histQuantile(0.5, []bucket{{0.001, 0}, {math.Inf(1), 0}}); !math.IsNaN(got) {
		t.Errorf("empty histogram: %g, want NaN", got)
	}
}

func TestHistDeltaAndParse(t *testing.T) {
	text := `# HELP outbox_relay_commit_to_ack_seconds x
# TYPE outbox_relay_commit_to_ack_seconds histogram
outbox_relay_commit_to_ack_seconds_bucket{le="0.001"} 5
outbox_relay_commit_to_ack_seconds_bucket{le="0.0025"} 7
outbox_relay_commit_to_ack_seconds_bucket{le="+Inf"} 9
outbox_relay_commit_to_ack_seconds_sum 0.1
outbox_relay_commit_to_ack_seconds_count 9
outbox_relay_events_published_total{topic="a.b"} 3
outbox_relay_events_published_total{topic="c"} 4
outbox_relay_acked_lsn 2.3456789e+07
`
	ss := testkit.ParseMetrics(strings.NewReader(text))
	h := histogram(ss, ackHistogram)
	if len(h) != 3 || h[0].LE != 0.001 || !math.IsInf(h[2].LE, 1) || h[2].Count != 9 {
		t.Fatalf("histogram %+v", h)
	}
	d := histDelta([]bucket{{0.001, 1}, {0.0025, 2}, {math.Inf(1), 2}}, h)
	if d[0].Count != 4 || d[1].Count != 5 || d[2].Count != 7 {
		t.Fatalf("delta %+v", d)
	}
	if v, _ := testkit.SumMetric(ss, "outbox_relay_events_published_total", map[string]string{"topic": "a.b"}); v != 3 {
		t.Errorf("published{a.b} = %g", v)
	}
	if v, _ := testkit.SumMetric(ss, "outbox_relay_acked_lsn", nil); v != 23456789 {
		t.Errorf("acked_lsn = %g", v)
	}
}

func TestSummarize(t *testing.T) {
	if m := summarize([]float64{3, 1, 2}); m != (spread{1, 2, 3}) {
		t.Errorf("%+v", m)
	}
	if m := summarize([]float64{4, 1, 2, 3}); m.Med != 2.5 {
		t.Errorf("%+v", m)
	}
}

// TestReportAndPlots renders the markdown and both figures from made-up
// results (no services needed).
func TestReportAndPlots(t *testing.T) {
	sc, _ := scaleFor("small")
	res := &results{Started: time.Now(), Scale: sc, Machine: readMachine(), PG: "15", Kafka: "4.2.0", Git: "abc"}
	for _, perTxn := range []int{1, 100} {
		d := &drainShape{PerTxn: perTxn, Events: 1000, AvgPayload: 400}
		for rep := 1; rep <= 3; rep++ {
			d.Runs = append(d.Runs,
				drainRun{Tool: "pg_recvlogical", Rep: rep, Seconds: 0.02, EventsPerS: 50000 + float64(rep)*1000, Walsender: 0.01, ToolCPU: 0.01, Broker: math.NaN()},
				drainRun{Tool: "relay", Rep: rep, Seconds: 0.025, AckSeconds: 0.02, EventsPerS: 40000 + float64(rep)*2000, ToolCPU: 0.01, Walsender: 0.01, Broker: 0.02, PeakRSS: 40 << 20, Records: 1000},
				drainRun{Tool: "relay_eos", Rep: rep, Seconds: 0.03, AckSeconds: 0.03, EventsPerS: 36000 + float64(rep)*1800, ToolCPU: 0.012, Walsender: 0.01, Broker: 0.03, PeakRSS: 44 << 20, Records: 1010})
			if perTxn == 100 { // the base leg (-relay-base): twice the CPU, 0.5x the relay's
				d.Runs = append(d.Runs, drainRun{Tool: "relay_base", Rep: rep, Seconds: 0.05, AckSeconds: 0.05, EventsPerS: 20000, ToolCPU: 0.02, Walsender: 0.01, Broker: 0.02, PeakRSS: 60 << 20, Records: 1000})
			}
		}
		res.Drains = append(res.Drains, d)
	}
	res.Latency = &latencyRun{PeakRSS: 50 << 20}
	for _, rate := range sc.Rates {
		p := &latPhase{Rate: rate, LoadS: 5, SchedS: 5, RelayCPU: 1, CatchUpS: 0.1,
			Gen: loadResult{Events: rate * 5, Executed: rate * 3, DurationS: 5, FirstLateS: -1, Conns: 8,
				Shapes: []shapeLoad{{Txn: 1, Events: rate * 5 / 2, Executed: rate * 5 / 2}, {Txn: 10, Events: rate * 5 / 2, Executed: rate / 4}}},
			AckQ:     []float64{0.002, 0.004, 0.009, 0.02, 0.04},
			ConsQ:    []float64{2.5, 5, 11, 22, 45},
			ByShape:  []consShape{{Txn: 1, Q: []float64{2, 4, 10, 20, 40}}, {Txn: 10, Q: []float64{3, 6, 12, 24, 48}}},
			AckCount: float64(rate * 5), AckedDuringLoad: float64(rate * 5), SteadyDelivered: float64(rate)}
		if rate == 20000 {
			p.RelayBehind = true
			p.AckQ = []float64{1, 2, 2.5, 2.56, math.Inf(1)}
		}
		res.Latency.Phases = append(res.Latency.Phases, p)
	}
	res.LatencyEOS = &latencyRun{EOS: true}
	for _, p := range res.Latency.Phases[:2] {
		e := *p
		e.ConsQ = []float64{60, 90, 120, 150, 200}
		res.LatencyEOS.Phases = append(res.LatencyEOS.Phases, &e)
	}
	res.First = &firstPublish{AutoCreate: true, WallMs: []float64{120, 80, 2600, 95, 110}, StampMs: []float64{118, 79, 2598, 94, 108}}
	dir := t.TempDir()
	if err := plotDrain(res, filepath.Join(dir, "d.png")); err != nil {
		t.Fatal(err)
	}
	if err := plotLatency(res, filepath.Join(dir, "l.png")); err != nil {
		t.Fatal(err)
	}
	md := res.markdown("x")
	for _, want := range []string{"| Drain, 100 rows/txn: relay >= 0.8x pg_recvlogical | 0.85x (min 0.82x, max 0.87x) | met |", "x-drain.png", "x-latency.png", "**relay not sustained**", "> 60 s",
		"| First event to a new topic at a consumer <= 500 ms (info) | 110 ms median (min 80 ms, max 2600 ms), before COMMIT -> consumer | met |",
		"| wall: before COMMIT -> consumer | 80 ms | 110 ms | 2600 ms |",
		"| Relay CPU <= 3 us/event, 100 rows/txn drain | 10.00 us/event (min 10.00, max 10.00); 0.50x the base relay's (min 0.50x, max 0.50x) | MISSED |",
		"| **ratio relay / base relay CPU per event** | 0.50x | 0.50x | 0.50x |",
		"| base relay CPU, ms per 1k events | 20.00 | 20.00 | 20.00 |",
		"| Drain, 100 rows/txn: exactly-once >= 0.85x at-least-once | 0.90x (min 0.90x, max 0.90x) | met |",
		"| **ratio exactly-once / at-least-once** | 0.90x | 0.90x | 0.90x |",
		"| 1000 | 1000 | 1000 | 2.5 ms | 60.0 ms | 11.0 ms | 120.0 ms | 2.0 ms / 9.0 ms | 2.0 ms / 9.0 ms | ok |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if out := os.Getenv("OUTBOX_BENCH_TEST_OUT"); out != "" { // look at the figures
		os.WriteFile(filepath.Join(out, "test.md"), []byte(md), 0o644)
		for _, f := range []string{"d.png", "l.png"} {
			b, _ := os.ReadFile(filepath.Join(dir, f))
			os.WriteFile(filepath.Join(out, "test-"+f), b, 0o644)
		}
	}
}
