package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// results is everything one run measured.
type results struct {
	Started  time.Time
	Elapsed  time.Duration
	Scale    scale
	Machine  machineFacts
	LoadEnd  string
	PG       string
	Kafka    string
	Recvlog  string
	Git      string
	RelayBin string
	// RelayBase: the base leg's binary ("" = none).
	RelayBase string
	// BaseTogether: the base relay drained at the same time as the relay.
	BaseTogether bool
	Flags        []string
	Drains       []*drainShape
	Latency      *latencyRun
	// LatencyEOS: the same with delivery: exactly_once and read_committed
	// consumers, at eosRates (nil: not measured).
	LatencyEOS *latencyRun
	First      *firstPublish
	Stream     *streamResult  // the "stream" part
	Binary     *binaryResult  // the "binary" part
	Formats    *formatsResult // the "formats" part
	Curves     *curvesResult  // the "curves" part (curves.go)
	// The "messages" part (messages.go): the 100/txn backlog as messages,
	// and the latency phases with messages (nil: not run).
	Messages   *drainShape
	LatencyMsg *latencyRun
	DBCost     *dbCost // the "dbcost" part (dbcost.go)
	Errors     []string
}

// target is one goal of the issue with its measured value.
type target struct {
	Name     string
	Measured string
	Status   string // met, MISSED, n/a
}

func status(ok bool, measured bool) string {
	switch {
	case !measured:
		return "n/a"
	case ok:
		return "met"
	}
	return "MISSED"
}

func (r *results) drain(perTxn int) *drainShape {
	for _, d := range r.Drains {
		if d.PerTxn == perTxn {
			return d
		}
	}
	return nil
}

func (r *results) phase(rate int) *latPhase { return phaseOf(r.Latency, rate) }

func phaseOf(l *latencyRun, rate int) *latPhase {
	if l == nil {
		return nil
	}
	for _, p := range l.Phases {
		if p.Rate == rate && p.Err == "" && !p.OneRow {
			return p
		}
	}
	return nil
}

const mib = 1 << 20

// latencyGoals are the commit->ack p99 targets (seconds) by offered rate.
var latencyGoals = []struct {
	rate  int
	limit float64
}{{1000, 0.010}, {5000, 0.040}}

