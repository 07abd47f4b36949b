package main

// The "dbcost" part (issue 40): the database's half of the bill. Per event,
// for each way of writing the outbox, the WAL it writes, the CPU of the
// backend that writes it and of the walsender that decodes it; and what the
// relay itself costs PostgreSQL, idle and at 1k events/s.

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx": outbox.Write's INSERT path

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// writerCost is one way of writing the outbox, measured.
type writerCost struct {
	Name, How  string
	Events     int
	Seconds    float64 // the writing session's wall time, commits included
	WALBytes   int64
	BackendCPU float64  // seconds, the writing session's backend
	Drain      drainRun // pg_recvlogical from a slot made before the writes
	Err        string
}

// pgCost is PostgreSQL's activity over one window of the relay-cost runs.
type pgCost struct {
	Name      string
	Load      int // offered events/s, 0 = idle
	Relay     bool
	Seconds   float64
	Events    int // generated events
	WALBytes  int64
	Walsender float64 // CPU seconds of the relay's walsender
	Sessions  float64 // CPU seconds of the relay's other sessions
	NSessions int     // how many other sessions it had
	Each      []sessionUse
	// From the relay's metrics, over the window.
	Heartbeats, SlotSaves float64
	WALRecords            string // idle windows: pg_waldump --stats=record of the window
	Err                   string
}

// dbCost is the "dbcost" part.
type dbCost struct {
	PerTxn  int
	Writers []writerCost
	Relay   []pgCost
	Window  time.Duration
	Err     string
}

// relayApp is the application_name the relay's sessions get in the relay
// cost runs, to find its backends in pg_stat_activity.
const relayApp = "outbox-bench-relaycost"

func withAppName(url, app string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + app
}

// benchEvents are n outbox.Events like the drain's: the ~400 B payload,
// trace_id and tenant_id headers and schema_version 2.
func benchEvents(from, n int) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		seq := from + i
		agg := seq % aggregates
		evs[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("agg-%d", agg), EventType: "order.updated",
			Payload:       json.RawMessage(appendPayload(nil, agg, seq)),
			Headers:       map[string]string{"trace_id": fmt.Sprintf("%032x", seq*2654435761), "tenant_id": "acme"},
			SchemaVersion: 2}
	}
	return evs
}

// writerSession is one writing session: its backend's pid, a function that
// commits one transaction of events, and its close.
type writerSession struct {
	pid   int
	write func(ctx context.Context, evs []outbox.Event) error
	close func()
}

func (b *bench) pgxWriter(ctx context.Context, write func(ctx context.Context, tx pgx.Tx, evs []outbox.Event) error) (*writerSession, error) {
	conn, err := pgx.Connect(ctx, b.pg.url)
	if err != nil {
		return nil, err
	}
	s := &writerSession{close: func() { conn.Close(context.Background()) }}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&s.pid); err != nil {
		s.close()
		return nil, err
	}
	s.write = func(ctx context.Context, evs []outbox.Event) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return write(ctx, tx, evs) })
	}
	return s, nil
}

func (b *bench) sqlWriter(ctx context.Context, w *outbox.Writer) (*writerSession, error) {
	db, err := sql.Open("pgx", b.pg.url)
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &writerSession{close: func() { conn.Close(); db.Close() }}
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&s.pid); err != nil {
		s.close()
		return nil, err
	}
	s.write = func(ctx context.Context, evs []outbox.Event) error {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := w.Write(ctx, tx, evs...); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return s, nil
}

// setupPartitioned has the relay's migrate create a daily-partitioned
// outbox (postgres.partition: daily) and its publication next to the
// bench's.
func (b *bench) setupPartitioned(ctx context.Context) (table, pub string, err error) {
	table, pub = b.pg.schema+".outbox_part", b.pg.schema+"_ppub"
	slot := b.pg.schema + "_pmigrate"
	cmd := execCtx(ctx, b.relayBin, "migrate", "--postgres-url", b.pg.url, "--kafka-brokers", strings.Join(b.brokers, ","),
		"--slot", slot, "--publication", pub, "--table", table, "--partition", "daily", "--log-format", "json")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("outbox-relay migrate --partition daily: %v\n%s", err, out)
	}
	return table, pub, b.pg.dropSlot(ctx, slot)
}

