package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

const ackHistogram = "outbox_relay_commit_to_ack_seconds"

// warmupEvents are committed (and delivered) to each topic of a phase before
// it is measured, so topic metadata and partition leaders are not part of the
// measurement; they are not counted.
const warmupEvents = 10

// quantiles reported everywhere, in this order (followed by the max).
var quantiles = []float64{0.5, 0.9, 0.99, 0.999}

// consShape is the consumer-side latency of one transaction shape.
type consShape struct {
	Txn   int
	Topic string
	Q     []float64 // ms at quantiles, then max
	N     int
}

// latPhase is one offered rate (events/s, split evenly between the
// transaction shapes).
type latPhase struct {
	Rate   int
	Shapes []int // rows per transaction, the rate split evenly between them
	// OneRow: the extra 1-row phase at oneRowRate (the low-rate
	// figure), next to the scale's mix; not in the figure or the targets.
	OneRow bool
	Gen    loadResult
	GenCPU float64 // seconds of the generator process
	LoadS  float64 // wall seconds the generator ran (launch to exit): CPU shares
	SchedS float64 // schedule start to generator exit: delivered rate

	AckQ     []float64 // commit->ack seconds at quantiles, then max (+Inf: above 60 s)
	AckCount float64
	ConsQ    []float64 // commit->consumer-receive ms, all shapes, at quantiles, then max
	ConsN    int
	ByShape  []consShape

	RelayCPU, WalsenderCPU, BrokerCPU float64 // seconds during the load
	RelayRSSMax                       int64
	MaxSlotLag                        int64   // bytes: pg_current_wal_lsn() - confirmed_flush_lsn, sampled each second
	AckedDuringLoad                   float64 // events Kafka acked while the generator ran
	SteadyDelivered                   float64 // acked events/s from 20% of the schedule to its end (NaN: too few samples)
	BacklogAtEnd                      int     // committed but not yet acked when the load stopped
	CatchUpS                          float64 // load end to every event acked (NaN: not within the limit)

	GenBehind   bool
	RelayBehind bool
	Err         string

	// Legs: every tool that published this phase's load side by side
	// (legs[0] is the relay above), see latLeg.
	Legs []legStats
	// TurnOrder: turns mode, the leg names in the order they ran alone.
	TurnOrder []string
}

// legStats is what one tool did in one phase.
type legStats struct {
	Name    string
	Desc    string
	ConsQ   []float64 // commit->consumer ms at quantiles, then max
	ConsN   int       // records received (duplicates included)
	Dups    int       // records received more than once (by the payload's seq)
	Missing int       // generated events never received
	CPU     float64   // seconds of the tool's process during the load
	Profile string    // CPU profile of the phase (.pb.gz), if taken
	AckP50  float64   // a relay leg's commit->ack median (its histogram, seconds); 0 for the forwarder
	// Events and LoadS: the generated events and the generator's wall
	// seconds of the run this leg took part in (its own run in turns mode).
	Events int
	LoadS  float64
	Status string // turns mode: the verdict of the leg's lone run (legVerdict)
	Err    string // turns mode: the leg's lone run failed
}

// usPerEvent is the tool's CPU per generated event, microseconds.
func (l *legStats) usPerEvent() float64 { return 1e6 * l.CPU / float64(l.Events) }

func (p *latPhase) name() string {
	if p.OneRow {
		return rateName(p.Rate) + " 1-row"
	}
	return rateName(p.Rate)
}

// label is the phase's rate in the report's tables.
func (p *latPhase) label() string {
	if p.OneRow {
		return fmt.Sprintf("%d (1-row)", p.Rate)
	}
	return fmt.Sprint(p.Rate)
}

// oneRowRate gets an extra phase of 1-row transactions only, before the
// mix at the same rate, when the scale's mix is not 1-row already.
const oneRowRate = 1000

// achieved is the generator's committed events/s over its configured duration.
func (p *latPhase) achieved() float64 { return float64(p.Gen.Events) / p.Gen.DurationS }

// delivered is the relay's acked events/s in the steady part of the load
// (from 20% of the schedule to its end): with a stationary backlog it equals
// the generated rate whatever the latency; below it, the slot lag grows.
func (p *latPhase) delivered() float64 { return p.SteadyDelivered }

func share(cpu, wall float64) float64 { return cpu / wall }

