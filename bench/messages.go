package main

// The "messages" part (issue 40): the table-less outbox (messages.prefix,
// outbox.WriteMessage) drained side by side with pg_recvlogical on the same
// messages, and its latency at 1k and 5k events/s next to the rows'.

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// msgPerTxn is the messages backlog's shape: 100 events per transaction,
// the rows drain's main shape.
const msgPerTxn = 100

// msgPrefix is the bench's messages.prefix.
func (b *bench) msgPrefix() string { return b.pg.schema + ".events" }

// envelopeSQL is outbox.WriteMessage's envelope of event g, built
// server-side: the rows drain's payload and headers (jsonb text) in
// {"id","aggregate_type","aggregate_id","event_type","payload","headers"}.
func envelopeSQL(v string) string {
	payload, headers := eventSQL(v)
	return `'{"id":"' || gen_random_uuid()::text || '","aggregate_type":"' || p_agg_type || '","aggregate_id":"agg-' || (` + v + ` % ` + fmt.Sprint(aggregates) +
		`) || '","event_type":"order.updated","payload":' || (` + payload + `)::text || ',"headers":' || (` + headers + `)::text || '}'`
}

// setupMessages installs bench_fill_msg(from, n, per_txn, agg_type, prefix):
// bench_fill's twin that writes each event as a transactional logical
// decoding message, COMMITting in its loop.
func (b *bench) setupMessages(ctx context.Context) error {
	s := `CREATE OR REPLACE PROCEDURE ` + b.pg.schema + `.bench_fill_msg(p_from bigint, p_n bigint, p_per_txn int, p_agg_type text, p_prefix text)
LANGUAGE plpgsql AS $proc$
DECLARE
	i bigint := p_from;
	stop bigint := p_from + p_n;
	k bigint;
BEGIN
	WHILE i < stop LOOP
		k := least(p_per_txn, stop - i);
		PERFORM pg_logical_emit_message(true, p_prefix, ` + envelopeSQL("g") + `)
		FROM generate_series(i, i + k - 1) AS g;
		i := i + k;
		COMMIT;
	END LOOP;
END
$proc$`
	if _, err := b.pg.pool.Exec(ctx, s); err != nil {
		return fmt.Errorf("setup messages: %w\n%s", err, s)
	}
	return nil
}

// fillMessages is pgDB.fill for messages.
func (b *bench) fillMessages(ctx context.Context, n, perTxn int, aggType string) (int64, error) {
	return b.pg.fillWith(ctx, "bench_fill_msg", n, perTxn, b.fillSessions, aggType, b.msgPrefix())
}

// warmupFill is the statement (and its arguments) that commits n warm-up
// events of aggType in one transaction: rows, or messages while the
// messages latency runs.
func (b *bench) warmupFill(n int64, aggType string) (string, []any) {
	if b.latMessages {
		return "CALL " + b.pg.schema + ".bench_fill_msg(0, $1, $2, $3, $4)", []any{n, int32(n), aggType, b.msgPrefix()}
	}
	return "CALL " + b.pg.schema + ".bench_fill(0, $1, $2, $3)", []any{n, int32(n), aggType}
}

// loadgenExtra are the load generator's extra flags: -messages while the
// messages latency runs.
func (b *bench) loadgenExtra() []string {
	if b.latMessages {
		return []string{"-messages", b.msgPrefix()}
	}
	return nil
}