// runDBCost measures every writer, then the relay's own cost.
func (b *bench) runDBCost(ctx context.Context) *dbCost {
	out := &dbCost{PerTxn: msgPerTxn}
	n := max(20000, b.sc.DrainEvents/10)
	n = (n + msgPerTxn - 1) / msgPerTxn * msgPerTxn
	partTable, partPub, err := b.setupPartitioned(ctx)
	if err != nil {
		out.Err = err.Error()
	}
	rowsW, err1 := outbox.NewWriter(outbox.WithTable(b.pg.table))
	partW, err2 := outbox.NewWriter(outbox.WithTable(partTable))
	if err1 != nil || err2 != nil {
		out.Err = fmt.Sprint(err1, err2)
		return out
	}
	type kind struct {
		name, how, pub string
		opts           []string
		open           func() (*writerSession, error)
	}
	pgxWrite := func(w *outbox.Writer) func() (*writerSession, error) {
		return func() (*writerSession, error) {
			return b.pgxWriter(ctx, func(ctx context.Context, tx pgx.Tx, evs []outbox.Event) error { return w.Write(ctx, tx, evs...) })
		}
	}
	kinds := []kind{
		{"outbox.Write, INSERT", fmt.Sprintf("database/sql (pgx stdlib): one multi-row INSERT of %d rows per transaction", msgPerTxn), b.pg.pub, nil,
			func() (*writerSession, error) { return b.sqlWriter(ctx, rowsW) }},
		{"outbox.Write, COPY", fmt.Sprintf("pgx: one COPY of %d rows per transaction (CopyThreshold %d)", msgPerTxn, outbox.CopyThreshold), b.pg.pub, nil, pgxWrite(rowsW)},
	}
	if partTable != "" {
		kinds = append(kinds, kind{"outbox.Write, partitioned outbox", "pgx COPY into a table of `postgres.partition: daily` (publish_via_partition_root)", partPub, nil, pgxWrite(partW)})
	}
	kinds = append(kinds, kind{"outbox.WriteMessage", fmt.Sprintf("pgx: a batch of %d pg_logical_emit_message(true, ...) per transaction, no table", msgPerTxn), b.pg.pub, []string{"messages=true"},
		func() (*writerSession, error) {
			return b.pgxWriter(ctx, func(ctx context.Context, tx pgx.Tx, evs []outbox.Event) error {
				return outbox.WriteMessage(ctx, tx, b.msgPrefix(), evs...)
			})
		}})
	for i, k := range kinds {
		if ctx.Err() != nil {
			break
		}
		wc := writerCost{Name: k.name, How: k.how, Events: n}
		func() {
			slot := fmt.Sprintf("%s_cost%d", b.pg.schema, i)
			if _, err := b.pg.createSlot(ctx, slot); err != nil {
				wc.Err = err.Error()
				return
			}
			defer b.pg.dropSlot(ctx, slot)
			s, err := k.open()
			if err != nil {
				wc.Err = err.Error()
				return
			}
			defer s.close()
			// Warm the session (plans, catalog caches): one transaction, not counted.
			if err := s.write(ctx, benchEvents(0, msgPerTxn)); err != nil {
				wc.Err = err.Error()
				return
			}
			start, err := b.pg.lsn(ctx, "pg_current_wal_insert_lsn()")
			if err != nil {
				wc.Err = err.Error()
				return
			}
			cpu0, _ := backendCPU(s.pid)
			t0 := time.Now()
			for from := 0; from < n; from += msgPerTxn {
				if err := s.write(ctx, benchEvents(from, msgPerTxn)); err != nil {
					wc.Err = err.Error()
					return
				}
			}
			wc.Seconds = time.Since(t0).Seconds()
			cpu1, _ := backendCPU(s.pid)
			wc.BackendCPU = (cpu1 - cpu0).Seconds()
			end, err := b.pg.lsn(ctx, "pg_current_wal_insert_lsn()")
			if err != nil {
				wc.Err = err.Error()
				return
			}
			wc.WALBytes = end - start
			wc.Drain = b.recvlogicalDrain(ctx, slot, k.pub, end, n+msgPerTxn, k.opts...)
			wc.Err = wc.Drain.Err
		}()
		if wc.Err != "" {
			logf("dbcost %s: FAILED: %s", wc.Name, wc.Err)
		} else {
			ev := float64(n)
			logf("dbcost %-34s WAL %4.0f B/event, backend CPU %5.1f us/event, %6.0f events/s from one session; walsender %5.1f us/event (pg_recvlogical)",
				wc.Name, float64(wc.WALBytes)/ev, wc.BackendCPU/ev*1e6, ev/wc.Seconds, wc.Drain.Walsender/float64(n+msgPerTxn)*1e6)
		}
		out.Writers = append(out.Writers, wc)
	}
	b.pg.truncate(ctx)
	if partTable != "" {
		b.pg.pool.Exec(ctx, "TRUNCATE "+partTable)
	}
	if ctx.Err() == nil {
		out.Window = 30 * time.Second
		if strings.HasPrefix(b.sc.Name, "small") {
			out.Window = 10 * time.Second
		}
		out.Relay = b.relayCost(ctx, out.Window)
	}
	return out
}