func shapeName(txn int) string {
	if txn == 1 {
		return "1 row/txn"
	}
	return fmt.Sprintf("%d rows/txn", txn)
}

func mixName(shapes []int) string {
	var s []string
	for _, t := range shapes {
		s = append(s, fmt.Sprint(t))
	}
	return strings.Join(s, " and ") + " rows/txn"
}

func rateName(r int) string {
	if r%1000 == 0 {
		return fmt.Sprintf("%dk/s", r/1000)
	}
	return fmt.Sprintf("%d/s", r)
}

// eosRates are the offered rates of the exactly-once latency run (issue 14:
// commit-to-visible at 1k and 5k events/s), those of the scale's rates.
var eosRates = []int{1000, 5000}

// latencyRun is the steady-state part: the relay (and, at-least-once, the
// other legs side by side), phases in increasing rate.
type latencyRun struct {
	EOS     bool   // delivery: exactly_once, read_committed consumers
	Mode    string // latTurns or latTogether ("" with one leg: exactly-once)
	Legs    []string
	Phases  []*latPhase
	PeakRSS int64 // VmHWM of the relay at the end
	Err     string
}

// altFlush is the relay's kafka.flush_frequency other than its default: the
// relay-alt leg runs with it, so every report has both.
const altFlush = "1ms"

// The latency legs run in turns (the default) or together
// (OUTBOX_BENCH_LAT_MODE). Together they share the box's cores with each
// other's walsenders: on 2 cores three legs and the generator overload it, so
// the relay's figures, which the targets judge, were not a lone relay's.
const (
	latTurns    = "turns"    // every phase once per leg, each leg alone on a fresh slot
	latTogether = "together" // all legs at once on one generator's transactions
)

// parseLatMode reads OUTBOX_BENCH_LAT_MODE ("" = turns).
func parseLatMode(v string) (string, error) {
	switch m := strings.TrimSpace(v); m {
	case "":
		return latTurns, nil
	case latTurns, latTogether:
		return m, nil
	}
	return "", fmt.Errorf("OUTBOX_BENCH_LAT_MODE=%q: want %s (each leg alone, in turn) or %s (all legs at once)", v, latTurns, latTogether)
}

// turnOrder is the order in which n legs run alone in phase i (turns mode):
// rotated by one per phase, so no leg always goes first and, over n phases,
// every leg takes every place once.
func turnOrder(n, phase int) []int {
	out := make([]int, n)
	for j := range out {
		out[j] = (phase + j) % n
	}
	return out
}

// mergeTurns makes one phase out of the legs' lone runs of it (turns mode,
// runs[k] is leg names[k]'s, nil: not run): the relay's run (runs[0]) gives
// the phase's own figures, which the tables and the targets show, and every
// run gives its leg's row of the side-by-side table, with that run's
// generated events and load time.
func mergeTurns(names, descs []string, runs []*latPhase, order []int) *latPhase {
	var p latPhase
	if runs[0] != nil {
		p = *runs[0]
	} else {
		p = latPhase{Err: "the relay leg did not run", CatchUpS: math.NaN()}
	}
	p.Legs = nil
	for _, k := range order {
		p.TurnOrder = append(p.TurnOrder, names[k])
	}
	for k, r := range runs {
		switch {
		case r == nil:
		case r.Err != "" || len(r.Legs) == 0:
			p.Legs = append(p.Legs, legStats{Name: names[k], Desc: descs[k], Err: cmp.Or(r.Err, "no result")})
		default:
			ls := r.Legs[0]
			ls.Status = legVerdict(r)
			p.Legs = append(p.Legs, ls)
		}
	}
	return &p
}

// legVerdict is phaseStatus for any leg's lone run (its first leg's
// delivered rate and catch-up).
func legVerdict(p *latPhase) string {
	return strings.NewReplacer("**", "", "relay not sustained", "not sustained").Replace(phaseStatus(p))
}

// latLeg is one tool of the latency part: each runs from its own slot to
// its own topics, on the same generator settings; in turns (see latTurns)
// or all at the same time on the same committed transactions.
type latLeg struct {
	name, desc string
	slot, base string
	rp         *relayProc // a relay leg
	fwd        *exec.Cmd  // the forwarder
	pid        int
}

