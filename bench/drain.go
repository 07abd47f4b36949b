package main

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// drainRun is one drain of the backlog by one tool.
type drainRun struct {
	Tool       string // "pg_recvlogical", "relay", "relay_eos" (delivery: exactly_once) or "relay_base" (-relay-base)
	Rep        int
	Order      int // 1 = drained first in its repeat
	Slot       string
	Seconds    float64 // start of the process to the end LSN (relay: confirmed_flush_lsn >= end)
	AckSeconds float64 // relay only: start to every event acked (published_total == events)
	EventsPerS float64
	ToolCPU    float64 // seconds (relay only: pg_recvlogical's own CPU is not of interest)
	Walsender  float64 // seconds, NaN if not read
	Broker     float64 // seconds
	PeakRSS    int64   // bytes (relay VmHWM)
	Records    int64   // records in the topic afterwards (relay)
	// relay_eos only, from its metrics: Kafka transactions committed and
	// aborted, and the mean commit time (CommitTxn: flush and EndTxn).
	Txns, Aborted int
	CommitMs      float64
	Err           string
}

// drainShape is everything measured for one transaction shape.
type drainShape struct {
	PerTxn      int
	Events      int
	FillSeconds float64
	StartLSN    int64
	EndLSN      int64
	AvgPayload  float64
	WALBytes    int64
	Runs        []drainRun
	Skipped     int // repeats left out to stay within the time budget
	Profile     *profileResult
	ProfileBase *profileResult // the base relay's (-relay-base)
}

func (s *drainShape) runs(tool string) []drainRun {
	var out []drainRun
	for _, r := range s.Runs {
		if r.Tool == tool && r.Err == "" {
			out = append(out, r)
		}
	}
	return out
}

// perRepeat is val(tool) / val(ref) per repeat (side by side on the same
// backlog), for the repeats where both ran.
func (s *drainShape) perRepeat(tool, ref string, val func(drainRun) float64) []float64 {
	den := map[int]float64{}
	for _, r := range s.runs(ref) {
		den[r.Rep] = val(r)
	}
	var out []float64
	for _, r := range s.runs(tool) {
		if v, ok := den[r.Rep]; ok && v > 0 {
			out = append(out, val(r)/v)
		}
	}
	return out
}

func eventsPerS(r drainRun) float64 { return r.EventsPerS }

// ratios are relay / pg_recvlogical events/s, per repeat.
func (s *drainShape) ratios() []float64 { return s.ratiosOf("relay") }

// ratiosOf are tool / pg_recvlogical events/s, per repeat.
func (s *drainShape) ratiosOf(tool string) []float64 {
	return s.perRepeat(tool, "pg_recvlogical", eventsPerS)
}

// cpuVsBase are relay / relay_base CPU per event, per repeat.
func (s *drainShape) cpuVsBase() []float64 {
	return s.perRepeat("relay", "relay_base", func(r drainRun) float64 { return r.ToolCPU })
}

// eosRatios are relay exactly-once / relay at-least-once events/s, per repeat.
func (s *drainShape) eosRatios() []float64 { return s.perRepeat("relay_eos", "relay", eventsPerS) }