// sessionCPU follows the CPU of every backend whose application_name is
// app, walsenders apart, while it runs: a backend seen first after the start
// counts from its birth; one that exits between samples loses at most a
// sampling interval.
type sessionCPU struct {
	stop, done chan struct{}
	mu         sync.Mutex
	seen       map[int]*sessTrack
}

type sessTrack struct {
	walsender   bool
	first, last time.Duration
	query       string // its last statement, shortened: which of the relay's tasks it is
}

// sessionUse is one of the relay's sessions over a window.
type sessionUse struct {
	Query string
	CPU   float64 // seconds
}

func (b *bench) followSessions(ctx context.Context, app, slot string) *sessionCPU {
	s := &sessionCPU{stop: make(chan struct{}), done: make(chan struct{}), seen: map[int]*sessTrack{}}
	sample := func(initial bool) {
		rows, err := b.pg.pool.Query(ctx, `SELECT pid, backend_type = 'walsender', left(regexp_replace(coalesce(query, ''), '\s+', ' ', 'g'), 70)
			FROM pg_stat_activity WHERE application_name = $1 OR pid = (SELECT active_pid FROM pg_replication_slots WHERE slot_name = $2)`, app, slot)
		if err != nil {
			return
		}
		defer rows.Close()
		for rows.Next() {
			var pid int32
			var ws bool
			var q string
			if rows.Scan(&pid, &ws, &q) != nil {
				continue
			}
			c, err := backendCPU(int(pid))
			if err != nil {
				continue
			}
			s.mu.Lock()
			t := s.seen[int(pid)]
			if t == nil {
				t = &sessTrack{walsender: ws}
				if initial {
					t.first = c
				}
				s.seen[int(pid)] = t
			}
			t.last = c
			if q != "" {
				t.query = q
			}
			s.mu.Unlock()
		}
	}
	sample(true)
	go func() {
		defer close(s.done)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-s.stop:
				sample(false)
				return
			case <-tk.C:
				sample(false)
			}
		}
	}()
	return s
}

// end stops following: CPU seconds of the walsenders and of the other
// sessions, and how many other sessions there were.
func (s *sessionCPU) end() (walsender, others float64, n int, each []sessionUse) {
	close(s.stop)
	<-s.done
	for _, t := range s.seen {
		d := (t.last - t.first).Seconds()
		if t.walsender {
			walsender += d
		} else {
			others += d
			n++
			each = append(each, sessionUse{t.query, d})
		}
	}
	slices.SortFunc(each, func(a, b sessionUse) int { return cmp.Compare(b.CPU, a.CPU) })
	return walsender, others, n, each
}

// runLoad runs the load generator (rows) for dur at rate; aggPrefix names
// its topics.
func (b *bench) runLoad(ctx context.Context, aggPrefix string, rate int, dur time.Duration) (loadResult, error) {
	var res loadResult
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, b.self, "loadgen", "-pg-url", b.pg.url, "-table", b.pg.table, "-agg-prefix", aggPrefix,
		"-rate", itoa(rate), "-mix", joinInts(b.sc.LatencyShapes), "-duration", dur.String(), "-conns", itoa(b.sc.Conns), "-seed", itoa(rate))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("loadgen: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return res, json.Unmarshal(stdout.Bytes(), &res)
}

