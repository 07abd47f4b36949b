// Command outbox-bench is outbox-relay's benchmark suite (`make bench`).
//
// Against the real PostgreSQL and Kafka that test/services.sh starts, in one
// run it measures (the default -parts; each can be chosen alone):
//
//  1. Backlog drain: a backlog of outbox events (1 and 100 rows per
//     transaction) drained by pg_recvlogical (the walsender's ceiling) and by
//     the relay, side by side on the same backlog, repeated.
//  2. Steady-state latency: an open-loop load generator at fixed rates;
//     commit->ack from the relay's histogram and commit->receive from a
//     Kafka consumer, with CPU and memory.
//  3. pprof CPU and allocation profiles of the relay during one drain.
//  4. First publish to a new topic: commit of the first event of a fresh
//     aggregate_type to a consumer reading it, a few probes.
//  5. Cost curves (curves.go; alone: make bench-curves).
//
// On request only (-parts): stream (one 200k-row transaction, pgoutput
// streaming off and on) and binary (pg_recvlogical with pgoutput's binary
// option off and on). `outbox-bench forward` is the minimal forwarder the
// latency part compares the relay with (forward.go).
//
// It writes a dated markdown report, PNG figures and profile summaries to
// bench/results/ and prints the targets with met/missed. See bench/README.md.
//
// Usage: outbox-bench [-env FILE] [-relay BIN] [-results DIR] [-scale full|small] [-parts LIST] [-budget 25m]
// (outbox-bench -h lists every flag).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// aggregates is the number of distinct aggregate_ids events are spread over.
const aggregates = 10000

// scale is the size of a run.
type scale struct {
	Name          string
	DrainEvents   int
	Repeats       int
	DrainShapes   []int // rows per transaction of the backlogs
	PhaseDur      time.Duration
	Rates         []int // offered events/s
	LatencyShapes []int // rows per transaction in the latency phases
	Partitions    int
	Conns         int // load generator connections; 0 = by rate (8..32)
}

func scaleFor(name string) (scale, error) {
	sc := scale{Name: name, DrainShapes: []int{1, 100}, LatencyShapes: []int{1, 10}, Rates: []int{1000, 5000, 20000},
		Partitions: 4}
	switch name {
	case "full":
		sc.DrainEvents, sc.Repeats, sc.PhaseDur = 1_000_000, 3, 30*time.Second
	case "small":
		sc.DrainEvents, sc.Repeats, sc.PhaseDur = 20_000, 1, 5*time.Second
	default:
		return sc, fmt.Errorf("scale %q is not full or small", name)
	}
	var err error
	envInt := func(key string, dst *int) {
		if v := os.Getenv(key); v != "" && err == nil {
			n, e := strconv.Atoi(v)
			if e != nil || n <= 0 {
				err = fmt.Errorf("%s=%q is not a positive integer", key, v)
				return
			}
			*dst = n
			sc.Name = name + " (overridden)"
		}
	}
	envInt("OUTBOX_BENCH_EVENTS", &sc.DrainEvents)
	envInt("OUTBOX_BENCH_REPEATS", &sc.Repeats)
	envInt("OUTBOX_BENCH_PARTITIONS", &sc.Partitions)
	envInt("OUTBOX_BENCH_CONNS", &sc.Conns)
	secs := 0
	envInt("OUTBOX_BENCH_PHASE_SECONDS", &secs)
	if secs > 0 {
		sc.PhaseDur = time.Duration(secs) * time.Second
	}
	envInts := func(key, what string, dst *[]int) {
		v := os.Getenv(key)
		if v == "" || err != nil {
			return
		}
		var out []int
		for _, f := range strings.Split(v, ",") {
			n, e := strconv.Atoi(strings.TrimSpace(f))
			if e != nil || n <= 0 {
				err = fmt.Errorf("%s=%q: want comma-separated %s", key, v, what)
				return
			}
			out = append(out, n)
		}
		*dst = out
		sc.Name = name + " (overridden)"
	}
	envInts("OUTBOX_BENCH_LAT_SHAPES", "rows per transaction", &sc.LatencyShapes)
	envInts("OUTBOX_BENCH_SHAPES", "rows per transaction, e.g. 1,100", &sc.DrainShapes)
	envInts("OUTBOX_BENCH_RATES", "events/s", &sc.Rates)
	return sc, err
}