func (r *results) targets() []target {
	var ts []target
	for _, perTxn := range []int{100, 1} {
		name := fmt.Sprintf("Drain, %s: relay >= 0.8x pg_recvlogical", shapeName(perTxn))
		if d := r.drain(perTxn); d != nil && len(d.ratios()) > 0 {
			m := summarize(d.ratios())
			ts = append(ts, target{name, fmt.Sprintf("%.2fx (min %.2fx, max %.2fx)", m.Med, m.Min, m.Max), status(m.Med >= 0.8, true)})
		} else {
			ts = append(ts, target{name, "not measured", "n/a"})
		}
	}
	{
		name := "Relay CPU <= 3 us/event, 100 rows/txn drain"
		if d := r.drain(100); d != nil && len(d.runs("relay")) > 0 {
			var xs []float64
			for _, x := range d.runs("relay") {
				xs = append(xs, x.ToolCPU/float64(d.Events)*1e6)
			}
			m := summarize(xs)
			v := fmt.Sprintf("%.2f us/event (min %.2f, max %.2f)", m.Med, m.Min, m.Max)
			if c := d.cpuVsBase(); len(c) > 0 {
				cb := summarize(c)
				v += fmt.Sprintf("; %.2fx the base relay's (min %.2fx, max %.2fx)", cb.Med, cb.Min, cb.Max)
			}
			ts = append(ts, target{name, v, status(m.Med <= 3, !math.IsNaN(m.Med))})
		} else {
			ts = append(ts, target{name, "not measured", "n/a"})
		}
	}
	for _, perTxn := range []int{100, 1} {
		name := fmt.Sprintf("Relay RSS <= 128 MiB during the drain, %s", shapeName(perTxn))
		if d := r.drain(perTxn); d != nil && len(d.runs("relay")) > 0 {
			var xs []float64
			for _, x := range d.runs("relay") {
				xs = append(xs, float64(x.PeakRSS)/mib)
			}
			m := summarize(xs)
			ts = append(ts, target{name, fmt.Sprintf("%.1f MiB peak (VmHWM)", m.Med), status(m.Med <= 128, true)})
		} else {
			ts = append(ts, target{name, "not measured", "n/a"})
		}
	}
	{
		name := "Relay RSS <= 64 MiB at 5k events/s"
		if p := r.phase(5000); p != nil {
			v := float64(p.RelayRSSMax) / mib
			ts = append(ts, target{name, fmt.Sprintf("%.1f MiB (max VmRSS in the phase)", v), status(v <= 64, true)})
		} else {
			ts = append(ts, target{name, "not measured", "n/a"})
		}
	}
	for _, g := range latencyGoals {
		name := fmt.Sprintf("Commit->ack p99 <= %.0f ms at %gk events/s", g.limit*1000, float64(g.rate)/1000)
		if p := r.phase(g.rate); p != nil && len(p.AckQ) > 2 {
			v := p.AckQ[2]
			m := fmtSec(v)
			if p.RelayBehind {
				m += " (relay not sustained)"
			}
			ts = append(ts, target{name, m, status(v <= g.limit, !math.IsNaN(v))})
		} else {
			ts = append(ts, target{name, "not measured", "n/a"})
		}
	}
	{
		name := "Drain, 100 rows/txn: exactly-once >= 0.85x at-least-once"
		if d := r.drain(100); d != nil && len(d.eosRatios()) > 0 {
			m := summarize(d.eosRatios())
			ts = append(ts, target{name, fmt.Sprintf("%.2fx (min %.2fx, max %.2fx)", m.Med, m.Min, m.Max), status(m.Med >= 0.85, true)})
		} else {
			ts = append(ts, target{name, "not measured", "n/a"})
		}
	}
	{
		name := fmt.Sprintf("First event to a new topic at a consumer <= %.0f ms (info)", firstPublishGoal)
		if f := r.First; f != nil && f.Err == "" && len(f.WallMs) > 0 {
			m := summarize(f.WallMs)
			ts = append(ts, target{name, fmt.Sprintf("%s median (min %s, max %s), before COMMIT -> consumer", msInt(m.Med), msInt(m.Min), msInt(m.Max)),
				status(m.Med <= firstPublishGoal, true)})
		} else {
			ts = append(ts, target{name, "not measured", "n/a"})
		}
	}
	return append(ts, r.issue40Targets()...)
}

// summaryText is the closing note printed at the end of the run.
func (r *results) summaryText() string {
	var sb strings.Builder
	sb.WriteString("\nTargets (drain: median of the repeats; latency: one run per rate):\n")
	for _, t := range r.targets() {
		fmt.Fprintf(&sb, "  %-7s %-62s %s\n", t.Status, t.Name, t.Measured)
	}
	for _, d := range r.Drains {
		if d.Skipped > 0 {
			fmt.Fprintf(&sb, "  NOTE: %d of %d repeats of the %s drain were skipped to stay within the time budget\n", d.Skipped, r.Scale.Repeats, shapeName(d.PerTxn))
		}
	}
	for _, e := range r.Errors {
		fmt.Fprintf(&sb, "  ERROR: %s\n", e)
	}
	return sb.String()
}

func f0(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", v)
}

func f2(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

func pct(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100*v)
}

func msq(v float64) string { // a consumer quantile in ms
	if math.IsNaN(v) {
		return "n/a"
	}
	if v >= 1000 {
		return fmt.Sprintf("%.2f s", v/1000)
	}
	return fmt.Sprintf("%.1f ms", v)
}