// relayCost measures PostgreSQL over windows of the given length: idle
// without and with a relay, and under 1k events/s without and with one
// (the relay's WAL is the difference). The relay runs with its defaults
// (heartbeats, slot saver, status updates, retention's horizon samples).
func (b *bench) relayCost(ctx context.Context, window time.Duration) []pgCost {
	var out []pgCost
	const rate = 1000
	for _, c := range []pgCost{{Name: "idle, no relay"}, {Name: "idle, relay", Relay: true},
		{Name: "1k events/s, no relay", Load: rate}, {Name: "1k events/s, relay", Load: rate, Relay: true}} {
		if ctx.Err() != nil {
			break
		}
		func() {
			var rp *relayProc
			aggPrefix := fmt.Sprintf("rc%d", len(out))
			slot := fmt.Sprintf("%s_rc%d", b.pg.schema, len(out))
			if c.Relay {
				if _, err := b.pg.createSlot(ctx, slot); err != nil {
					c.Err = err.Error()
					return
				}
				defer b.pg.dropSlot(ctx, slot)
				for _, txn := range b.sc.LatencyShapes {
					t := b.topicPrefix + aggPrefix + "." + aggTypeFor(aggPrefix, txn)
					if err := b.kafka.createTopic(t); err != nil {
						c.Err = err.Error()
						return
					}
					defer b.kafka.deleteTopic(t)
				}
				var err error
				rp, err = b.startRelay("cost-"+aggPrefix, slot, b.topicPrefix+aggPrefix+".{aggregate_type}",
					"--postgres-url", withAppName(b.pg.url, relayApp))
				if err == nil {
					defer rp.stop()
					err = rp.waitReady(60 * time.Second)
				}
				if err != nil {
					c.Err = err.Error()
					return
				}
				time.Sleep(3 * time.Second) // past the start's own queries
			}
			counter := func(name string) float64 {
				if rp == nil {
					return 0
				}
				ss, err := rp.scrape()
				if err != nil {
					return math.NaN()
				}
				v, _ := testkit.SumMetric(ss, name, nil)
				return v
			}
			hb0, sv0 := counter("outbox_relay_heartbeats_total"), counter("outbox_relay_slot_saves_total")
			sess := b.followSessions(ctx, relayApp, slot)
			start, err := b.pg.lsn(ctx, "pg_current_wal_insert_lsn()")
			if err != nil {
				c.Err = err.Error()
				sess.end()
				return
			}
			t0 := time.Now()
			if c.Load > 0 {
				res, err := b.runLoad(ctx, aggPrefix, c.Load, window)
				if err != nil {
					c.Err = err.Error()
					sess.end()
					return
				}
				c.Events = res.Events
			} else {
				select {
				case <-time.After(window):
				case <-ctx.Done():
				}
			}
			end, err := b.pg.lsn(ctx, "pg_current_wal_insert_lsn()")
			c.Seconds = time.Since(t0).Seconds()
			c.Walsender, c.Sessions, c.NSessions, c.Each = sess.end()
			if err != nil {
				c.Err = err.Error()
				return
			}
			c.WALBytes = end - start
			if c.Load == 0 {
				c.WALRecords = b.walStats(start, end)
			}
			c.Heartbeats, c.SlotSaves = counter("outbox_relay_heartbeats_total")-hb0, counter("outbox_relay_slot_saves_total")-sv0
		}()
		if c.Err != "" {
			logf("relay cost %s: FAILED: %s", c.Name, c.Err)
		} else {
			logf("relay cost %-22s %5.1fs: WAL %7.0f B/s, %d events; relay walsender CPU %5.1f ms/s, its %d other sessions %5.1f ms/s; %.0f heartbeats, %.0f slot saves",
				c.Name, c.Seconds, float64(c.WALBytes)/c.Seconds, c.Events, 1000*c.Walsender/c.Seconds, c.NSessions, 1000*c.Sessions/c.Seconds, c.Heartbeats, c.SlotSaves)
			for _, e := range c.Each {
				logf("  %5.2f ms/s  %s", 1000*e.CPU/c.Seconds, e.Query)
			}
		}
		out = append(out, c)
	}
	return out
}

// relayWALPerS is the relay's own WAL bytes/s in window c: its WAL minus
// that of the same window without the relay (per event under load).
func (d *dbCost) relayWALPerS(c pgCost) float64 {
	for _, base := range d.Relay {
		if base.Relay || base.Load != c.Load || base.Err != "" || base.Seconds <= 0 {
			continue
		}
		if c.Load == 0 {
			return float64(c.WALBytes)/c.Seconds - float64(base.WALBytes)/base.Seconds
		}
		if base.Events > 0 {
			return (float64(c.WALBytes) - float64(base.WALBytes)/float64(base.Events)*float64(c.Events)) / c.Seconds
		}
	}
	return math.NaN()
}