// legNames are the latency legs (OUTBOX_BENCH_LAT_LEGS): relay (defaults),
// relay-alt (--kafka-flush-frequency altFlush), relay-<duration> (that
// flush frequency, e.g. relay-0s), relay-p1 (GOMAXPROCS=1), forwarder, and with OUTBOX_BENCH_RELAY_BASE base and base-0s.
func legNames() []string {
	var out []string
	for _, f := range strings.Split(getenv("OUTBOX_BENCH_LAT_LEGS", "relay,relay-alt,forwarder"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	if len(out) == 0 || out[0] != "relay" {
		out = append([]string{"relay"}, slices.DeleteFunc(out, func(s string) bool { return s == "relay" })...)
	}
	return out
}

// legConfig is what a leg runs: its description, and for a relay leg the
// binary and extra flags.
func (b *bench) legConfig(name string) (desc, bin string, flags []string, err error) {
	bin = b.relayBin
	switch name {
	case "relay":
		desc = "relay, defaults"
	case "relay-alt":
		desc, flags = "relay, --kafka-flush-frequency "+altFlush, []string{"--kafka-flush-frequency", altFlush}
	case "relay-p1":
		desc = "relay, GOMAXPROCS=1"
	case "base", "base-0s":
		if bin = b.relayBase; bin == "" {
			return "", "", nil, fmt.Errorf("latency leg %s needs OUTBOX_BENCH_RELAY_BASE (-relay-base)", name)
		}
		desc = "base relay (" + filepath.Base(bin) + "), defaults"
		if name == "base-0s" {
			desc, flags = "base relay, --kafka-flush-frequency 0s", []string{"--kafka-flush-frequency", "0s"}
		}
	case "forwarder":
		desc, bin = "minimal forwarder (pglogrepl + sarama, flush unset)", ""
	default:
		// relay-<duration>: the relay with --kafka-flush-frequency <duration>
		if f, ok := strings.CutPrefix(name, "relay-"); ok {
			if _, err := time.ParseDuration(f); err == nil {
				return "relay, --kafka-flush-frequency " + f, bin, []string{"--kafka-flush-frequency", f}, nil
			}
		}
		return "", "", nil, fmt.Errorf("OUTBOX_BENCH_LAT_LEGS: unknown leg %q (relay, relay-alt, relay-<flush frequency> e.g. relay-0s, relay-p1, base, base-0s, forwarder)", name)
	}
	return desc, bin, flags, nil
}

// startLeg creates the leg's slot and starts it. tag ("" or e.g. "-5k")
// names its log and profile files apart when a leg starts once per phase.
func (b *bench) startLeg(name, tag string) (*latLeg, error) {
	safe := strings.ReplaceAll(name, "-", "_")
	l := &latLeg{name: name, slot: b.pg.schema + "_lat", base: "lat"}
	if name != "relay" {
		l.slot, l.base = b.pg.schema+"_lat_"+safe, "lat"+strings.ReplaceAll(name, "-", "")
	}
	desc, bin, flags, err := b.legConfig(name)
	if err != nil {
		return nil, err
	}
	l.desc = desc
	if _, err := b.pg.createSlot(context.Background(), l.slot); err != nil {
		return nil, err
	}
	if name == "forwarder" {
		logPath := filepath.Join(b.runDir, "forwarder"+tag+".log")
		lf, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		defer lf.Close()
		l.fwd = exec.Command(b.self, "forward", "-pg-url", b.pg.url, "-slot", l.slot, "-publication", b.pg.pub,
			"-brokers", strings.Join(b.brokers, ","), "-topic-prefix", b.topicPrefix+l.base+".")
		if os.Getenv("OUTBOX_BENCH_LAT_PROFILE") != "" {
			l.fwd.Args = append(l.fwd.Args, "-cpuprofile", filepath.Join(b.runDir, "lat-forwarder"+tag+"-cpu.pb.gz"))
		}
		l.fwd.Stdout, l.fwd.Stderr = lf, lf
		l.fwd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := l.fwd.Start(); err != nil {
			return nil, err
		}
		l.pid = l.fwd.Process.Pid
		return l, nil
	}
	if os.Getenv("OUTBOX_BENCH_LAT_PROFILE") != "" {
		flags = append(flags, "--pprof")
	}
	if name == "relay-p1" {
		b.relayEnv = []string{"GOMAXPROCS=1"}
	}
	rp, err := b.startRelayBin(bin, "latency-"+name+tag, l.slot, b.topicPrefix+l.base+".{aggregate_type}", flags...)
	b.relayEnv = nil
	if err != nil {
		b.pg.dropSlot(context.Background(), l.slot) // a later phase's leg (turns) creates it again
		return nil, err
	}
	l.rp, l.pid = rp, rp.pid
	return l, rp.waitReady(60 * time.Second)
}

func (b *bench) stopLeg(l *latLeg) {
	if l.rp != nil {
		l.rp.stop()
	}
	if l.fwd != nil {
		l.fwd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { l.fwd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			l.fwd.Process.Kill()
			<-done
		}
	}
	b.pg.dropSlot(context.Background(), l.slot)
}

// exited: a leg's process is gone.
func (l *latLeg) exited() error {
	if l.rp != nil {
		return l.rp.exited()
	}
	if l.fwd.ProcessState != nil || syscall.Kill(l.pid, 0) != nil {
		return fmt.Errorf("forwarder exited (see forwarder.log)")
	}
	return nil
}

// runLatency measures the scale's rates with an at-least-once relay and the
// other legs side by side, or, with eos, the eosRates among them with an
// exactly-once relay (--delivery exactly_once) and read_committed consumers:
// commit to visible.
func (b *bench) runLatency(ctx context.Context, eos bool) *latencyRun {
	out := &latencyRun{EOS: eos}
	rates := b.sc.Rates
	if eos {
		rates = nil
		for _, r := range b.sc.Rates {
			if slices.Contains(eosRates, r) {
				rates = append(rates, r)
			}
		}
	}
	var specs []phaseSpec
	for _, rate := range rates {
		if !eos && rate == oneRowRate && !slices.Equal(b.sc.LatencyShapes, []int{1}) {
			specs = append(specs, phaseSpec{rate, []int{1}, true})
		}
		specs = append(specs, phaseSpec{rate, b.sc.LatencyShapes, false})
	}
	if !eos && b.latMode == latTurns {
		out.Mode = latTurns
		b.latencyTurns(ctx, out, specs)
		return out
	}
	var legs []*latLeg
	defer func() {
		for _, l := range legs {
			b.stopLeg(l)
		}
	}()
	if eos {
		l := &latLeg{name: "relay", desc: "relay, --delivery exactly_once", slot: b.pg.schema + "_lateos", base: "lateos"}
		if _, err := b.pg.createSlot(ctx, l.slot); err != nil {
			out.Err = err.Error()
			return out
		}
		legs = append(legs, l)
		rp, err := b.startRelay("latency-eos", l.slot, b.topicPrefix+l.base+".{aggregate_type}", "--delivery", "exactly_once")
		if err != nil {
			out.Err = err.Error()
			return out
		}
		l.rp, l.pid = rp, rp.pid
		if err := rp.waitReady(60 * time.Second); err != nil {
			out.Err = err.Error()
			return out
		}
	} else {
		out.Mode = latTogether
		for _, name := range legNames() {
			l, err := b.startLeg(name, "")
			if l != nil {
				legs = append(legs, l)
			}
			if err != nil {
				out.Err = fmt.Sprintf("leg %s: %v", name, err)
				return out
			}
		}
	}
	for _, l := range legs {
		out.Legs = append(out.Legs, l.desc)
	}
	rp := legs[0].rp
	mode := ""
	if eos {
		mode = " exactly-once"
	}
	for _, sp := range specs {
		p := b.latencyPhase(ctx, legs, sp.rate, sp.shapes, sp.oneRow, eos)
		out.Phases = append(out.Phases, p)
		if p.Err != "" {
			logf("latency%s %-6s FAILED: %s", mode, p.name(), p.Err)
			for _, l := range legs {
				if err := l.exited(); err != nil {
					out.Err = err.Error()
					return out
				}
			}
			continue
		}
		logPhase(mode, p)
		if ctx.Err() != nil {
			break
		}
	}
	if _, hwm, err := procMem(rp.pid); err == nil {
		out.PeakRSS = hwm
	}
	return out
}

// phaseSpec is one phase of the latency part: an offered rate and its
// transaction shapes.
type phaseSpec struct {
	rate   int
	shapes []int
	oneRow bool
}

// latencyTurns runs every phase once per leg, each leg alone: started on a
// fresh slot just before its run (so no slot holds a backlog from another
// leg's run) and stopped after it, with the same generator settings. The
// legs' order rotates between phases (turnOrder).
func (b *bench) latencyTurns(ctx context.Context, out *latencyRun, specs []phaseSpec) {
	names := legNames()
	descs := make([]string, len(names))
	for k, name := range names {
		d, _, _, err := b.legConfig(name)
		if err != nil {
			out.Err = fmt.Sprintf("leg %s: %v", name, err)
			return
		}
		descs[k] = d
	}
	out.Legs = descs
	if len(specs) > 0 && ctx.Err() == nil {
		// The first turn of a run was measured slower than the same leg
		// later (1k/s: consumer p50 2.2-3.5 ms first, 1.5-1.6 ms in turn 2
		// or 3, whichever leg went first): the broker and the machine warm
		// up. One unmeasured turn of the first leg goes before the phases.
		sp := specs[0]
		if l, err := b.startLeg(names[0], "-warm"); err == nil {
			r := b.latencyPhase(ctx, []*latLeg{l}, sp.rate, sp.shapes, sp.oneRow, false)
			b.stopLeg(l)
			logf("latency warm-up turn %s at %s (not measured)%s", names[0], rateName(sp.rate), map[bool]string{true: ": " + r.Err}[r.Err != ""])
		}
	}
	for i, sp := range specs {
		order := turnOrder(len(names), i)
		runs := make([]*latPhase, len(names))
		for j, k := range order {
			if ctx.Err() != nil {
				break
			}
			name := names[k]
			tag := "-" + strings.ReplaceAll(strings.TrimSuffix(rateName(sp.rate), "/s"), " ", "")
			if sp.oneRow {
				tag += "-1row"
			}
			l, err := b.startLeg(name, tag)
			if err != nil {
				runs[k] = &latPhase{Rate: sp.rate, Shapes: sp.shapes, OneRow: sp.oneRow, CatchUpS: math.NaN(), Err: "start: " + err.Error()}
			} else {
				runs[k] = b.latencyPhase(ctx, []*latLeg{l}, sp.rate, sp.shapes, sp.oneRow, false)
				if _, hwm, err := procMem(l.pid); err == nil && k == 0 {
					out.PeakRSS = max(out.PeakRSS, hwm)
				}
			}
			if l != nil {
				b.stopLeg(l)
			}
			r := runs[k]
			if r.Err != "" {
				logf("latency %-6s turn %d/%d %s alone: FAILED: %s", r.name(), j+1, len(order), name, r.Err)
				continue
			}
			ls := r.Legs[0]
			logf("latency %-6s turn %d/%d %-9s alone: generated %6.0f ev/s, delivered %6.0f ev/s, consumer p50 %s p99 %s, CPU %6.1f us/event, max slot lag %.1f MiB [%s]",
				r.name(), j+1, len(order), name, r.achieved(), r.delivered(), msq(ls.ConsQ[0]), msq(ls.ConsQ[2]), ls.usPerEvent(),
				float64(r.MaxSlotLag)/mib, legVerdict(r))
		}
		p := mergeTurns(names, descs, runs, order)
		out.Phases = append(out.Phases, p)
		if p.Err != "" {
			logf("latency %-6s FAILED: %s", p.name(), p.Err)
		} else {
			logPhase("", p)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// logPhase prints a phase's relay figures and its legs side by side.
func logPhase(mode string, p *latPhase) {
	logf("latency%s %-6s generated %6.0f ev/s, delivered %6.0f ev/s, ack p50 %s p99 %s p99.9 %s, consumer p50 %s p99 %s, relay CPU %3.0f%%, RSS %3.0f MiB [%s]",
		mode, p.name(), p.achieved(), p.delivered(), fmtSec(p.AckQ[0]), fmtSec(p.AckQ[2]), fmtSec(p.AckQ[3]), msq(p.ConsQ[0]), msq(p.ConsQ[2]),
		100*share(p.RelayCPU, p.LoadS), float64(p.RelayRSSMax)/(1<<20), strings.ReplaceAll(phaseStatus(p), "*", ""))
	for _, l := range p.Legs {
		if l.Err != "" {
			logf("  %-50s FAILED: %s", l.Desc, l.Err)
			continue
		}
		logf("  %-50s consumer p50 %s p99 %s p99.9 %s, CPU %6.1f us/event, received %d (dups %d, missing %d), ack p50 %s",
			l.Desc, msq(l.ConsQ[0]), msq(l.ConsQ[2]), msq(l.ConsQ[3]), l.usPerEvent(), l.ConsN, l.Dups, l.Missing, fmtSec(l.ackP50()))
	}
}

func (b *bench) latencyPhase(ctx context.Context, legs []*latLeg, rate int, shapes []int, oneRow, eos bool) *latPhase {
	p := &latPhase{Rate: rate, Shapes: shapes, OneRow: oneRow, CatchUpS: math.NaN()}
	// legs[0] is measured: a relay, or in turns mode any leg alone (rp nil
	// for the forwarder: no histogram, and its consumers count as acked).
	rp, slot := legs[0].rp, legs[0].slot
	prefix := fmt.Sprintf("r%d", rate)
	if oneRow {
		prefix += "x" // topics of their own
	}
	var topics []string // the relay leg's
	consumers := make([]map[int]*latencyConsumer, len(legs))
	defer func() {
		for _, cs := range consumers {
			for _, lc := range cs {
				lc.close()
			}
		}
		for _, l := range legs {
			for _, txn := range p.Shapes {
				b.kafka.deleteTopic(b.topicPrefix + l.base + "." + aggTypeFor(prefix, txn))
			}
		}
	}()
	for i, l := range legs {
		consumers[i] = map[int]*latencyConsumer{}
		for _, txn := range p.Shapes {
			t := b.topicPrefix + l.base + "." + aggTypeFor(prefix, txn)
			if err := b.kafka.createTopic(t); err != nil {
				p.Err = err.Error()
				return p
			}
			var opts []testkit.ReadOption
			if eos {
				opts = append(opts, testkit.ReadCommitted) // visible = committed in Kafka
			}
			lc, err := b.kafka.consume(t, opts...)
			if err != nil {
				p.Err = err.Error()
				return p
			}
			consumers[i][txn] = lc
			if i == 0 {
				topics = append(topics, t)
				p.ByShape = append(p.ByShape, consShape{Txn: txn, Topic: t})
			}
		}
	}
	received := func(i int) int {
		n := 0
		for _, lc := range consumers[i] {
			n += lc.count()
		}
		return n
	}
	forgotten := 0 // the warm-up events the consumers forgot at their reset
	published := func() float64 {
		if rp == nil {
			// The forwarder acks no metric; what reached its consumers was
			// acked by Kafka before (a little later than the ack).
			return float64(forgotten + received(0))
		}
		ss, err := rp.scrape()
		if err != nil {
			return -1
		}
		sum := 0.0
		for _, t := range topics {
			v, _ := testkit.SumMetric(ss, "outbox_relay_events_published_total", map[string]string{"topic": t})
			sum += v
		}
		return sum
	}
	allReceived := func(n int) bool {
		for i := range legs {
			if received(i) < n {
				return false
			}
		}
		return true
	}
	// Warm-up: a first transaction to each topic, so the producer knows the
	// topics' partitions and leaders before anything is measured.
	warm := warmupEvents * len(topics)
	for _, txn := range p.Shapes {
		q, qargs := b.warmupFill(int64(warmupEvents), aggTypeFor(prefix, txn))
		if _, err := b.pg.pool.Exec(ctx, q, qargs...); err != nil {
			p.Err = "warm-up: " + err.Error()
			return p
		}
	}
	for t := time.Now(); published() < float64(warm) || !allReceived(warm); {
		if time.Since(t) > 30*time.Second {
			p.Err = "warm-up events not delivered within 30s"
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
	forgotten = received(0)
	for _, cs := range consumers {
		for _, lc := range cs {
			lc.reset()
		}
	}
	var h0 []bucket
	if rp != nil {
		ss0, err := rp.scrape()
		if err != nil {
			p.Err = err.Error()
			return p
		}
		h0 = histogram(ss0, ackHistogram)
	}
	legH0 := make([][]bucket, len(legs))
	for i, l := range legs {
		if l.rp != nil {
			if ss, err := l.rp.scrape(); err == nil {
				legH0[i] = histogram(ss, ackHistogram)
			}
		}
	}
	_, wpid, _ := b.pg.slotState(ctx, slot)
	legCPU0 := make([]time.Duration, len(legs))
	for i, l := range legs {
		legCPU0[i], _ = procCPU(l.pid)
	}
	relay0 := legCPU0[0]
	wal0, _ := procCPU(wpid)
	broker0 := b.brokerCPU()

	var stdout, stderr bytes.Buffer
	args := []string{"loadgen", "-pg-url", b.pg.url, "-table", b.pg.table, "-agg-prefix", prefix,
		"-rate", itoa(rate), "-mix", joinInts(p.Shapes), "-duration", b.sc.PhaseDur.String(),
		"-conns", itoa(b.sc.Conns), "-seed", itoa(rate)}
	args = append(args, b.loadgenExtra()...)
	cmd := exec.CommandContext(ctx, b.self, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		p.Err = err.Error()
		return p
	}
	// CPU profiles of the relay legs over the phase (OUTBOX_BENCH_LAT_PROFILE).
	profiles := make([]string, len(legs))
	var profWG sync.WaitGroup
	if os.Getenv("OUTBOX_BENCH_LAT_PROFILE") != "" && !eos {
		secs := max(1, int(b.sc.PhaseDur.Seconds())-1)
		for i, l := range legs {
			if l.rp == nil {
				continue
			}
			profWG.Add(1)
			go func() {
				defer profWG.Done()
				dst := filepath.Join(b.runDir, fmt.Sprintf("lat-%s-%s-cpu.pb.gz", rateName(rate)[:len(rateName(rate))-2], l.name))
				if err := l.rp.fetch(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), dst); err != nil {
					logf("latency profile %s: %v", l.name, err)
					return
				}
				profiles[i] = dst
			}()
		}
	}
	// Samplers while the load runs: relay RSS (250 ms), acked events (500
	// ms), slot lag (1 s).
	type ackSample struct {
		t time.Time
		n float64
	}
	var acks []ackSample
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if rss, _, err := procMem(legs[0].pid); err == nil && rss > p.RelayRSSMax {
				p.RelayRSSMax = rss
			}
			if i%2 == 1 {
				if n := published(); n >= 0 {
					acks = append(acks, ackSample{time.Now(), n})
				}
				for _, l := range legs[1:] {
					if l.rp != nil {
						l.rp.scrape() // every relay leg is scraped alike: the same cost in each
					}
				}
			}
			if i%4 == 3 {
				if lag, err := b.pg.slotLag(ctx, slot); err == nil && lag > p.MaxSlotLag {
					p.MaxSlotLag = lag
				}
			}
		}
	}()
	err := cmd.Wait()
	tEnd := time.Now()
	close(stop)
	wg.Wait()
	p.LoadS = tEnd.Sub(t0).Seconds()
	legCPU1 := make([]time.Duration, len(legs))
	for i, l := range legs {
		legCPU1[i], _ = procCPU(l.pid)
	}
	relay1 := legCPU1[0]
	wal1, _ := procCPU(wpid)
	p.RelayCPU = (relay1 - relay0).Seconds()
	p.WalsenderCPU = (wal1 - wal0).Seconds()
	p.BrokerCPU = b.brokerCPU() - broker0
	profWG.Wait()
	if cmd.ProcessState != nil {
		p.GenCPU = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	if err != nil {
		p.Err = fmt.Sprintf("loadgen: %v: %s", err, strings.TrimSpace(stderr.String()))
		return p
	}
	if err := json.Unmarshal(stdout.Bytes(), &p.Gen); err != nil {
		p.Err = fmt.Sprintf("loadgen output %q: %v", stdout.String(), err)
		return p
	}
	for _, sh := range p.Gen.Shapes {
		if sh.Errors > 0 {
			logf("latency %s: %d transactions of %s failed, first: %s", p.name(), sh.Errors, shapeName(sh.Txn), sh.FirstError)
		}
	}
	p.SchedS = tEnd.Sub(time.Unix(0, p.Gen.StartNs)).Seconds()
	p.AckedDuringLoad = published() - float64(warm)
	p.SteadyDelivered = math.NaN()
	{
		from := time.Unix(0, p.Gen.StartNs).Add(b.sc.PhaseDur / 5)
		to := time.Unix(0, p.Gen.StartNs).Add(b.sc.PhaseDur)
		var first, last *ackSample
		for i := range acks {
			if a := &acks[i]; !a.t.Before(from) && !a.t.After(to) {
				if first == nil {
					first = a
				}
				last = a
			}
		}
		if first != nil && last != first && last.t.Sub(first.t) > time.Second {
			p.SteadyDelivered = (last.n - first.n) / last.t.Sub(first.t).Seconds()
		}
	}
	p.BacklogAtEnd = p.Gen.Events - int(p.AckedDuringLoad)
	// Wait until the relay acked everything the generator committed...
	limit := max(60*time.Second, 2*b.sc.PhaseDur)
	for time.Since(tEnd) < limit {
		if published() >= float64(p.Gen.Events+warm) {
			p.CatchUpS = time.Since(tEnd).Seconds()
			break
		}
		if err := legs[0].exited(); err != nil {
			p.Err = err.Error()
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	// ... and every leg's consumers received it.
	for t := time.Now(); time.Since(t) < 30*time.Second && !allReceived(p.Gen.Events); {
		time.Sleep(20 * time.Millisecond)
	}
	if rp != nil {
		ss1, err := rp.scrape()
		if err != nil {
			p.Err = err.Error()
			return p
		}
		h := histDelta(h0, histogram(ss1, ackHistogram))
		p.AckCount = histCount(h)
		for _, q := range quantiles {
			p.AckQ = append(p.AckQ, histQuantile(q, h))
		}
		p.AckQ = append(p.AckQ, histMax(h))
	} else {
		for range len(quantiles) + 1 {
			p.AckQ = append(p.AckQ, math.NaN())
		}
	}
	for i, l := range legs {
		ls := legStats{Name: l.name, Desc: l.desc, CPU: (legCPU1[i] - legCPU0[i]).Seconds(), Profile: profiles[i],
			Events: p.Gen.Events, LoadS: p.LoadS}
		if l.rp != nil && legH0[i] != nil {
			if ss, err := l.rp.scrape(); err == nil {
				h := histDelta(legH0[i], histogram(ss, ackHistogram))
				ls.AckP50 = histQuantile(0.5, h)
			}
		}
		var all []float64
		distinct := 0
		for j := range p.Shapes {
			txn := p.Shapes[j]
			lc := consumers[i][txn]
			lats, d, dups := lc.closeCount()
			delete(consumers[i], txn)
			distinct += d
			ls.Dups += dups
			if i == 0 {
				cs := &p.ByShape[j]
				cs.N = len(lats)
				cs.Q = latQuantiles(lats)
			}
			all = append(all, lats...)
		}
		slices.Sort(all)
		ls.ConsN = len(all)
		ls.ConsQ = latQuantiles(all)
		ls.Missing = max(0, p.Gen.Events-distinct)
		if i == 0 {
			p.ConsN = ls.ConsN
			p.ConsQ = ls.ConsQ
		}
		if ls.Dups > 0 || ls.Missing > 0 {
			logf("latency %s %s: %d duplicates, %d of %d events missing", p.name(), l.name, ls.Dups, ls.Missing, p.Gen.Events)
		}
		p.Legs = append(p.Legs, ls)
	}
	// Verdicts. The generator is behind when it committed < 95% of the
	// offered events or > 1% of its transactions started > 10 ms late. The
	// relay did not sustain the load when it acked < 95% of the generated
	// rate in the steady part of the phase (its backlog, the slot lag, grew),
	// or it never caught up.
	p.GenBehind = float64(p.Gen.Events) < 0.95*float64(rate)*p.Gen.DurationS ||
		float64(p.Gen.LateOver10) > 0.01*float64(p.Gen.Executed)
	p.RelayBehind = p.SteadyDelivered < 0.95*p.achieved() || math.IsNaN(p.CatchUpS)
	if p.ConsN < p.Gen.Events {
		logf("latency %s: the consumer received %d of %d events", p.name(), p.ConsN, p.Gen.Events)
	}
	return p
}

// latQuantiles of sorted samples, then the max.
func latQuantiles(sorted []float64) []float64 {
	var q []float64
	for _, x := range quantiles {
		q = append(q, exactQuantile(sorted, x))
	}
	if len(sorted) == 0 {
		return append(q, math.NaN())
	}
	return append(q, sorted[len(sorted)-1])
}

func fmtSec(s float64) string {
	switch {
	case math.IsNaN(s):
		return "n/a"
	case math.IsInf(s, 1):
		return "> 60 s"
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1000)
	default:
		return fmt.Sprintf("%.2f s", s)
	}
}

// ackP50 is the commit->ack median of a relay leg, NaN for the forwarder
// (it has no histogram).
func (l *legStats) ackP50() float64 {
	if l.Name == "forwarder" {
		return math.NaN()
	}
	return l.AckP50
}