// runDrain measures one shape: create every slot it needs, then insert the
// backlog once, then drain it with pg_recvlogical and the relay, alternately
// first, `repeats` times, each from a fresh slot made before the backlog.
func (b *bench) runDrain(ctx context.Context, perTxn int) (*drainShape, error) {
	sh := &drainShape{PerTxn: perTxn, Events: b.sc.DrainEvents}
	profile := b.profile && perTxn == b.profileShape
	type slotPair struct{ rec, rel, eos, base string } // eos, base: "" when not measured
	var slots []slotPair
	for rep := 1; rep <= b.sc.Repeats; rep++ {
		sp := slotPair{
			rec: fmt.Sprintf("%s_d%d_r%d_recv", b.pg.schema, perTxn, rep),
			rel: fmt.Sprintf("%s_d%d_r%d_relay", b.pg.schema, perTxn, rep),
		}
		if b.eos {
			sp.eos = fmt.Sprintf("%s_d%d_r%d_eos", b.pg.schema, perTxn, rep)
		}
		if b.relayBase != "" {
			sp.base = fmt.Sprintf("%s_d%d_r%d_base", b.pg.schema, perTxn, rep)
		}
		slots = append(slots, sp)
	}
	profSlot := fmt.Sprintf("%s_d%d_prof", b.pg.schema, perTxn)
	profBaseSlot := fmt.Sprintf("%s_d%d_profbase", b.pg.schema, perTxn)
	var all []string
	for _, s := range slots {
		all = append(all, s.rec, s.rel)
		if s.eos != "" {
			all = append(all, s.eos)
		}
		if s.base != "" {
			all = append(all, s.base)
		}
	}
	if profile {
		all = append(all, profSlot)
		if b.relayBase != "" {
			all = append(all, profBaseSlot)
		}
	}
	if !b.warmedUp {
		b.warmedUp = true
		b.warmUp(ctx, perTxn)
	}
	for _, s := range all {
		if _, err := b.pg.createSlot(ctx, s); err != nil {
			return nil, err
		}
	}
	start, err := b.pg.lsn(ctx, "pg_current_wal_insert_lsn()")
	if err != nil {
		return nil, err
	}
	sh.StartLSN = start
	logf("drain %d row(s)/txn: inserting %d events (%d slots wait before them)", perTxn, sh.Events, len(all))
	t0 := time.Now()
	end, err := b.pg.fill(ctx, sh.Events, perTxn, b.fillSessions, "order")
	if err != nil {
		return nil, err
	}
	sh.FillSeconds = time.Since(t0).Seconds()
	sh.EndLSN = end
	sh.WALBytes = end - start
	sh.AvgPayload, _ = b.pg.avgPayload(ctx)
	logf("drain %d row(s)/txn: backlog %s..%s (%.0f MiB of WAL) inserted in %.1fs (%.0f events/s), payload %.0f B",
		perTxn, fmtLSN(start), fmtLSN(end), float64(sh.WALBytes)/(1<<20), sh.FillSeconds, float64(sh.Events)/sh.FillSeconds, sh.AvgPayload)

	shapesAfter := 0 // drain shapes still to come after this one
	for i, x := range b.sc.DrainShapes {
		if x == perTxn {
			shapesAfter = len(b.sc.DrainShapes) - i - 1
		}
	}
	var repDur time.Duration
	for i, s := range slots {
		rep := i + 1
		// Time budget: a repeat is skipped (and the report says so) when it
		// and one repeat of each shape still to come would not end before
		// the drains' deadline.
		if rep > 1 && !b.drainDeadline.IsZero() && time.Now().Add(repDur*time.Duration(1+shapesAfter)).After(b.drainDeadline) {
			sh.Skipped = len(slots) - i
			logf("  time budget: skipping %d repeat(s) of %s (one takes %s)", sh.Skipped, shapeName(perTxn), repDur.Round(time.Second))
			for _, s := range slots[i:] {
				b.pg.dropSlot(ctx, s.rec)
				b.pg.dropSlot(ctx, s.rel)
				if s.eos != "" {
					b.pg.dropSlot(ctx, s.eos)
				}
				if s.base != "" {
					b.pg.dropSlot(ctx, s.base)
				}
			}
			break
		}
		repStart := time.Now()
		recFirst := rep%2 == 1 // alternate who reads the backlog first
		order := []string{"pg_recvlogical", "relay"}
		if !recFirst {
			order = []string{"relay", "pg_recvlogical"}
		}
		if s.base != "" {
			// The base relay next to them: each of the three reads first
			// in turn.
			order = []string{"pg_recvlogical", "relay", "relay_base"}
			k := (rep - 1) % 3
			order = append(order[k:], order[:k]...)
		}
		if s.eos != "" {
			// Exactly-once next to at-least-once: first in one repeat in
			// three, else after them (the first reader warms the caches).
			order = append(order, "relay_eos")
			if rep%3 == 0 {
				order = append([]string{"relay_eos"}, order[:len(order)-1]...)
			}
		}
		for j, tool := range order {
			if tool == "relay_base" && b.baseTogether {
				continue // drained at the same time as "relay"
			}
			var r drainRun
			var with []drainRun // drained at the same time as r
			switch tool {
			case "pg_recvlogical":
				r = b.drainRecvlogical(ctx, s.rec, end, sh.Events)
			case "relay_eos":
				r = b.drainRelay(ctx, b.relayBin, s.eos, end, sh.Events, fmt.Sprintf("d%dr%deos", perTxn, rep), nil, "--delivery", "exactly_once")
				r.Tool = "relay_eos"
			case "relay_base":
				r = b.drainRelay(ctx, b.relayBase, s.base, end, sh.Events, fmt.Sprintf("d%dr%dbase", perTxn, rep), nil)
				r.Tool = "relay_base"
			default:
				var wg sync.WaitGroup
				if b.baseTogether && s.base != "" {
					// Both relays at once, each from its own slot: whatever
					// else the machine runs meanwhile costs both alike.
					with = make([]drainRun, 1)
					wg.Add(1)
					go func() {
						defer wg.Done()
						with[0] = b.drainRelay(ctx, b.relayBase, s.base, end, sh.Events, fmt.Sprintf("d%dr%dbase", perTxn, rep), nil)
						with[0].Tool = "relay_base"
					}()
				}
				r = b.drainRelay(ctx, b.relayBin, s.rel, end, sh.Events, fmt.Sprintf("d%dr%d", perTxn, rep), nil)
				wg.Wait()
			}
			for _, r := range append([]drainRun{r}, with...) {
				r.Rep, r.Order = rep, j+1
				sh.Runs = append(sh.Runs, r)
				if r.Err != "" {
					logf("  rep %d %-14s FAILED: %s", rep, r.Tool, r.Err)
				} else {
					logf("  rep %d %-14s %8.0f events/s  (%.2fs%s)", rep, r.Tool, r.EventsPerS, r.Seconds, extraRun(r))
				}
			}
		}
		b.pg.dropSlot(ctx, s.rec)
		b.pg.dropSlot(ctx, s.rel)
		if s.eos != "" {
			b.pg.dropSlot(ctx, s.eos)
		}
		if s.base != "" {
			b.pg.dropSlot(ctx, s.base)
		}
		repDur = time.Since(repStart)
	}
	if profile {
		profileOne := func(bin, slot, tag, what string) *profileResult {
			p := &profileResult{Seconds: sh.profileSeconds(), Bin: bin}
			r := b.drainRelay(ctx, bin, slot, end, sh.Events, tag, p)
			p.Run = r
			if r.Err != "" {
				logf("  %s drain FAILED: %s", what, r.Err)
			} else {
				logf("  %s drain (--pprof, not in the statistics) %8.0f events/s, %d events in %.1fs", what, r.EventsPerS, p.Events, r.Seconds)
			}
			b.pg.dropSlot(ctx, slot)
			return p
		}
		sh.Profile = profileOne(b.relayBin, profSlot, fmt.Sprintf("d%dprof", perTxn), "profile")
		if b.relayBase != "" {
			sh.ProfileBase = profileOne(b.relayBase, profBaseSlot, fmt.Sprintf("d%dprofbase", perTxn), "base profile")
		}
	}
	if err := b.pg.truncate(ctx); err != nil {
		return sh, err
	}
	return sh, nil
}

