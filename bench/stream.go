package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The "stream" part: one transaction of streamEvents outbox rows, committed
// while a relay follows the slot with logical_decoding_work_mem at 64kB
// (set for the walsender's session in the relay's URL), once with
// --streaming off (the server spills the transaction to disk until the
// commit) and once with --streaming on (it streams it to the relay, which
// spools it). The "binary" part: the walsender's CPU to send one backlog
// with pgoutput's binary option off and on, drained by pg_recvlogical.

// streamEvents is the size of the one big transaction (the 200k).
var streamEvents = 200_000

// streamRun is one big transaction followed by one relay.
type streamRun struct {
	Mode         string  // --streaming
	InsertS      float64 // INSERT ... SELECT of every row, before COMMIT
	FirstS       float64 // COMMIT returned -> first event acked by Kafka
	LastS        float64 // COMMIT returned -> last event acked by Kafka
	Walsender    float64 // CPU s of the walsender, start to last ack
	RelayCPU     float64 // CPU s of the relay, start to last ack
	RelayRSS     int64   // peak
	SpillTxns    int64   // pg_stat_replication_slots
	SpillBytes   int64
	StreamTxns   int64
	StreamBytes  int64
	RelaySpilled float64 // outbox_relay_streamed_transactions_spilled_total
	Err          string
}

// streamResult is the stream part.
type streamResult struct {
	Events int
	Runs   []streamRun
}

func (b *bench) runStream(ctx context.Context) *streamResult {
	res := &streamResult{Events: streamEvents}
	for i, mode := range []string{"off", "on", "off", "on"} {
		r := b.streamOnce(ctx, mode, i)
		logf("stream %s: insert %.1fs, commit->first ack %.2fs, commit->last ack %.2fs, walsender CPU %.2fs, relay CPU %.2fs, relay peak RSS %d MiB; server spill %d txns %d B, stream %d txns %d B; relay spilled %v %s",
			mode, r.InsertS, r.FirstS, r.LastS, r.Walsender, r.RelayCPU, r.RelayRSS>>20, r.SpillTxns, r.SpillBytes, r.StreamTxns, r.StreamBytes, r.RelaySpilled, r.Err)
		res.Runs = append(res.Runs, r)
		if ctx.Err() != nil {
			break
		}
	}
	return res
}