// bench holds one run's clients and settings.
type bench struct {
	sc           scale
	runDir       string
	relayBin     string
	relayBase    string // the "base" relay leg's binary ("" = none), drained next to relayBin
	baseTogether bool   // drain the base relay at the same time as the relay, not in turn
	relayFlags   []string
	relayEnv     []string // extra environment of the relay started next (a latency leg's)
	warmedUp     bool     // the unmeasured warm-up drain ran (drain.go warmUp)
	latMessages  bool     // the latency phases write messages (messages.go)
	recvlogical  string
	goBin        string
	self         string
	brokers      []string
	kafkaPID     int
	pg           *pgDB
	kafka        *kafka
	topicPrefix  string // bench.<run id>.
	fillSessions int
	profile      bool
	profileShape int
	eos          bool   // measure delivery: exactly_once next to at_least_once
	latMode      string // latTurns or latTogether (OUTBOX_BENCH_LAT_MODE)
	parts        map[string]bool
	env          map[string]string // the services' env file
	machineCores int
	// drainDeadline: no drain repeat starts that would end after it (the
	// run's time budget minus what the latency part needs).
	drainDeadline time.Time
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[bench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func execCtx(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, name, args...)
}

func durEnv(key string, def time.Duration) time.Duration {
	if v := os.Getenv(key); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		logf("%s=%q is not a duration; using %s", key, v, def)
	}
	return def
}

func getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "loadgen" {
		os.Exit(loadgenMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "forward" {
		os.Exit(forwardMain(os.Args[2:]))
	}
	os.Exit(run())
}

func run() int {
	defRun := getenv("OUTBOX_TEST_RUN_DIR", "bench/.run")
	envFile := flag.String("env", getenv("OUTBOX_TEST_ENV_FILE", filepath.Join(defRun, "env")), "env file written by test/services.sh start")
	relayBin := flag.String("relay", os.Getenv("OUTBOX_BENCH_RELAY"), "outbox-relay binary (default: go build ./cmd/outbox-relay into the run dir)")
	resultsDir := flag.String("results", getenv("OUTBOX_BENCH_RESULTS", "bench/results"), "where the report, figures and profile summaries go")
	scaleName := flag.String("scale", getenv("OUTBOX_BENCH_SCALE", "full"), "full (1M-event backlogs, 3 repeats, 30 s per rate) or small (20k, 1, 5 s)")
	relayBase := flag.String("relay-base", os.Getenv("OUTBOX_BENCH_RELAY_BASE"), "a second outbox-relay binary (before a change): drained side by side from its own slots and profiled too; the report gives new/base CPU per event")
	baseTogether := flag.Bool("relay-base-together", os.Getenv("OUTBOX_BENCH_RELAY_BASE_TOGETHER") == "yes", "drain the base relay at the same time as the relay (each from its own slot), not in turn")
	relayFlags := flag.String("relay-flags", os.Getenv("OUTBOX_BENCH_RELAY_FLAGS"), "extra flags for every relay, space-separated")
	partsFlag := flag.String("parts", getenv("OUTBOX_BENCH_PARTS", "drain,latency,profile,first,messages,dbcost,curves,formats"), "what to run: drain, latency, profile, first, messages (the table-less outbox's drain and latency beside the rows'), dbcost (the database's half of the bill), curves (cost curves; alone: make bench-curves), formats (the relay's CPU per event in each record format: JSON, Avro, JSON Schema, Protobuf, CloudEvents); also stream (one 200k-row transaction, streaming off/on) and binary (pgoutput binary off/on)")
	budget := flag.Duration("budget", durEnv("OUTBOX_BENCH_BUDGET", 30*time.Minute), "time budget of the run: drain repeats that would overrun it are skipped (0: none)")
	deliveryFlag := flag.String("delivery", getenv("OUTBOX_BENCH_DELIVERY", "at_least_once,exactly_once"), "delivery modes of the relay legs: at_least_once (always), exactly_once (drain and latency next to it)")
	latest := flag.String("latest", getenv("OUTBOX_BENCH_LATEST", "auto"), "write latest.md and latest-*: auto (full scale only), yes, no")
	latMode := flag.String("lat-mode", getenv("OUTBOX_BENCH_LAT_MODE", latTurns), "latency legs: turns (each phase once per leg, each leg alone) or together (all legs at once on one load)")
	flag.Parse()

	start := time.Now()
	sc, err := scaleFor(*scaleName)
	if err != nil {
		logf("%v", err)
		return 2
	}
	mode, err := parseLatMode(*latMode)
	if err != nil {
		logf("%v", err)
		return 2
	}
	svc, err := testkit.ReadServices(*envFile)
	if err == nil {
		err = svc.Require("OUTBOX_TEST_KAFKA_PID")
	}
	if err != nil {
		logf("%v", err)
		return 2
	}
	env := svc.Vars
	b := &bench{sc: sc, runDir: filepath.Dir(*envFile), relayFlags: strings.Fields(*relayFlags),
		goBin: getenv("GO", "go"), fillSessions: 2, profileShape: 100, parts: map[string]bool{},
		env: svc.Vars, machineCores: runtime.NumCPU(), latMode: mode}
	for _, p := range strings.Split(*partsFlag, ",") {
		b.parts[strings.TrimSpace(p)] = true
	}
	b.profile = b.parts["profile"] && b.parts["drain"]
	for _, d := range strings.Split(*deliveryFlag, ",") {
		switch strings.TrimSpace(d) {
		case "exactly_once":
			b.eos = true
		case "at_least_once", "":
		default:
			logf("-delivery %q: use at_least_once and/or exactly_once, comma-separated", *deliveryFlag)
			return 2
		}
	}
	if b.self, err = os.Executable(); err != nil {
		logf("%v", err)
		return 2
	}
	if b.recvlogical, err = exec.LookPath(getenv("OUTBOX_BENCH_PG_RECVLOGICAL", "pg_recvlogical")); err != nil {
		if bin := env["OUTBOX_TEST_PG_BINDIR"]; bin != "" {
			b.recvlogical = filepath.Join(bin, "pg_recvlogical")
		}
	}
	b.brokers = svc.Brokers
	if b.kafkaPID, err = strconv.Atoi(env["OUTBOX_TEST_KAFKA_PID"]); err != nil || b.kafkaPID <= 0 {
		logf("%s: OUTBOX_TEST_KAFKA_PID=%q is not a pid", *envFile, env["OUTBOX_TEST_KAFKA_PID"])
		return 2
	}
	if err := svc.Reachable(5 * time.Second); err != nil {
		logf("%v", err)
		return 2
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	if *relayBin == "" {
		*relayBin = filepath.Join(b.runDir, "outbox-relay")
		logf("building ./cmd/outbox-relay into %s (no -race)", *relayBin)
		cmd := exec.CommandContext(ctx, b.goBin, "build", "-o", *relayBin, "./cmd/outbox-relay")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			logf("build relay: %v", err)
			return 1
		}
	}
	if b.relayBin, err = filepath.Abs(*relayBin); err != nil {
		logf("%v", err)
		return 2
	}

	if *relayBase != "" {
		if b.relayBase, err = filepath.Abs(*relayBase); err != nil {
			logf("%v", err)
			return 2
		}
		if _, err := os.Stat(b.relayBase); err != nil {
			logf("-relay-base: %v", err)
			return 2
		}
		b.baseTogether = *baseTogether
	}

	runID := strconv.FormatInt(time.Now().Unix()%1e8, 36) + strconv.Itoa(rand.IntN(100))
	b.topicPrefix = "bench." + runID + "."
	if b.pg, err = connectPG(ctx, env["OUTBOX_TEST_PG_URL"], runID); err != nil {
		logf("%v", err)
		return 1
	}
	defer b.pg.pool.Close()
	if b.kafka, err = connectKafka(b.brokers, sc.Partitions); err != nil {
		logf("%v", err)
		return 1
	}
	defer b.kafka.close()

	res := &results{Started: start, Scale: sc, Machine: readMachine(), PG: b.pg.version(ctx),
		Kafka: env["OUTBOX_TEST_KAFKA_VERSION"], Git: gitCommit(), RelayBin: b.relayBin, RelayBase: b.relayBase, BaseTogether: b.baseTogether, Flags: b.relayFlags}
	if out, err := exec.Command(b.recvlogical, "--version").Output(); err == nil {
		res.Recvlog = strings.TrimSpace(string(out))
	}
	logf("scale %s: %d events per backlog, %d repeat(s), %s per rate at %v events/s; relay %s; PostgreSQL %s, Kafka %s",
		sc.Name, sc.DrainEvents, sc.Repeats, sc.PhaseDur, sc.Rates, b.relayBin, res.PG, res.Kafka)

	cleanup := func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		b.kafka.deletePrefix(b.topicPrefix)
		b.pg.cleanup(c)
	}
	defer cleanup()
	if err := b.pg.setup(ctx, b.relayBin, strings.Join(b.brokers, ",")); err != nil {
		logf("%v", err)
		return 1
	}
	if b.parts["messages"] || b.parts["dbcost"] {
		if err := b.setupMessages(ctx); err != nil {
			logf("%v", err)
			return 1
		}
	}
	if b.eos {
		t0 := time.Now()
		if err := b.kafka.warmTransactions("outbox-bench-warmup-" + runID); err != nil {
			logf("%v", err)
			return 1
		}
		logf("broker ready for transactions (first InitProducerId, checkpoint topic) in %s", time.Since(t0).Round(10*time.Millisecond))
	}

	if *budget > 0 {
		reserve := 30 * time.Second // setup, cleanup, report
		if b.parts["latency"] {
			phases := len(sc.Rates)
			if slices.Contains(sc.Rates, oneRowRate) && !slices.Equal(sc.LatencyShapes, []int{1}) {
				phases++ // the 1-row phase
			}
			if b.latMode == latTurns {
				phases *= len(legNames()) // each phase once per leg
			}
			if b.eos {
				phases += len(eosRates)
			}
			reserve += time.Duration(phases) * (sc.PhaseDur + 10*time.Second)
		}
		if b.parts["first"] {
			reserve += 30 * time.Second
		}
		reserve += b.messagesReserve()
		b.drainDeadline = start.Add(*budget - reserve)
	}
	if b.parts["drain"] {
		for _, shape := range sc.DrainShapes {
			d, err := b.runDrain(ctx, shape)
			if d != nil {
				res.Drains = append(res.Drains, d)
			}
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("drain %s: %v", shapeName(shape), err))
				logf("drain %s: %v", shapeName(shape), err)
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	if b.parts["messages"] && ctx.Err() == nil {
		d, err := b.runMessagesDrain(ctx)
		res.Messages = d
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("messages drain: %v", err))
			logf("messages drain: %v", err)
		}
	}
	if b.parts["latency"] && ctx.Err() == nil {
		res.Latency = b.runLatency(ctx, false)
		if res.Latency.Err != "" {
			res.Errors = append(res.Errors, "latency: "+res.Latency.Err)
		}
		if b.eos && ctx.Err() == nil {
			res.LatencyEOS = b.runLatency(ctx, true)
			if res.LatencyEOS.Err != "" {
				res.Errors = append(res.Errors, "latency exactly-once: "+res.LatencyEOS.Err)
			}
		}
	}
	if b.parts["messages"] && b.parts["latency"] && ctx.Err() == nil {
		res.LatencyMsg = b.runMessagesLatency(ctx)
		if res.LatencyMsg.Err != "" {
			res.Errors = append(res.Errors, "latency messages: "+res.LatencyMsg.Err)
		}
	}
	if b.parts["dbcost"] && ctx.Err() == nil {
		res.DBCost = b.runDBCost(ctx)
		if res.DBCost.Err != "" {
			res.Errors = append(res.Errors, "dbcost: "+res.DBCost.Err)
		}
	}
	if b.parts["first"] && ctx.Err() == nil {
		res.First = b.runFirstPublish(ctx)
		if f := res.First; f.Err != "" {
			res.Errors = append(res.Errors, "first publish: "+f.Err)
			logf("first publish: %v", f.Err)
		} else {
			w, s := summarize(f.WallMs), summarize(f.StampMs)
			logf("first publish to a new topic (%d probes, auto-create flag %v): before COMMIT -> consumer min %s median %s max %s; record timestamp -> consumer median %s",
				len(f.WallMs), f.AutoCreate, msInt(w.Min), msInt(w.Med), msInt(w.Max), msInt(s.Med))
		}
	}
	if b.parts["stream"] && ctx.Err() == nil {
		res.Stream = b.runStream(ctx)
	}
	if b.parts["binary"] && ctx.Err() == nil {
		res.Binary = b.runBinary(ctx)
	}
	if b.parts["formats"] && ctx.Err() == nil {
		res.Formats = b.runFormats(ctx)
	}
	if b.parts["curves"] && ctx.Err() == nil {
		res.Curves = b.runCurves(ctx)
		for _, p := range res.Curves.Points {
			if p.Err != "" {
				res.Errors = append(res.Errors, fmt.Sprintf("curves %s %s: %s", p.Family, p.Label, p.Err))
			}
		}
	}
	if ctx.Err() != nil {
		res.Errors = append(res.Errors, "interrupted")
	}
	res.Elapsed = time.Since(start)
	res.LoadEnd = loadAvg()

	writeLatest := *latest == "yes" || (*latest == "auto" && *scaleName == "full" && !strings.Contains(sc.Name, "overridden"))
	if err := b.write(res, *resultsDir, writeLatest); err != nil {
		logf("write results: %v", err)
		return 1
	}
	fmt.Print(res.summaryText())
	if len(res.Errors) > 0 {
		return 1
	}
	return 0
}