// recvlogicalDrain drains slot with pg_recvlogical (pgoutput proto 1 on pub,
// plus opts such as messages=true) up to end.
func (b *bench) recvlogicalDrain(ctx context.Context, slot, pub string, end int64, events int, opts ...string) drainRun {
	r := drainRun{Tool: "pg_recvlogical", Slot: slot, Walsender: math.NaN(), ToolCPU: math.NaN(), Broker: math.NaN()}
	logPath := filepath.Join(b.runDir, "pg_recvlogical-"+slot+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer lf.Close()
	args := []string{"-d", b.pg.url, "--slot", slot, "--start", "-f", "/dev/null", "--endpos", fmtLSN(end), "--no-loop",
		"--option=proto_version=1", "--option=publication_names=" + pub}
	for _, o := range opts {
		args = append(args, "--option="+o)
	}
	cmd := exec.CommandContext(ctx, b.recvlogical, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	m, err := b.runRecvlogical(ctx, cmd, slot, b.drainTimeout(events))
	if err != nil {
		r.Err = err.Error()
		return r
	}
	r.Seconds, r.Walsender, r.ToolCPU = m.seconds, m.walsender, m.toolCPU
	if m.waitErr != nil {
		out, _ := os.ReadFile(logPath)
		r.Err = fmt.Sprintf("pg_recvlogical: %v %s", m.waitErr, strings.TrimSpace(string(out)))
		return r
	}
	// --endpos exits 0 once it got there; check the slot agrees.
	if c, _, err := b.pg.slotState(ctx, slot); err == nil && c < end {
		logf("  note: pg_recvlogical exited with the slot confirmed at %s < end %s", fmtLSN(c), fmtLSN(end))
	}
	r.EventsPerS = float64(events) / r.Seconds
	return r
}

// runMessagesDrain is the rows drain's 100-per-transaction backlog written
// as messages: every slot first, then the backlog, then `repeats` times
// pg_recvlogical (messages=true) and the relay (--messages-prefix), who
// reads first alternating.
func (b *bench) runMessagesDrain(ctx context.Context) (*drainShape, error) {
	sh := &drainShape{PerTxn: msgPerTxn, Events: b.sc.DrainEvents}
	type pair struct{ rec, rel string }
	var slots []pair
	profSlot := "" // the profiled drain's (the profile part), not in the statistics
	if b.parts["profile"] {
		profSlot = b.pg.schema + "_m_prof"
		if _, err := b.pg.createSlot(ctx, profSlot); err != nil {
			return nil, err
		}
	}
	for rep := 1; rep <= b.sc.Repeats; rep++ {
		p := pair{fmt.Sprintf("%s_m_r%d_recv", b.pg.schema, rep), fmt.Sprintf("%s_m_r%d_relay", b.pg.schema, rep)}
		for _, s := range []string{p.rec, p.rel} {
			if _, err := b.pg.createSlot(ctx, s); err != nil {
				return nil, err
			}
		}
		slots = append(slots, p)
	}
	start, err := b.pg.lsn(ctx, "pg_current_wal_insert_lsn()")
	if err != nil {
		return nil, err
	}
	sh.StartLSN = start
	logf("messages drain: writing %d events as messages, %d per transaction (%d slots wait before them)", sh.Events, msgPerTxn, 2*len(slots))
	t0 := time.Now()
	end, err := b.fillMessages(ctx, sh.Events, msgPerTxn, "order")
	if err != nil {
		return nil, err
	}
	sh.FillSeconds, sh.EndLSN, sh.WALBytes = time.Since(t0).Seconds(), end, end-start
	logf("messages drain: backlog %s..%s (%.0f MiB of WAL, %.0f B per event) written in %.1fs",
		fmtLSN(start), fmtLSN(end), float64(sh.WALBytes)/mib, float64(sh.WALBytes)/float64(sh.Events), sh.FillSeconds)
	for i, s := range slots {
		rep := i + 1
		order := []string{"pg_recvlogical", "relay"}
		if rep%2 == 0 {
			order = []string{"relay", "pg_recvlogical"}
		}
		for j, tool := range order {
			var r drainRun
			if tool == "relay" {
				r = b.drainRelay(ctx, b.relayBin, s.rel, end, sh.Events, fmt.Sprintf("m%dr%d", msgPerTxn, rep), nil, "--messages-prefix", b.msgPrefix())
			} else {
				r = b.recvlogicalDrain(ctx, s.rec, b.pg.pub, end, sh.Events, "messages=true")
			}
			r.Rep, r.Order = rep, j+1
			sh.Runs = append(sh.Runs, r)
			if r.Err != "" {
				logf("  messages rep %d %-14s FAILED: %s", rep, r.Tool, r.Err)
			} else {
				logf("  messages rep %d %-14s %8.0f events/s  (%.2fs%s)", rep, r.Tool, r.EventsPerS, r.Seconds, extraRun(r))
			}
			if ctx.Err() != nil {
				break
			}
		}
		b.pg.dropSlot(ctx, s.rec)
		b.pg.dropSlot(ctx, s.rel)
		if ctx.Err() != nil {
			break
		}
	}
	for _, s := range slots { // those of skipped repeats
		b.pg.dropSlot(ctx, s.rec)
		b.pg.dropSlot(ctx, s.rel)
	}
	if profSlot != "" && ctx.Err() == nil {
		p := &profileResult{Seconds: sh.profileSeconds(), Bin: b.relayBin}
		p.Run = b.drainRelay(ctx, b.relayBin, profSlot, end, sh.Events, fmt.Sprintf("m%dprof", msgPerTxn), p, "--messages-prefix", b.msgPrefix())
		if p.Run.Err != "" {
			logf("  messages profile drain FAILED: %s", p.Run.Err)
		} else {
			logf("  messages profile drain (--pprof, not in the statistics) %8.0f events/s, %d events in %.1fs", p.Run.EventsPerS, p.Events, p.Run.Seconds)
		}
		sh.Profile = p
	}
	if profSlot != "" {
		b.pg.dropSlot(ctx, profSlot)
	}
	_, err = b.pg.pool.Exec(ctx, "CHECKPOINT")
	return sh, err
}

// runMessagesLatency runs the latency phases at 1k and 5k events/s (those
// of the scale's rates) with messages instead of rows: the same generator
// (-messages), one relay with --messages-prefix alone on a fresh slot per
// phase, like the relay leg in turns.
func (b *bench) runMessagesLatency(ctx context.Context) *latencyRun {
	out := &latencyRun{Mode: latTurns, Legs: []string{"relay, --messages-prefix"}}
	b.latMessages = true
	defer func() { b.latMessages = false }()
	for _, rate := range b.sc.Rates {
		if !slices.Contains(eosRates, rate) || ctx.Err() != nil {
			continue
		}
		l := &latLeg{name: "relay", desc: out.Legs[0], slot: b.pg.schema + "_latmsg", base: "latmsg"}
		if _, err := b.pg.createSlot(ctx, l.slot); err != nil {
			out.Err = err.Error()
			return out
		}
		tag := "-" + strings.ReplaceAll(strings.TrimSuffix(rateName(rate), "/s"), " ", "")
		rp, err := b.startRelay("latency-msg"+tag, l.slot, b.topicPrefix+l.base+".{aggregate_type}", "--messages-prefix", b.msgPrefix())
		var p *latPhase
		if err == nil {
			l.rp, l.pid = rp, rp.pid
			err = rp.waitReady(60 * time.Second)
		}
		if err != nil {
			p = &latPhase{Rate: rate, Shapes: b.sc.LatencyShapes, CatchUpS: math.NaN(), Err: "start: " + err.Error()}
		} else {
			p = b.latencyPhase(ctx, []*latLeg{l}, rate, b.sc.LatencyShapes, false, false)
			if _, hwm, err := procMem(l.pid); err == nil {
				out.PeakRSS = max(out.PeakRSS, hwm)
			}
		}
		b.stopLeg(l)
		out.Phases = append(out.Phases, p)
		if p.Err != "" {
			logf("latency messages %-6s FAILED: %s", p.name(), p.Err)
			continue
		}
		logPhase(" messages", p)
	}
	return out
}

// relayUSPerEvent is a drain's relay CPU per event (us), per run.
func (s *drainShape) relayUSPerEvent(tool string) []float64 {
	var xs []float64
	for _, r := range s.runs(tool) {
		xs = append(xs, r.ToolCPU/float64(s.Events)*1e6)
	}
	return xs
}

// issue40Targets are issue 40's "Done when": each drain at >= 0.9x
// pg_recvlogical with at most so much relay CPU per event.
func (r *results) issue40Targets() []target {
	one := func(name string, d *drainShape, usMax float64) target {
		if d == nil || len(d.ratios()) == 0 {
			return target{name, "not measured", "n/a"}
		}
		q, c := summarize(d.ratios()), summarize(d.relayUSPerEvent("relay"))
		v := fmt.Sprintf("%.2fx (min %.2fx, max %.2fx), %.2f us/event (min %.2f, max %.2f)", q.Med, q.Min, q.Max, c.Med, c.Min, c.Max)
		return target{name, v, status(q.Med >= 0.9 && c.Med <= usMax, !math.IsNaN(c.Med))}
	}
	return []target{
		one("Drain, 100 messages/txn: relay >= 0.9x pg_recvlogical of the same messages, <= 4 us/event", r.Messages, 4),
		one("Drain, 100 rows/txn: relay >= 0.9x pg_recvlogical, <= 2.5 us/event", r.drain(100), 2.5),
	}
}

// messagesMarkdown is the report's messages section: the drain beside the
// rows' and the latency beside the rows'.
func (r *results) messagesMarkdown(asset string) string {
	if r.Messages == nil && r.LatencyMsg == nil {
		return ""
	}
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("## 8. The table-less outbox: messages beside rows\n\n")
	if d := r.Messages; d != nil {
		rows := r.drain(msgPerTxn)
		w("The 100 rows/txn backlog's events (the same payload and headers) written instead as transactional logical decoding messages with outbox.WriteMessage's envelope (`pg_logical_emit_message(true, prefix, envelope)` server-side, %d events, %.0f MiB of WAL, written in %.1f s), drained from slots made before it by pg_recvlogical (`--option=messages=true`) and by the relay with `--messages-prefix`, who reads first alternating; medians of %d repeat(s) (min..max).\n\n",
			d.Events, float64(d.WALBytes)/mib, d.FillSeconds, len(d.runs("relay")))
		w("| per drain | rows (100/txn) | messages (100/txn) |\n|---|---:|---:|\n")
		cell := func(d *drainShape, f func(*drainShape) []float64, fmtv func(float64) string) string {
			if d == nil {
				return "n/a"
			}
			xs := f(d)
			if len(xs) == 0 {
				return "n/a"
			}
			s := summarize(xs)
			return fmt.Sprintf("%s (%s..%s)", fmtv(s.Med), fmtv(s.Min), fmtv(s.Max))
		}
		eps := func(tool string) func(*drainShape) []float64 {
			return func(d *drainShape) []float64 {
				var xs []float64
				for _, x := range d.runs(tool) {
					xs = append(xs, x.EventsPerS)
				}
				return xs
			}
		}
		perEv := func(tool string, f func(drainRun) float64) func(*drainShape) []float64 {
			return func(d *drainShape) []float64 {
				var xs []float64
				for _, x := range d.runs(tool) {
					xs = append(xs, f(x)/float64(d.Events)*1e6)
				}
				return xs
			}
		}
		ratio := func(v float64) string { return fmt.Sprintf("%.2fx", v) }
		walPer := func(d *drainShape) []float64 { return []float64{float64(d.WALBytes) / float64(d.Events)} }
		w("| WAL per event, B | %s | %s |\n", cell(rows, walPer, f0), cell(d, walPer, f0))
		w("| pg_recvlogical events/s | %s | %s |\n", cell(rows, eps("pg_recvlogical"), f0), cell(d, eps("pg_recvlogical"), f0))
		w("| relay events/s (to confirmed_flush_lsn) | %s | %s |\n", cell(rows, eps("relay"), f0), cell(d, eps("relay"), f0))
		w("| **ratio relay / pg_recvlogical** | %s | %s |\n", cell(rows, (*drainShape).ratios, ratio), cell(d, (*drainShape).ratios, ratio))
		w("| **relay CPU, us per event** | %s | %s |\n", cell(rows, perEv("relay", func(x drainRun) float64 { return x.ToolCPU }), f2), cell(d, perEv("relay", func(x drainRun) float64 { return x.ToolCPU }), f2))
		w("| walsender CPU, us per event (pg_recvlogical) | %s | %s |\n", cell(rows, perEv("pg_recvlogical", func(x drainRun) float64 { return x.Walsender }), f2), cell(d, perEv("pg_recvlogical", func(x drainRun) float64 { return x.Walsender }), f2))
		w("| walsender CPU, us per event (relay) | %s | %s |\n", cell(rows, perEv("relay", func(x drainRun) float64 { return x.Walsender }), f2), cell(d, perEv("relay", func(x drainRun) float64 { return x.Walsender }), f2))
		w("| broker CPU, us per event (relay) | %s | %s |\n", cell(rows, perEv("relay", func(x drainRun) float64 { return x.Broker }), f2), cell(d, perEv("relay", func(x drainRun) float64 { return x.Broker }), f2))
		w("| relay peak RSS (VmHWM), MiB | %s | %s |\n\n", cell(rows, func(d *drainShape) []float64 {
			var xs []float64
			for _, x := range d.runs("relay") {
				xs = append(xs, float64(x.PeakRSS)/mib)
			}
			return xs
		}, func(v float64) string { return fmt.Sprintf("%.1f", v) }), cell(d, func(d *drainShape) []float64 {
			var xs []float64
			for _, x := range d.runs("relay") {
				xs = append(xs, float64(x.PeakRSS)/mib)
			}
			return xs
		}, func(v float64) string { return fmt.Sprintf("%.1f", v) }))
		if p := d.Profile; p != nil {
			w("Profiled like the rows (section 3), one extra drain of the messages with `--pprof` (%s events/s, not in the table): [CPU](%s-pprof-cpu-messages.txt), [allocations](%s-pprof-allocs-messages.txt).\n\n", f0(p.Run.EventsPerS), asset, asset)
		}
		w("<details><summary>Every messages drain</summary>\n\n| repeat | tool | order | seconds | events/s | last ack s | tool CPU s | walsender CPU s | broker CPU s | records in topic | error |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, x := range d.Runs {
			w("| %d | %s | %d | %.2f | %s | %s | %s | %s | %s | %d | %s |\n", x.Rep, x.Tool, x.Order, x.Seconds, f0(x.EventsPerS), f2(x.AckSeconds), f2(x.ToolCPU), f2(x.Walsender), f2(x.Broker), x.Records, x.Err)
		}
		w("\n</details>\n\n")
	}
	if l := r.LatencyMsg; l != nil {
		w("Latency with messages: the same open-loop generator (%s events per transaction, one `SELECT pg_logical_emit_message(true, prefix, e) FROM unnest($envelopes)` per transaction, outbox.WriteMessage's envelope built client-side), one relay with `--messages-prefix` alone on a fresh slot per rate; the rows columns are the relay leg's lone runs of section 2. CPU per event is the relay's user+sys over the load divided by the generated events.\n\n", strings.TrimSuffix(mixName(r.Scale.LatencyShapes), " rows/txn"))
		if l.Err != "" {
			w("**Error:** %s\n\n", l.Err)
		}
		w("| offered events/s | outbox | delivered | ack p50 | ack p99 | consumer p50 | consumer p99 | consumer max | relay CPU us/event | walsender CPU share | status |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		line := func(kind string, p *latPhase) {
			if p == nil {
				w("| | %s | | | | | | | | | not measured |\n", kind)
				return
			}
			if p.Err != "" {
				w("| %d | %s | | | | | | | | | failed: %s |\n", p.Rate, kind, p.Err)
				return
			}
			w("| %d | %s | %s | %s | %s | %s | %s | %s | %.1f | %s | %s |\n", p.Rate, kind, f0(p.delivered()), fmtSec(p.AckQ[0]), fmtSec(p.AckQ[2]),
				msq(p.ConsQ[0]), msq(p.ConsQ[2]), msq(p.ConsQ[4]), 1e6*p.RelayCPU/math.Max(1, float64(p.Gen.Events)), pct(share(p.WalsenderCPU, p.LoadS)), phaseStatus(p))
		}
		for _, p := range l.Phases {
			line("rows", r.phase(p.Rate))
			line("messages", p)
		}
		w("\n")
	}
	return sb.String()
}

// messagesReserve is the time the messages latency and the dbcost parts
// need after the drains (the time budget's reserve).
func (b *bench) messagesReserve() time.Duration {
	var d time.Duration
	if b.parts["messages"] && b.parts["latency"] {
		d += time.Duration(len(eosRates)) * (b.sc.PhaseDur + 10*time.Second)
	}
	if b.parts["dbcost"] {
		d += 3 * time.Minute
	}
	return d
}

// messagesFiles adds the messages drain's profile summaries to a run's
// files (main.go write), next to the rows' -pprof-cpu.txt.
func (r *results) messagesFiles(files map[string][]byte) {
	if r.Messages == nil || r.Messages.Profile == nil {
		return
	}
	p := r.Messages.Profile
	hdr := fmt.Sprintf("# outbox-relay %%s profile, %s, one %d-event drain of 100 messages/txn (--messages-prefix) (%s)\n# go tool pprof -top -nodecount=40%%s\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Messages.Events, r.Git)
	if p.CPUTop != "" {
		files["-pprof-cpu-messages.txt"] = []byte(fmt.Sprintf(hdr, "CPU", "") + p.CPUTop)
	}
	if p.AllocTop != "" {
		files["-pprof-allocs-messages.txt"] = []byte(fmt.Sprintf(hdr, "allocation", " -sample_index=alloc_space") + p.AllocTop)
	}
}