// markdown renders the report; asset is the file name prefix of the PNGs and
// profile summaries it links (the dated one, or "latest").
func (r *results) markdown(asset string) string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	m := r.Machine
	w("# outbox-relay benchmark, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	w("Scale **%s**: drain backlogs of %d events, %d repeat(s); latency phases of %s at %s events/s. Whole run: %s.\n\n",
		r.Scale.Name, r.Scale.DrainEvents, r.Scale.Repeats, r.Scale.PhaseDur, joinInts(r.Scale.Rates), r.Elapsed.Round(time.Second))
	w("| machine | |\n|---|---|\n")
	w("| nproc | %d |\n| memory | %s |\n| CPU | %s |\n| kernel | %s |\n", m.NProc, m.MemTotal, m.CPUModel, m.Kernel)
	w("| PostgreSQL | %s (test/services.sh: fsync off, synchronous_commit on, shared_buffers 128MB) |\n", r.PG)
	w("| pg_recvlogical | %s |\n", r.Recvlog)
	w("| Kafka | %s (one KRaft broker, topics of %d partitions, RF 1) |\n", r.Kafka, r.Scale.Partitions)
	w("| Go | %s |\n| git commit | %s |\n", m.GoVersion, r.Git)
	w("| relay | `%s` with `--leader-election=false`%s, otherwise defaults |\n", r.RelayBin, flagNote(r.Flags))
	if r.RelayBase != "" {
		how := "in turn with the others"
		if r.BaseTogether {
			how = "at the same time as the relay, each from its own slot (broker CPU then covers both)"
		}
		w("| base relay | `%s`, the same flags, drained %s (`relay_base`) |\n", r.RelayBase, how)
	}
	w("| load average (1/5/15 min) at start / end | %s / %s |\n\n", m.LoadStart, r.LoadEnd)

	w("## Targets\n\n| target | measured | |\n|---|---|---|\n")
	for _, t := range r.targets() {
		w("| %s | %s | %s |\n", t.Name, t.Measured, t.Status)
	}
	w("\nDrain figures are the median over the repeats, each repeat measuring both tools side by side on the same backlog; latency figures come from one run per rate.\n\n")
	for _, e := range r.Errors {
		w("**Error:** %s\n\n", e)
	}

	w("## 1. Backlog drain\n\n")
	w("Each backlog is inserted once, after every slot that drains it was created; each tool then reads it from its own fresh slot up to the end LSN. pg_recvlogical (pgoutput proto 1, `-f /dev/null`, `--endpos`) shows what the walsender can deliver; the relay's time runs from its start until the slot's `confirmed_flush_lsn` reached the end LSN with every event acked by Kafka (`acks=all`).\n\n")
	w("![drain throughput](%s-drain.png)\n\n", asset)
	for _, d := range r.Drains {
		w("### %s: %d events, payload %.0f B, %.0f MiB of WAL (%s..%s), inserted in %.1f s\n\n", shapeName(d.PerTxn), d.Events, d.AvgPayload,
			float64(d.WALBytes)/mib, fmtLSN(d.StartLSN), fmtLSN(d.EndLSN), d.FillSeconds)
		if d.Skipped > 0 {
			w("**%d of %d repeats were skipped to stay within the time budget** (`-budget`, `OUTBOX_BENCH_BUDGET`): the relay drained too slowly for all of them.\n\n", d.Skipped, r.Scale.Repeats)
		}
		w("| | min | median | max |\n|---|---:|---:|---:|\n")
		row := func(name string, xs []float64, f func(float64) string) {
			if len(xs) == 0 {
				w("| %s | n/a | n/a | n/a |\n", name)
				return
			}
			s := summarize(xs)
			w("| %s | %s | %s | %s |\n", name, f(s.Min), f(s.Med), f(s.Max))
		}
		rec, rel := d.runs("pg_recvlogical"), d.runs("relay")
		get := func(rs []drainRun, f func(drainRun) float64) []float64 {
			var xs []float64
			for _, x := range rs {
				xs = append(xs, f(x))
			}
			return xs
		}
		ev := float64(d.Events)
		row("pg_recvlogical events/s", get(rec, func(x drainRun) float64 { return x.EventsPerS }), f0)
		row("relay events/s (to confirmed_flush_lsn)", get(rel, func(x drainRun) float64 { return x.EventsPerS }), f0)
		row("relay events/s (to the last ack)", get(rel, func(x drainRun) float64 { return ev / x.AckSeconds }), f0)
		row("**ratio relay / pg_recvlogical**", d.ratios(), func(v float64) string { return fmt.Sprintf("%.2fx", v) })
		if eos := d.runs("relay_eos"); len(eos) > 0 {
			row("relay exactly-once events/s (to confirmed_flush_lsn)", get(eos, func(x drainRun) float64 { return x.EventsPerS }), f0)
			row("**ratio exactly-once / at-least-once**", d.eosRatios(), func(v float64) string { return fmt.Sprintf("%.2fx", v) })
			row("relay exactly-once CPU, ms per 1k events", get(eos, func(x drainRun) float64 { return x.ToolCPU / ev * 1e6 }), f2)
			row("relay exactly-once peak RSS (VmHWM), MiB", get(eos, func(x drainRun) float64 { return float64(x.PeakRSS) / mib }), func(v float64) string { return fmt.Sprintf("%.1f", v) })
		}
		if base := d.runs("relay_base"); len(base) > 0 {
			row("base relay events/s (to confirmed_flush_lsn)", get(base, func(x drainRun) float64 { return x.EventsPerS }), f0)
			row("**ratio base relay / pg_recvlogical**", d.ratiosOf("relay_base"), func(v float64) string { return fmt.Sprintf("%.2fx", v) })
			row("base relay CPU, ms per 1k events", get(base, func(x drainRun) float64 { return x.ToolCPU / ev * 1e6 }), f2)
			row("**ratio relay / base relay CPU per event**", d.cpuVsBase(), func(v float64) string { return fmt.Sprintf("%.2fx", v) })
			row("base relay peak RSS (VmHWM), MiB", get(base, func(x drainRun) float64 { return float64(x.PeakRSS) / mib }), func(v float64) string { return fmt.Sprintf("%.1f", v) })
		}
		row("relay CPU, ms per 1k events", get(rel, func(x drainRun) float64 { return x.ToolCPU / ev * 1e6 }), f2)
		row("walsender CPU, ms per 1k events (pg_recvlogical)", get(rec, func(x drainRun) float64 { return x.Walsender / ev * 1e6 }), f2)
		row("walsender CPU, ms per 1k events (relay)", get(rel, func(x drainRun) float64 { return x.Walsender / ev * 1e6 }), f2)
		row("broker CPU, ms per 1k events (relay)", get(rel, func(x drainRun) float64 { return x.Broker / ev * 1e6 }), f2)
		row("relay CPU share of one core", get(rel, func(x drainRun) float64 { return x.ToolCPU / x.Seconds }), pct)
		row("relay peak RSS (VmHWM), MiB", get(rel, func(x drainRun) float64 { return float64(x.PeakRSS) / mib }), func(v float64) string { return fmt.Sprintf("%.1f", v) })
		w("\n")
	}
	if len(r.Drains) > 0 {
		w("<details><summary>Every drain</summary>\n\n| shape | repeat | tool | order | seconds | events/s | last ack s | tool CPU s | walsender CPU s | broker CPU s | relay VmHWM MiB | records in topic | error |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, d := range r.Drains {
			all := append([]drainRun(nil), d.Runs...)
			if d.Profile != nil {
				pr := d.Profile.Run
				pr.Tool = "relay --pprof (profile)"
				all = append(all, pr)
			}
			if d.ProfileBase != nil {
				pr := d.ProfileBase.Run
				pr.Tool = "relay_base --pprof (profile)"
				all = append(all, pr)
			}
			for _, x := range all {
				ack, hwm, recs := "", "", ""
				if strings.HasPrefix(x.Tool, "relay") {
					ack, hwm, recs = f2(x.AckSeconds), fmt.Sprintf("%.1f", float64(x.PeakRSS)/mib), fmt.Sprint(x.Records)
				}
				rep, order := fmt.Sprint(x.Rep), fmt.Sprint(x.Order)
				if x.Rep == 0 {
					rep, order = "-", "-"
				}
				w("| %s | %s | %s | %s | %.2f | %s | %s | %s | %s | %s | %s | %s | %s |\n", shapeName(d.PerTxn), rep, x.Tool, order,
					x.Seconds, f0(x.EventsPerS), ack, f2(x.ToolCPU), f2(x.Walsender), f2(x.Broker), hwm, recs, x.Err)
			}
		}
		w("\n</details>\n\n")
	}

	w("## 2. Steady-state latency\n\n")
	if r.Latency == nil {
		w("Not run.\n\n")
	} else {
		w("An open-loop generator (a child process) commits outbox rows on a fixed schedule for %s per rate: the offered events/s are split evenly between %s transactions, each shape on its own schedule and connections (one per 300 transactions/s, 4 to 32; a transaction not started by the end of the phase is dropped). One relay publishes them. Commit->ack is the relay's `outbox_relay_commit_to_ack_seconds` histogram over the phase (quantiles interpolated in the buckets like `histogram_quantile`, so they are only as fine as the buckets 1, 2.5, 5, 10, 20, 40, 80 ms...; max = upper bound of the highest non-empty bucket). Commit->consumer is measured by a Kafka consumer in the bench: receive time minus the record timestamp, which is the PostgreSQL commit time in milliseconds (so it reads up to 1 ms high). Before each phase %d warm-up events per shape go to its topic (not counted), so topic metadata is not part of the measurement.\n\n",
			r.Scale.PhaseDur, mixName(r.Scale.LatencyShapes), warmupEvents)
		switch {
		case r.Latency.Mode == latTurns && len(r.Latency.Legs) > 1:
			w("Legs in **turns** (`OUTBOX_BENCH_LAT_MODE=turns`, the default): every phase runs once per leg, and each leg runs **alone** on the machine: started on a fresh slot just before its run and stopped after it, with the same generator settings (rate, shapes, connections, seed). The legs take turns in an order that rotates from one phase to the next (listed under the side-by-side table). The tables, the figure and the targets are the relay leg's lone runs; each leg's row in the side-by-side table is its own lone run of the phase.\n\n")
		case r.Latency.Mode == latTogether && len(r.Latency.Legs) > 1:
			w("Legs **together** (`OUTBOX_BENCH_LAT_MODE=together`): all %d legs run at the same time on the one generator's transactions, so the relay's figures and the targets below include the other legs' load on the machine's %d cores.\n\n", len(r.Latency.Legs), m.NProc)
		}
		if r.Latency.Err != "" {
			w("**Error:** %s\n\n", r.Latency.Err)
		}
		for _, p := range r.Latency.Phases {
			if p.OneRow {
				w("Before the %s phase the same rate runs once more in 1-row transactions only (rows \"%s\"), the issue's low-rate figure; it is not in the figure or the targets.\n\n", rateName(p.Rate), p.label())
				break
			}
		}
		w("![latency percentiles](%s-latency.png)\n\n", asset)
		w("| offered events/s | generated | delivered | ack p50 | ack p90 | ack p99 | ack p99.9 | ack max | consumer p50 | p90 | p99 | p99.9 | max | status |\n")
		w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, p := range r.Latency.Phases {
			if p.Err != "" {
				w("| %s | | | | | | | | | | | | | failed: %s |\n", p.label(), p.Err)
				continue
			}
			w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.label(),
				f0(p.achieved()), f0(p.delivered()), fmtSec(p.AckQ[0]), fmtSec(p.AckQ[1]), fmtSec(p.AckQ[2]), fmtSec(p.AckQ[3]), fmtSec(p.AckQ[4]),
				msq(p.ConsQ[0]), msq(p.ConsQ[1]), msq(p.ConsQ[2]), msq(p.ConsQ[3]), msq(p.ConsQ[4]), phaseStatus(p))
		}
		w("\nCommit->consumer by transaction shape:\n\n| offered events/s | shape | generated events/s | transactions late > 10 ms | consumer p50 | p90 | p99 | p99.9 | max |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, p := range r.Latency.Phases {
			if p.Err != "" {
				continue
			}
			for _, cs := range p.ByShape {
				gen, late := math.NaN(), math.NaN()
				for _, sh := range p.Gen.Shapes {
					if sh.Txn == cs.Txn {
						gen = float64(sh.Events) / p.Gen.DurationS
						late = 100 * float64(sh.LateOver10ms) / math.Max(1, float64(sh.Executed))
					}
				}
				w("| %s | %s | %s | %.1f%% | %s | %s | %s | %s | %s |\n", p.label(), shapeName(cs.Txn), f0(gen), late,
					msq(cs.Q[0]), msq(cs.Q[1]), msq(cs.Q[2]), msq(cs.Q[3]), msq(cs.Q[4]))
			}
		}
		w("\nResources during each phase (CPU as a share of one core over the load; the machine has %d):\n\n", m.NProc)
		w("| offered | relay CPU | relay RSS max | walsender CPU | broker CPU | generator CPU (conns) | its PG backends | late > 10 ms | first late at | max lateness | max slot lag | unacked at load end | caught up after |\n")
		w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, p := range r.Latency.Phases {
			if p.Err != "" {
				continue
			}
			first := "never"
			if p.Gen.FirstLateS >= 0 {
				first = fmt.Sprintf("%.1f s", p.Gen.FirstLateS)
			}
			catch := "not within the limit"
			if !math.IsNaN(p.CatchUpS) {
				catch = fmt.Sprintf("%.2f s", p.CatchUpS)
			}
			w("| %s | %s | %.1f MiB | %s | %s | %s (%d) | %s | %.1f%% | %s | %.0f ms | %.1f MiB | %d | %s |\n", p.label(),
				pct(share(p.RelayCPU, p.LoadS)), float64(p.RelayRSSMax)/mib, pct(share(p.WalsenderCPU, p.LoadS)), pct(share(p.BrokerCPU, p.LoadS)),
				pct(share(p.GenCPU, p.LoadS)), p.Gen.Conns, pct(share(p.Gen.BackendCPUS, p.LoadS)), 100*float64(p.Gen.LateOver10)/math.Max(1, float64(p.Gen.Executed)),
				first, p.Gen.LateMaxMs, float64(p.MaxSlotLag)/mib, max(0, p.BacklogAtEnd), catch)
		}
		if len(r.Latency.Legs) > 1 {
			w("\n### Side by side: relay legs and the minimal forwarder\n\n")
			if r.Latency.Mode == latTurns {
				w("Each leg ran alone, in turn, from its own fresh slot to its own topics, on the same generator settings: no leg shares the cores with another, but each meets the shared machine at a different moment (the turns of one phase follow each other directly, so the comparisons within a phase are of adjacent runs). ")
			} else {
				w("All legs run at the same time, each from its own slot to its own topics, on the same committed transactions (one generator): the same events at the same moment of the shared machine, so the noise of the box hits every leg alike; the price is that they share its 2 cores. ")
			}
			w("The minimal forwarder (`outbox-bench forward`) is pglogrepl + sarama only: pgoutput proto 1, of each Insert the topic (aggregate_type), key (aggregate_id) and payload, the relay's producer settings (idempotent, acks=all, one request in flight, murmur2, record timestamp = commit time) with sarama's own batching (no flush setting), and the slot confirmed after the acks every second: nothing else. Each leg's consumers check its output by the payload's sequence number: every event once. CPU is the process's user+sys from /proc over the load divided by the generated events (of the leg's own run in turns). Legs: %s.\n\n", strings.Join(r.Latency.Legs, "; "))
			w("| offered | leg | consumer p50 | p99 | p99.9 | max | p50 - forwarder p50 | CPU us/event | CPU share | received | duplicates | missing | status |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
			for _, p := range r.Latency.Phases {
				if p.Err != "" {
					continue
				}
				fwd := math.NaN()
				for _, l := range p.Legs {
					if l.Name == "forwarder" && l.Err == "" {
						fwd = l.ConsQ[0]
					}
				}
				for _, l := range p.Legs {
					if l.Err != "" {
						w("| %s | %s | | | | | | | | | | | failed: %s |\n", p.label(), l.Desc, l.Err)
						continue
					}
					st := l.Status
					if st == "" { // together: only the relay leg is judged
						st = "-"
					}
					w("| %s | %s | %s | %s | %s | %s | %+.2f ms | %.1f | %s | %d | %d | %d | %s |\n", p.label(), l.Desc, msq(l.ConsQ[0]), msq(l.ConsQ[2]), msq(l.ConsQ[3]), msq(l.ConsQ[4]),
						l.ConsQ[0]-fwd, l.usPerEvent(), pct(share(l.CPU, l.LoadS)), l.ConsN, l.Dups, l.Missing, st)
				}
			}
			if r.Latency.Mode == latTurns {
				w("\nStatus: the verdict of the leg's lone run, as for the relay below (the forwarder's delivered rate counts what its consumers received). Order of the turns:")
				sep := " "
				for _, p := range r.Latency.Phases {
					if len(p.TurnOrder) > 0 {
						w("%s%s: %s", sep, p.label(), strings.Join(p.TurnOrder, ", "))
						sep = "; "
					}
				}
				w(".\n")
			}
		}
		peak := "over the whole latency run"
		if r.Latency.Mode == latTurns {
			peak = "the highest of the relay leg's processes, one per phase"
		}
		w("\nRelay peak RSS (VmHWM, %s): %.1f MiB. The slot lag includes up to one status interval (1 s) of acked but not yet confirmed WAL.\n\n", peak, float64(r.Latency.PeakRSS)/mib)
		w("Status: *generator behind* = it committed < 95%% of the offered events or > 1%% of its transactions started > 10 ms after their slot (a limit of the generator and the database on this machine, not of the relay); *relay not sustained* = in the steady part of the phase (from 20%% of the schedule to its end) the relay acked < 95%% of the generated events/s, so its backlog (the slot lag) grew, or it never caught up after the load. *delivered* is that steady acked rate.\n\n")
	}

	if r.LatencyEOS != nil {
		w("### Exactly-once next to at-least-once\n\n")
		w("A second relay on its own slot with `--delivery exactly_once` (otherwise the same flags), at %s events/s with the same generator; its consumers read with `isolation.level=read_committed`, so *commit->visible* is receive time minus the commit time for records of committed Kafka transactions only. The at-least-once columns are the phases above.\n\n", joinInts(eosRates))
		if r.LatencyEOS.Err != "" {
			w("**Error:** %s\n\n", r.LatencyEOS.Err)
		}
		w("| offered events/s | at-least-once delivered | exactly-once delivered | commit->visible p50, at-least-once | exactly-once | p99, at-least-once | exactly-once | ack p50 / p99, at-least-once | exactly-once | status, exactly-once |\n")
		w("|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n")
		for _, e := range r.LatencyEOS.Phases {
			if e.Err != "" {
				w("| %d | | | | | | | | | failed: %s |\n", e.Rate, e.Err)
				continue
			}
			a := r.phase(e.Rate)
			if a == nil {
				a = &latPhase{SteadyDelivered: math.NaN(), ConsQ: []float64{math.NaN(), 0, math.NaN()}, AckQ: []float64{math.NaN(), 0, math.NaN()}}
			}
			w("| %d | %s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s |\n", e.Rate, f0(a.delivered()), f0(e.delivered()),
				msq(a.ConsQ[0]), msq(e.ConsQ[0]), msq(a.ConsQ[2]), msq(e.ConsQ[2]), fmtSec(a.AckQ[0]), fmtSec(a.AckQ[2]),
				fmtSec(e.AckQ[0]), fmtSec(e.AckQ[2]), phaseStatus(e))
		}
		w("\n")
	}

	w("## 3. Profiles\n\n")
	var prof, profBase *profileResult
	for _, d := range r.Drains {
		if d.Profile != nil {
			prof = d.Profile
		}
		if d.ProfileBase != nil {
			profBase = d.ProfileBase
		}
	}
	if prof == nil {
		w("Not captured.\n\n")
	} else {
		scope := fmt.Sprintf("the whole drain of the %d events", r.Scale.DrainEvents)
		if prof.Partial {
			scope = fmt.Sprintf("its first %d s (%d of the %d events; the drain stops there to save time)", prof.Seconds, prof.Events, r.Scale.DrainEvents)
		}
		w("The relay with `--pprof`, during one extra drain of the 100 rows/txn backlog from a slot of its own (%s events/s; not in the statistics above): CPU profile over %s, and the allocation profile (`/debug/pprof/allocs`, since start) at its end, summarized with `go tool pprof -top -nodecount=40`: [CPU](%s-pprof-cpu.txt), [allocations (alloc_space)](%s-pprof-allocs.txt).",
			f0(prof.Run.EventsPerS), scope, asset, asset)
		if prof.Err != "" {
			w(" Error: %s", prof.Err)
		}
		if profBase != nil {
			w(" The base relay the same way, from another slot: [CPU](%s-pprof-cpu-base.txt), [allocations](%s-pprof-allocs-base.txt) (%s events/s).", asset, asset, f0(profBase.Run.EventsPerS))
			if profBase.Err != "" {
				w(" Error: %s", profBase.Err)
			}
		}
		w("\n\n")
	}
	w("## 4. First publish to a new topic\n\n")
	if f := r.First; f == nil {
		w("Not run.\n\n")
	} else {
		how := "with `" + autoCreateFlag + "` (the broker has `auto.create.topics.enable=true`)"
		if !f.AutoCreate {
			how = "without `" + autoCreateFlag + "` (this relay does not know the flag; it created topics by default)"
		}
		w("One relay on a fresh slot, %s. After one warm-up event to a topic created beforehand (so the producer is connected), %d times in sequence: one outbox row with a fresh `aggregate_type`, whose topic does not exist yet, is committed; a consumer in the bench polls the topic's metadata every 5 ms (its own requests never create topics) and reads every partition from the start. *Wall* is the time from just before `COMMIT` until the consumer received the record (includes the commit itself); *record timestamp* is receive time minus the record timestamp, the PostgreSQL commit time in milliseconds. The target (<= %.0f ms) is judged on the wall median.\n\n",
			how, firstPublishProbes, firstPublishGoal)
		if f.Err != "" {
			w("**Error:** %s\n\n", f.Err)
		}
		if len(f.WallMs) > 0 {
			wl, st := summarize(f.WallMs), summarize(f.StampMs)
			w("| first event to a new topic (%d probes) | min | median | max |\n|---|---:|---:|---:|\n", len(f.WallMs))
			w("| wall: before COMMIT -> consumer | %s | %s | %s |\n", msInt(wl.Min), msInt(wl.Med), msInt(wl.Max))
			w("| record timestamp -> consumer | %s | %s | %s |\n\n", msInt(st.Min), msInt(st.Med), msInt(st.Max))
		}
	}
	if r.Stream != nil {
		w("## 5. One large transaction, streaming off and on\n\n%s", r.Stream.markdown())
	}
	if r.Binary != nil {
		w("## 6. pgoutput binary option\n\n%s", r.Binary.markdown())
	}
	w("## 7. Cost curves\n\n%s", r.curvesLink(asset))
	w("%s", r.messagesMarkdown(asset))
	if r.DBCost != nil {
		w("\n%s", r.DBCost.markdown())
	}
	if r.Formats != nil {
		w("\n## 10. Record formats: Schema Registry and CloudEvents\n\n%s", r.Formats.markdown())
	}
	return sb.String()
}

func phaseStatus(p *latPhase) string {
	var s []string
	if p.RelayBehind {
		s = append(s, "**relay not sustained**")
	}
	if p.GenBehind {
		s = append(s, "generator behind")
	}
	if len(s) == 0 {
		return "ok"
	}
	return strings.Join(s, ", ")
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, ", ")
}

func flagNote(flags []string) string {
	if len(flags) == 0 {
		return ""
	}
	return " `" + strings.Join(flags, " ") + "`"
}