// write puts the report, the figures and the profile summaries in dir under
// a dated name, and copies them to latest* when asked.
func (b *bench) write(res *results, dir string, latest bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stamp := res.Started.UTC().Format("2006-01-02-150405")
	if res.Scale.Name != "full" {
		stamp += "-" + strings.Fields(res.Scale.Name)[0]
	}
	files := map[string][]byte{}
	var errs []error
	tmp := func(name string) string { return filepath.Join(dir, stamp+name) }
	if len(res.Drains) > 0 {
		if err := plotDrain(res, tmp("-drain.png")); err != nil {
			errs = append(errs, fmt.Errorf("drain plot: %w", err))
		}
	}
	if res.Latency != nil && len(res.Latency.Phases) > 0 {
		if err := plotLatency(res, tmp("-latency.png")); err != nil {
			errs = append(errs, fmt.Errorf("latency plot: %w", err))
		}
	}
	for _, d := range res.Drains {
		if p := d.Profile; p != nil {
			hdr := fmt.Sprintf("# outbox-relay %%s profile, %s, one %d-event drain of %s (%s)\n# go tool pprof -top -nodecount=40%%s\n\n",
				res.Started.UTC().Format("2006-01-02 15:04 UTC"), d.Events, shapeName(d.PerTxn), res.Git)
			if p.CPUTop != "" {
				files["-pprof-cpu.txt"] = []byte(fmt.Sprintf(hdr, "CPU", "") + p.CPUTop)
			}
			if p.AllocTop != "" {
				files["-pprof-allocs.txt"] = []byte(fmt.Sprintf(hdr, "allocation", " -sample_index=alloc_space") + p.AllocTop)
			}
		}
		if p := d.ProfileBase; p != nil {
			hdr := fmt.Sprintf("# base outbox-relay (%s) %%s profile, %s, one %d-event drain of %s\n# go tool pprof -top -nodecount=40%%s\n\n",
				res.RelayBase, res.Started.UTC().Format("2006-01-02 15:04 UTC"), d.Events, shapeName(d.PerTxn))
			if p.CPUTop != "" {
				files["-pprof-cpu-base.txt"] = []byte(fmt.Sprintf(hdr, "CPU", "") + p.CPUTop)
			}
			if p.AllocTop != "" {
				files["-pprof-allocs-base.txt"] = []byte(fmt.Sprintf(hdr, "allocation", " -sample_index=alloc_space") + p.AllocTop)
			}
		}
	}
	res.messagesFiles(files)
	if res.Curves != nil {
		if err := plotCurves(res.Curves, tmp("-curves.png")); err != nil {
			errs = append(errs, fmt.Errorf("curves plot: %w", err))
		}
		files["-curves.md"] = []byte(res.curvesMarkdown(stamp))
	}
	files[".md"] = []byte(res.markdown(stamp))
	for suffix, data := range files {
		if err := os.WriteFile(tmp(suffix), data, 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	logf("wrote %s", tmp(".md"))
	if latest && res.Curves != nil {
		// The curves have latest-curves.* of their own (make bench-curves
		// runs only them: its report must not replace latest.md).
		data, err := os.ReadFile(tmp("-curves.png"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "latest-curves.png"), data, 0o644)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "latest-curves.md"), []byte(res.curvesMarkdown("latest")), 0o644)
		}
		if err != nil {
			errs = append(errs, err)
		}
		delete(files, "-curves.md")
		logf("wrote %s", filepath.Join(dir, "latest-curves.md"))
	}
	if latest && (res.Curves == nil || res.Drains != nil || res.Latency != nil) {
		files[".md"] = []byte(res.markdown("latest"))
		for _, suffix := range []string{"-drain.png", "-latency.png"} {
			if data, err := os.ReadFile(tmp(suffix)); err == nil {
				files[suffix] = data
			}
		}
		for suffix, data := range files {
			if err := os.WriteFile(filepath.Join(dir, "latest"+suffix), data, 0o644); err != nil {
				errs = append(errs, err)
			}
		}
		logf("wrote %s", filepath.Join(dir, "latest.md"))
	}
	return errors.Join(errs...)
}

// gitCommit is HEAD and whether the work tree differs from it. It never
// takes the index lock (the repository may be shared).
func gitCommit() string {
	out, err := exec.Command("git", "--no-optional-locks", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += " + uncommitted changes"
	}
	return c
}