func (d *dbCost) markdown() string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	w("## 9. The database's half of the bill\n\n")
	if d.Err != "" {
		w("**Error:** %s\n\n", d.Err)
	}
	if len(d.Writers) > 0 {
		ev := d.Writers[0].Events
		w("Each way of writing the outbox commits %d events, %d per transaction (the drain's ~400 B payload and three headers), from one session of its own, with a logical slot made before; then pg_recvlogical (pgoutput proto 1, on the table's publication; `messages=true` for messages) decodes them from that slot. *Backend CPU* is the writing session's backend (its run time from /proc/<pid>/schedstat) over its transactions, commits included; *WAL* is the insert position's advance over them (nothing else writes meanwhile); *walsender CPU* is the slot's walsender while pg_recvlogical drains (its events/s next to it). One run each.\n\n", ev, d.PerTxn)
		w("| outbox | how | WAL per event, B | writing backend CPU, us/event | walsender CPU, us/event | one session's events/s | pg_recvlogical events/s |\n|---|---|---:|---:|---:|---:|---:|\n")
		for _, c := range d.Writers {
			if c.Err != "" {
				w("| %s | %s | | | | | failed: %s |\n", c.Name, c.How, c.Err)
				continue
			}
			n := float64(c.Events)
			w("| %s | %s | %.0f | %.1f | %.1f | %.0f | %.0f |\n", c.Name, c.How, float64(c.WALBytes)/n, c.BackendCPU/n*1e6,
				c.Drain.Walsender/(n+float64(d.PerTxn))*1e6, n/c.Seconds, c.Drain.EventsPerS)
		}
		w("\n")
	}
	if len(d.Relay) > 0 {
		w("What the relay itself costs PostgreSQL: windows of %s, idle and under 1k events/s (the latency generator's rows), each without and with a relay (defaults: a heartbeat a second, the slot saver's temporary slot at most once a second when the confirmed position moved, a status update a second, retention's horizon sample every 5 s; its sessions found by their `application_name`). *Relay's WAL* is the window's WAL minus that of the same window without the relay (under load: per generated event). Retention deletes nothing here: no delivered row is older than `retention.keep` (7 days).\n\n", d.Window)
		w("| window | WAL, B/s | relay's WAL, B/s | relay's walsender CPU, ms/s | relay's other sessions, CPU ms/s | sessions | heartbeats/s | slot saves/s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range d.Relay {
			if c.Err != "" {
				w("| %s | | | | | | | failed: %s |\n", c.Name, c.Err)
				continue
			}
			rel, ws, ot, ns, hb, sv := "-", "-", "-", "-", "-", "-"
			if c.Relay {
				rel = f0(d.relayWALPerS(c))
				if v := d.relayWALPerS(c); v < 0 {
					rel = "< 0 (the load's noise)"
				}
				ws, ot, ns = f2(1000*c.Walsender/c.Seconds), f2(1000*c.Sessions/c.Seconds), fmt.Sprint(c.NSessions)
				hb, sv = f2(c.Heartbeats/c.Seconds), f2(c.SlotSaves/c.Seconds)
			}
			w("| %s | %.0f | %s | %s | %s | %s | %s | %s |\n", c.Name, float64(c.WALBytes)/c.Seconds, rel, ws, ot, ns, hb, sv)
		}
		for _, c := range d.Relay {
			if c.WALRecords != "" {
				w("\n<details><summary>WAL records, %s (pg_waldump --stats=record, %.0f s)</summary>\n\n```\n%s\n```\n\n</details>\n", c.Name, c.Seconds, c.WALRecords)
			}
		}
		w("\nThe relay's sessions other than its walsender, by their last statement (CPU ms/s):\n\n| window | session's last statement | CPU, ms/s |\n|---|---|---:|\n")
		for _, c := range d.Relay {
			for _, e := range c.Each {
				w("| %s | `%s` | %.2f |\n", c.Name, strings.ReplaceAll(e.Query, "|", "\\|"), 1000*e.CPU/c.Seconds)
			}
		}
		w("\n")
	}
	return sb.String()
}

// backendCPU is the CPU time of a single-threaded process (a PostgreSQL
// backend) in nanoseconds from /proc/<pid>/schedstat: /proc/<pid>/stat
// counts clock ticks (10 ms), too coarse for a session that works a
// millisecond a second. procCPU when schedstat cannot be read.
func backendCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns), nil
			}
		}
	}
	return procCPU(pid)
}

// walStats is pg_waldump --stats=record over start..end: which records
// the window's WAL is made of ("" when pg_waldump cannot read it).
func (b *bench) walStats(start, end int64) string {
	bin, data := b.env["OUTBOX_TEST_PG_BINDIR"], b.env["OUTBOX_TEST_PG_DATA"]
	if bin == "" || data == "" || end <= start {
		return ""
	}
	out, err := exec.Command(filepath.Join(bin, "pg_waldump"), "--stats=record", "-p", filepath.Join(data, "pg_wal"),
		"-s", fmtLSN(start), "-e", fmtLSN(end)).CombinedOutput()
	// The window ends at the insert position, where no record is yet:
	// pg_waldump prints its statistics, then fails to read past the last.
	stats, _, _ := strings.Cut(string(out), "pg_waldump: error:")
	if !strings.Contains(stats, "WAL statistics") {
		logf("pg_waldump %s..%s: %v: %s", fmtLSN(start), fmtLSN(end), err, strings.TrimSpace(string(out)))
		return ""
	}
	return strings.TrimSpace(stats)
}