func extraRun(r drainRun) string {
	s := ""
	if strings.HasPrefix(r.Tool, "relay") {
		s += fmt.Sprintf(", all acked at %.2fs, CPU %.2fs, HWM %.0f MiB", r.AckSeconds, r.ToolCPU, float64(r.PeakRSS)/(1<<20))
	}
	if !math.IsNaN(r.Walsender) {
		s += fmt.Sprintf(", walsender CPU %.2fs", r.Walsender)
	}
	if r.Txns > 0 {
		s += fmt.Sprintf(", %d Kafka transactions (%d aborted), commit %.1f ms mean", r.Txns, r.Aborted, r.CommitMs)
	}
	return s
}

func (b *bench) brokerCPU() float64 {
	c, err := procCPU(b.kafkaPID)
	if err != nil {
		return math.NaN()
	}
	return c.Seconds()
}

// profileSeconds is how long a profiled drain of s runs: the whole drain
// (the slowest relay repeat's, 10 s if none), or its first 15 s when the
// relay is slow (the run has a time budget).
func (s *drainShape) profileSeconds() int {
	secs := 10.0
	if rs := s.runs("relay"); len(rs) > 0 {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, r.Seconds)
		}
		secs = summarize(xs).Max
	}
	return min(15, int(math.Ceil(secs))+1)
}

// drainRecvlogical runs pg_recvlogical from the slot to the end LSN.
func (b *bench) drainRecvlogical(ctx context.Context, slot string, end int64, events int) drainRun {
	return b.recvlogicalDrain(ctx, slot, b.pg.pub, end, events)
}

// recvlogicalRun is what runRecvlogical measured of one pg_recvlogical run.
type recvlogicalRun struct {
	seconds   float64 // from just before the start to the exit
	walsender float64 // CPU seconds of the slot's walsender; NaN if not read
	toolCPU   float64 // CPU seconds of the process itself; NaN if not read
	waitErr   error   // its exit error, or that it outlived the timeout
}