func (b *bench) streamOnce(ctx context.Context, mode string, rep int) streamRun {
	r := streamRun{Mode: mode, FirstS: math.NaN(), LastS: math.NaN(), Walsender: math.NaN(), RelayCPU: math.NaN()}
	slot := fmt.Sprintf("%s_stream_%s%d", b.pg.schema, mode, rep)
	if _, err := b.pg.createSlot(ctx, slot); err != nil {
		r.Err = err.Error()
		return r
	}
	defer b.pg.dropSlot(context.WithoutCancel(ctx), slot)
	prefix := fmt.Sprintf("%sstream%s%d", b.topicPrefix, mode, rep)
	topic := prefix + ".big"
	if err := b.kafka.createTopic(topic); err != nil {
		r.Err = err.Error()
		return r
	}
	defer b.kafka.deleteTopic(topic)
	sep := "?"
	if strings.Contains(b.pg.url, "?") {
		sep = "&"
	}
	rp, err := b.startRelayURL(fmt.Sprintf("stream-%s%d", mode, rep), b.pg.url+sep+"logical_decoding_work_mem=64kB", slot, prefix+".{aggregate_type}", "--streaming", mode)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer rp.stop()
	if err := rp.waitReady(60 * time.Second); err != nil {
		r.Err = err.Error()
		return r
	}
	pid := b.pg.walsenderPID(ctx, slot, rp.running, 60*time.Second)
	if pid == 0 {
		r.Err = "no walsender"
		return r
	}
	ws := sampleCPU(pid, 50*time.Millisecond)
	if _, err := b.pg.pool.Exec(ctx, "SELECT pg_stat_reset_replication_slot($1)", slot); err != nil {
		r.Err = err.Error()
		return r
	}
	t0 := time.Now()
	if _, err := b.pg.fill(ctx, streamEvents, streamEvents, 1, "big"); err != nil {
		r.Err = err.Error()
		return r
	}
	committed := time.Now()
	// fill's procedure COMMITs after its one INSERT: the insert is nearly all of it.
	r.InsertS = committed.Sub(t0).Seconds()
	deadline := committed.Add(b.drainTimeout(streamEvents))
	for {
		if err := rp.exited(); err != nil {
			r.Err = err.Error()
			return r
		}
		n := rp.published(topic)
		if n > 0 && math.IsNaN(r.FirstS) {
			r.FirstS = time.Since(committed).Seconds()
		}
		if n >= float64(streamEvents) {
			r.LastS = time.Since(committed).Seconds()
			break
		}
		if time.Now().After(deadline) {
			r.Err = fmt.Sprintf("%.0f of %d acked after %s", n, streamEvents, b.drainTimeout(streamEvents))
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c, ok := ws.Stop(); ok {
		r.Walsender = c.Seconds()
	}
	if c, err := procCPU(rp.pid); err == nil {
		r.RelayCPU = c.Seconds()
	}
	if _, hwm, err := procMem(rp.pid); err == nil {
		r.RelayRSS = hwm
	}
	r.RelaySpilled = rp.Metric("outbox_relay_streamed_transactions_spilled_total")
	err = b.pg.pool.QueryRow(ctx, `SELECT spill_txns, spill_bytes, stream_txns, stream_bytes
		FROM pg_stat_replication_slots WHERE slot_name = $1`, slot).Scan(&r.SpillTxns, &r.SpillBytes, &r.StreamTxns, &r.StreamBytes)
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

// startRelayURL is startRelay with another PostgreSQL URL.
func (b *bench) startRelayURL(name, url, slot, topicTemplate string, extra ...string) (*relayProc, error) {
	saved := b.pg.url
	b.pg.url = url
	defer func() { b.pg.url = saved }()
	return b.startRelay(name, slot, topicTemplate, extra...)
}

// binaryRun is one pg_recvlogical drain of the binary part.
type binaryRun struct {
	Binary    bool
	Seconds   float64
	Walsender float64 // CPU s
	ToolCPU   float64
	Bytes     int64 // what pg_recvlogical wrote
	Err       string
}

type binaryResult struct {
	Events int
	PerTxn int
	Runs   []binaryRun
}

// runBinary fills one backlog behind four slots, then drains it with
// pg_recvlogical, binary off, on, off, on, off, on.
func (b *bench) runBinary(ctx context.Context) *binaryResult {
	res := &binaryResult{Events: streamEvents, PerTxn: 100}
	modes := []bool{false, true, false, true, false, true}
	slots := make([]string, len(modes))
	for i := range modes {
		slots[i] = fmt.Sprintf("%s_bin%d", b.pg.schema, i)
		if _, err := b.pg.createSlot(ctx, slots[i]); err != nil {
			res.Runs = append(res.Runs, binaryRun{Err: err.Error()})
			return res
		}
		defer b.pg.dropSlot(context.WithoutCancel(ctx), slots[i])
	}
	end, err := b.pg.fill(ctx, res.Events, res.PerTxn, b.fillSessions, "bin")
	if err != nil {
		res.Runs = append(res.Runs, binaryRun{Err: err.Error()})
		return res
	}
	for i, bin := range modes {
		r := b.recvlogicalBinary(ctx, slots[i], end, bin)
		logf("binary %v: %.2fs, walsender CPU %.2fs, pg_recvlogical CPU %.2fs, %d bytes %s", bin, r.Seconds, r.Walsender, r.ToolCPU, r.Bytes, r.Err)
		res.Runs = append(res.Runs, r)
	}
	return res
}

func (b *bench) recvlogicalBinary(ctx context.Context, slot string, end int64, binary bool) binaryRun {
	r := binaryRun{Binary: binary, Walsender: math.NaN(), ToolCPU: math.NaN()}
	out := filepath.Join(b.runDir, "recvlogical-"+slot+".out")
	defer os.Remove(out)
	args := []string{"-d", b.pg.url, "--slot", slot, "--start", "-f", out, "--endpos", fmtLSN(end), "--no-loop",
		"--option=proto_version=1", "--option=publication_names=" + b.pg.pub}
	if binary {
		args = append(args, "--option=binary=true")
	}
	m, err := b.runRecvlogical(ctx, exec.CommandContext(ctx, b.recvlogical, args...), slot, 0)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	r.Seconds, r.Walsender, r.ToolCPU = m.seconds, m.walsender, m.toolCPU
	if st, err := os.Stat(out); err == nil {
		r.Bytes = st.Size()
	}
	if m.waitErr != nil {
		r.Err = m.waitErr.Error()
	}
	return r
}

func (s *streamResult) markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "One transaction of %d outbox rows (INSERT ... SELECT, then COMMIT) while a relay follows a fresh slot, `logical_decoding_work_mem=64kB` for its walsender; `--streaming off` and `on`, alternating. Times from the COMMIT returning; CPU from `/proc/<pid>/stat` from the relay's start to the last ack; server figures from `pg_stat_replication_slots` (reset before the insert).\n\n", s.Events)
	sb.WriteString("| streaming | insert s | commit -> first ack s | commit -> last ack s | walsender CPU s | relay CPU s | relay peak RSS MiB | server spill txns / bytes | server stream txns / bytes | relay spilled txns |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Runs {
		fmt.Fprintf(&sb, "| %s | %.1f | %s | %s | %s | %s | %d | %d / %d | %d / %d | %.0f |", r.Mode, r.InsertS, f2(r.FirstS), f2(r.LastS), f2(r.Walsender), f2(r.RelayCPU),
			r.RelayRSS>>20, r.SpillTxns, r.SpillBytes, r.StreamTxns, r.StreamBytes, r.RelaySpilled)
		if r.Err != "" {
			fmt.Fprintf(&sb, " error: %s", r.Err)
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\n")
	return sb.String()
}

func (s *binaryResult) markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "One backlog of %d outbox rows in transactions of %d behind six slots, drained by `pg_recvlogical --option=proto_version=1` without and with `--option=binary=true`, alternating.\n\n", s.Events, s.PerTxn)
	sb.WriteString("| binary | seconds | walsender CPU s | pg_recvlogical CPU s | bytes received |\n|---|---:|---:|---:|---:|\n")
	for _, r := range s.Runs {
		fmt.Fprintf(&sb, "| %v | %.2f | %s | %s | %d |", r.Binary, r.Seconds, f2(r.Walsender), f2(r.ToolCPU), r.Bytes)
		if r.Err != "" {
			fmt.Fprintf(&sb, " error: %s", r.Err)
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\n")
	return sb.String()
}