// runRecvlogical starts cmd (a pg_recvlogical reading slot, killed if the
// bench dies), samples the CPU of the slot's walsender while it runs, and
// blocks until it exits, or kills it once it has run for timeout (0: no
// limit but ctx). The error is cmd.Start's: then nothing was measured.
func (b *bench) runRecvlogical(ctx context.Context, cmd *exec.Cmd, slot string, timeout time.Duration) (recvlogicalRun, error) {
	m := recvlogicalRun{walsender: math.NaN(), toolCPU: math.NaN()}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return m, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	done := false
	alive := func() bool {
		if done {
			return false
		}
		select {
		case m.waitErr = <-exited:
			done = true
			return false
		default:
			return true
		}
	}
	var ws *cpuSampler
	if pid := b.pg.walsenderPID(ctx, slot, alive, 30*time.Second); pid != 0 {
		ws = sampleCPU(pid, 10*time.Millisecond)
	}
	if !done {
		var expired <-chan time.Time // nil: never
		if timeout > 0 {
			expired = time.After(timeout)
		}
		select {
		case m.waitErr = <-exited:
		case <-expired:
			cmd.Process.Kill()
			<-exited
			m.waitErr = fmt.Errorf("still running after %s", timeout)
		}
	}
	m.seconds = time.Since(t0).Seconds()
	if ws != nil {
		if c, ok := ws.Stop(); ok {
			m.walsender = c.Seconds()
		}
	}
	if cmd.ProcessState != nil {
		m.toolCPU = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	return m, nil
}

// drainTimeout bounds one drain: generous (5k events/s plus a minute), so a
// broken relay cannot hang the run for ever.
func (b *bench) drainTimeout(events int) time.Duration {
	return time.Minute + time.Duration(events/5000)*time.Second
}

// profileResult is the pprof capture of one extra relay drain.
type profileResult struct {
	Seconds   int
	CPUFile   string
	AllocFile string
	CPUTop    string
	AllocTop  string
	Bin       string // the profiled binary
	Run       drainRun
	Events    int  // events acked while profiled
	Partial   bool // stopped when the CPU profile ended, before the end LSN
	Err       string
}

// drainRelay runs the relay from the slot until its confirmed_flush_lsn
// reaches end and Kafka acked every event. With prof set, the relay runs with
// --pprof and its CPU and allocation profiles are fetched meanwhile; flags
// go to the relay (--delivery exactly_once).
func (b *bench) drainRelay(ctx context.Context, bin, slot string, end int64, events int, tag string, prof *profileResult, flags ...string) drainRun {
	r := drainRun{Tool: "relay", Slot: slot, Walsender: math.NaN(), ToolCPU: math.NaN(), Broker: math.NaN()}
	prefix := b.topicPrefix + tag
	topic := prefix + ".order"
	if err := b.kafka.createTopic(topic); err != nil {
		r.Err = err.Error()
		return r
	}
	defer b.kafka.deleteTopic(topic)
	extra := flags
	if prof != nil {
		extra = append(extra, "--pprof")
	}
	broker0 := b.brokerCPU()
	rp, err := b.startRelayBin(bin, tag, slot, prefix+".{aggregate_type}", extra...)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer rp.stop()
	profDone := make(chan struct{})
	if prof != nil {
		go func() {
			defer close(profDone)
			// The HTTP server starts before streaming; wait for it.
			for i := 0; i < 500; i++ {
				if _, _, err := rp.get("/healthz"); err == nil {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			prof.CPUFile = filepath.Join(b.runDir, "relay-"+tag+".cpu.pb.gz")
			if err := rp.fetch(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", prof.Seconds), prof.CPUFile); err != nil {
				prof.Err = "cpu profile: " + err.Error()
				prof.CPUFile = ""
			}
		}()
	} else {
		close(profDone)
	}
	var ws *cpuSampler
	if pid := b.pg.walsenderPID(ctx, slot, rp.running, 60*time.Second); pid != 0 {
		ws = sampleCPU(pid, 50*time.Millisecond)
	}
	var profEnded <-chan struct{} // a profiled drain stops when its CPU profile ends
	if prof != nil {
		profEnded = profDone
	}
	timeout := b.drainTimeout(events)
	deadline := rp.started.Add(timeout)
	lastScrape := time.Time{}
	partial := false
	for !partial {
		if err := rp.exited(); err != nil {
			r.Err = err.Error()
			return r
		}
		now := time.Now()
		if r.AckSeconds == 0 && now.Sub(lastScrape) >= 200*time.Millisecond {
			lastScrape = now
			if rp.published(topic) >= float64(events) {
				r.AckSeconds = time.Since(rp.started).Seconds()
			}
		}
		c, _, err := b.pg.slotState(ctx, slot)
		if err != nil {
			r.Err = err.Error()
			return r
		}
		if c >= end {
			break
		}
		if now.After(deadline) {
			r.Err = fmt.Sprintf("slot at %s, not %s, after %s", fmtLSN(c), fmtLSN(end), timeout)
			return r
		}
		select {
		case <-profEnded:
			partial = true
		case <-time.After(25 * time.Millisecond):
		}
	}
	r.Seconds = time.Since(rp.started).Seconds()
	if cpu, err := procCPU(rp.pid); err == nil {
		r.ToolCPU = cpu.Seconds()
	}
	if _, hwm, err := procMem(rp.pid); err == nil {
		r.PeakRSS = hwm
	}
	if ws != nil {
		if c, ok := ws.Stop(); ok {
			r.Walsender = c.Seconds()
		}
	}
	r.Broker = b.brokerCPU() - broker0
	r.EventsPerS = float64(events) / r.Seconds
	// Confirmed means acked; check it with the relay's counter and the topic.
	pub := rp.published(topic)
	if ss, err := rp.scrape(); err == nil {
		if n, ok := testkit.SumMetric(ss, "outbox_relay_kafka_transactions_total", map[string]string{"result": "committed"}); ok {
			r.Txns = int(n)
			a, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transactions_total", map[string]string{"result": "aborted"})
			r.Aborted = int(a)
			sum, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transaction_commit_seconds_sum", nil)
			if cnt, _ := testkit.SumMetric(ss, "outbox_relay_kafka_transaction_commit_seconds_count", nil); cnt > 0 {
				r.CommitMs = sum / cnt * 1000
			}
		}
	}
	if r.AckSeconds == 0 {
		r.AckSeconds = r.Seconds // acked no later than confirmed
	}
	if n, err := b.kafka.records(topic); err == nil {
		r.Records = n
	}
	switch {
	case partial:
		r.EventsPerS = pub / r.Seconds
		r.AckSeconds = math.NaN()
		prof.Events, prof.Partial = int(pub), true
	case pub < float64(events) || r.Records < int64(events):
		r.Err = fmt.Sprintf("slot confirmed the end LSN but the relay counted %.0f acked events and the topic holds %d, want %d", pub, r.Records, events)
	case prof != nil:
		prof.Events = events
	}
	if prof != nil {
		prof.AllocFile = filepath.Join(b.runDir, "relay-"+tag+".allocs.pb.gz")
		if err := rp.fetch(ctx, "/debug/pprof/allocs", prof.AllocFile); err != nil {
			prof.Err += " allocs profile: " + err.Error()
			prof.AllocFile = ""
		}
		<-profDone
		b.pprofTop(prof)
	}
	return r
}

// pprofTop renders text summaries with `go tool pprof -top -nodecount=40`.
func (b *bench) pprofTop(p *profileResult) {
	run := func(args ...string) string {
		all := append([]string{"tool", "pprof", "-top", "-nodecount=40"}, args...)
		out, err := exec.Command(b.goBin, all...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("go %s: %v\n%s", strings.Join(all, " "), err, out)
		}
		return string(out)
	}
	if p.CPUFile != "" {
		p.CPUTop = run(p.Bin, p.CPUFile)
	}
	if p.AllocFile != "" {
		p.AllocTop = run("-sample_index=alloc_space", p.Bin, p.AllocFile)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// warmUp drains a small backlog of its own, unmeasured, with the relay in
// each delivery mode before the first measured drain: a fresh broker's JIT
// (the transactional paths too), PostgreSQL's caches and the page cache
// would otherwise slow whichever run came first (repeat 1 was the slowest
// of every run in both modes).
func (b *bench) warmUp(ctx context.Context, perTxn int) {
	events := min(100000, max(b.sc.DrainEvents/5, 1000))
	modes := [][]string{nil}
	if b.eos {
		modes = append(modes, []string{"--delivery", "exactly_once"})
	}
	slots := make([]string, len(modes))
	for i := range modes {
		slots[i] = fmt.Sprintf("%s_warm%d", b.pg.schema, i)
		if _, err := b.pg.createSlot(ctx, slots[i]); err != nil {
			logf("warm-up: %v (measuring without it)", err)
			return
		}
		defer b.pg.dropSlot(ctx, slots[i])
	}
	end, err := b.pg.fill(ctx, events, perTxn, b.fillSessions, "order")
	if err != nil {
		logf("warm-up: %v (measuring without it)", err)
		return
	}
	for i, flags := range modes {
		r := b.drainRelay(ctx, b.relayBin, slots[i], end, events, fmt.Sprintf("warm%d", i), nil, flags...)
		if r.Err != "" {
			logf("warm-up %v: %s", flags, r.Err)
			continue
		}
		logf("warm-up drain %v: %d events at %.0f events/s (not measured)", flags, events, r.EventsPerS)
	}
}
