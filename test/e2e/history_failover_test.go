//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/test/proxy"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// Issue 35: the server's history goes back under the relay. Events the
// relay published (and, exactly-once, checkpointed) are no longer in the
// server's history, and the server hands out their WAL positions and their
// outbox ids again. Done when, in both delivery modes, every event the
// application writes afterwards is delivered (exactly once with
// delivery: exactly_once, read read_committed; at least once otherwise)
// and none of them carries the event_id of an event published from the
// old history (consumers deduplicate on event_id and would drop it).
//
// Each run logs one table line ("HISTORY |": mode, scenario, N, delivered,
// duplicates, event_ids reused) and the relay's log lines about the
// checkpoint and the server history.

// histMode is a delivery mode of a history run.
type histMode struct {
	name string
	eos  bool
}

var histModes = []histMode{{"at_least_once", false}, {"exactly_once", true}}

const (
	histPre  = 20  // events delivered before the history goes back, kept by it
	histLost = 300 // events published from the history that is then lost (more than a sequence's 32 pre-logged values)
	histNew  = 30  // events the application writes on the server's new history
)

// histEvent is one outbox row the test wrote; its payload's marker finds
// its records whatever the event_id header holds.
type histEvent struct {
	marker string
	id     string        // the outbox row's id on the server that took it
	lsn    pglogrepl.LSN // WAL insert position inside its transaction
}

// histRun is one history scenario in one delivery mode: a server (or a
// primary and standby) of its own, the relay and the application
// connected through a proxy re-pointed whenever the server moves, the
// shared Kafka.
type histRun struct {
	t        *testing.T
	mode     histMode
	scenario string
	pair     *testkit.PGPair
	px       *proxy.Proxy
	e        *env
	flags    []string
	relays   []*relay
	events   map[string][]histEvent // phase -> events written
	changed  pglogrepl.LSN          // the server's WAL position right after its history changed
}

func startHistRun(t *testing.T, mode histMode, scenario, name string, opts testkit.PGPairOptions) *histRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pair, err := testkit.StartPGPair(ctx, opts)
	t.Cleanup(func() {
		if pair == nil {
			return
		}
		if t.Failed() { // the servers' logs stay beside the relays' (the data dirs do not)
			for _, s := range []*testkit.PGServer{pair.Primary, pair.Standby} {
				if b, err := os.ReadFile(s.Log); err == nil {
					p := filepath.Join(logDir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+s.Name+".log")
					if os.WriteFile(p, b, 0o644) == nil {
						t.Logf("%s log kept in %s", s.Name, p)
					}
				}
			}
		}
		if err := pair.Close(false); err != nil {
			t.Errorf("stop the servers: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &histRun{t: t, mode: mode, scenario: scenario, pair: pair, events: map[string][]histEvent{}}
	h.px = startProxy(t, "127.0.0.1:0", pair.Primary.Addr())
	h.e = newEnvAt(t, name, pair.URLAt(h.px.Addr()))
	h.flags = append([]string{}, failoverRelayFlags...)
	if mode.eos {
		h.flags = h.e.eosFlags(h.flags...)
	}
	t.Cleanup(h.logRelayDecisions)
	return h
}

// launch starts a relay with the run's flags, not waiting for it.
func (h *histRun) launch() *relay {
	r := h.e.launchRelay(h.flags...)
	h.relays = append(h.relays, r)
	return r
}

func (h *histRun) start() *relay {
	r := h.launch()
	r.waitReady(60 * time.Second)
	return r
}

// conn is a fresh connection to the server the proxy points at (the
// pool's connections may be cut by a proxy reset).
func (h *histRun) conn(ctx context.Context) *pgx.Conn {
	h.t.Helper()
	var c *pgx.Conn
	var err error
	for range 20 {
		if c, err = pgx.Connect(ctx, h.e.url); err == nil {
			return c
		}
		time.Sleep(250 * time.Millisecond)
	}
	h.t.Fatalf("connect to the server: %v", err)
	return nil
}

// query scans one row of q into dest on a fresh connection.
func (h *histRun) query(q string, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := h.conn(ctx)
	defer c.Close(context.Background())
	return c.QueryRow(ctx, q).Scan(dest...)
}

func (h *histRun) mustQuery(q string, dest ...any) {
	h.t.Helper()
	if err := h.query(q, dest...); err != nil {
		h.t.Fatalf("%s: %v", q, err)
	}
}

// insert commits n events of phase in transactions of perTxn events, each
// one statement, and returns the highest WAL insert position inside them.
func (h *histRun) insert(phase string, n, perTxn int) pglogrepl.LSN {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := h.conn(ctx)
	defer c.Close(context.Background())
	return h.insertOn(ctx, c, phase, n, perTxn)
}

// insertOn is insert on connection c.
func (h *histRun) insertOn(ctx context.Context, c *pgx.Conn, phase string, n, perTxn int) pglogrepl.LSN {
	h.t.Helper()
	var last pglogrepl.LSN
	done0 := len(h.events[phase]) // markers go on across calls for one phase
	for done := 0; done < n; {
		k := min(perTxn, n-done)
		rows, err := c.Query(ctx, `INSERT INTO `+h.e.Table+` (aggregate_type, aggregate_id, event_type, payload, headers)
			SELECT 'order', 'order-' || ((s + g) % 7), 'order.updated',
			       jsonb_build_object('marker', $1::text || '-' || (s + g), 'phase', $1::text),
			       jsonb_build_object('tenant_id', 'acme')
			FROM (SELECT $2::int AS s) x, generate_series(0, $3::int - 1) AS g ORDER BY g
			RETURNING id::text, payload->>'marker', pg_current_wal_insert_lsn()::text`, phase, done0+done, k)
		if err != nil {
			h.t.Fatalf("insert %d %s events: %v", k, phase, err)
		}
		for rows.Next() {
			var ev histEvent
			var l string
			if err := rows.Scan(&ev.id, &ev.marker, &l); err != nil {
				h.t.Fatal(err)
			}
			ev.lsn, _ = pglogrepl.ParseLSN(l)
			last = max(last, ev.lsn)
			h.events[phase] = append(h.events[phase], ev)
		}
		if err := rows.Err(); err != nil {
			h.t.Fatalf("insert %d %s events: %v", k, phase, err)
		}
		done += k
	}
	return last
}

// handled waits until the slot on the current server confirmed lsn: the
// relay published (or, exactly-once, skipped as checkpointed) everything
// committed before it. It fails at once if r exits.
func (h *histRun) handled(r *relay, lsn pglogrepl.LSN, what string) {
	h.t.Helper()
	var confirmed pglogrepl.LSN
	err := testkit.Poll(90*time.Second, 200*time.Millisecond, func() (bool, error) {
		if err := r.Exited(); err != nil {
			return false, err
		}
		var s *string
		if h.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '"+h.e.Slot+"'", &s) == nil && s != nil {
			confirmed, _ = pglogrepl.ParseLSN(*s)
		}
		return confirmed >= lsn, nil
	})
	if err != nil {
		h.t.Fatalf("%s: the slot confirmed %s, not yet %s: %v", what, confirmed, lsn, err)
	}
}

// read reads every record of the run's event topic from the start to its
// end now (read_committed in exactly-once mode: what its consumers see).
func (h *histRun) read() []record {
	h.t.Helper()
	var opts []testkit.ReadOption
	if h.mode.eos {
		opts = append(opts, testkit.ReadCommitted)
	}
	rs, _, err := testkit.ReadToEnd(brokers, h.e.Prefix+".order", 30*time.Second, opts...)
	if err != nil {
		h.t.Fatal(err)
	}
	return rs
}

func payloadMarker(r record) (marker, phase string) {
	var p struct{ Marker, Phase string }
	_ = json.Unmarshal(r.Value, &p)
	return p.Marker, p.Phase
}

// published counts the distinct events of phase in rs.
func published(rs []record, phase string) int {
	seen := map[string]bool{}
	for _, r := range rs {
		if m, p := payloadMarker(r); p == phase {
			seen[m] = true
		}
	}
	return len(seen)
}

// checkpoint is the newest committed checkpoint record of the run's
// relay (exactly-once), nil in at-least-once mode.
func (h *histRun) checkpoint() map[string]string {
	h.t.Helper()
	if !h.mode.eos {
		return nil
	}
	return lastCheckpoint(h.t, h.e.Prefix+".checkpoints", "outbox-relay-"+h.e.Slot)
}

// slotState is the run's slot on the current server ("absent" or its
// confirmed position and activity) and the number of its registry rows.
func (h *histRun) slotState() (slot string, registry int) {
	h.t.Helper()
	slot = "absent"
	var s *string
	if err := h.query("SELECT confirmed_flush_lsn::text || CASE WHEN active THEN ' (active)' ELSE ' (inactive)' END FROM pg_replication_slots WHERE slot_name = '"+h.e.Slot+"'", &s); err == nil && s != nil {
		slot = *s
	} else if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		h.t.Fatalf("read slot %s: %v", h.e.Slot, err)
	}
	h.mustQuery("SELECT count(*) FROM "+h.e.Schema+".outbox_relay_slots WHERE slot_name = '"+h.e.Slot+"'", &registry)
	return slot, registry
}

func (h *histRun) currentLSN() pglogrepl.LSN {
	h.t.Helper()
	var s string
	h.mustQuery("SELECT pg_current_wal_lsn()::text", &s)
	l, _ := pglogrepl.ParseLSN(s)
	return l
}

func (h *histRun) rows(phase string) int {
	h.t.Helper()
	var n int
	h.mustQuery("SELECT count(*) FROM "+h.e.Table+" WHERE payload->>'phase' = '"+phase+"'", &n)
	return n
}

// settle waits for what relay r does on the server's changed history: go
// on streaming (the slot active on the server, outbox_relay_streaming 1,
// for 3 s without exiting) or stop. It reports whether r stopped.
func (h *histRun) settle(r *relay) (stopped bool) {
	h.t.Helper()
	var since time.Time
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if !r.running() {
			return true
		}
		slot, _ := h.slotState()
		if strings.HasSuffix(slot, "(active)") && r.metric("outbox_relay_streaming") == 1 {
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) >= 3*time.Second {
				return false
			}
		} else {
			since = time.Time{}
		}
		time.Sleep(200 * time.Millisecond)
	}
	h.t.Fatalf("the relay neither streams on the server's new history nor stops, 90 s after it changed:\n%s", r.LogTail(3000))
	return false
}

// recover performs the recovery steps stopped relay r names, exactly as
// docs/failover.md gives them: DELETE the registry row, outbox-relay
// migrate (a fresh slot and registry row), start the relay, outbox-relay
// replay with the arguments the error names. It checks the slot and the
// registry at each step and returns the new relay.
func (h *histRun) recover(r *relay) *relay {
	t := h.t
	t.Helper()
	code, _ := testkit.ExitCode(r.Err())
	log := strings.ReplaceAll(r.Log(), `\"`, `"`)
	cmd, del := replayCmd.FindStringSubmatch(log), deleteCmd.FindString(log)
	if code == 0 || cmd == nil || del == "" {
		t.Fatalf("the relay stopped (exit %d) without the documented recovery steps (docs/failover.md: DELETE the registry row, outbox-relay migrate, start the relay, outbox-relay replay --since); its last words:\n%s", code, r.LogTail(3000))
	}
	slot, reg := h.slotState()
	t.Logf("the relay stopped (exit %d); on the server: slot %s, registry rows %d; recovery: %s; migrate; start the relay; outbox-relay replay %s", code, slot, reg, del, cmd[1])
	if reg != 1 {
		t.Errorf("the registry row of slot %s is not on the server (%d rows): the recovery's premise (a replicated registry) fails", h.e.Slot, reg)
	}
	if _, err := h.e.DB.Exec(context.Background(), del); err != nil {
		t.Fatalf("%s: %v", del, err)
	}
	if _, reg := h.slotState(); reg != 0 {
		t.Fatalf("%s left %d registry rows", del, reg)
	}
	h.e.migrate(t)
	slot, reg = h.slotState()
	var created string
	h.mustQuery("SELECT coalesce(created_lsn::text, '') FROM "+h.e.Schema+".outbox_relay_slots WHERE slot_name = '"+h.e.Slot+"'", &created)
	if l, err := pglogrepl.ParseLSN(created); slot == "absent" || reg != 1 || err != nil || l < h.changed {
		t.Fatalf("after outbox-relay migrate: slot %s, registry rows %d, created_lsn %q; want a fresh slot and its registry row created on the new history (at or after %s)", slot, reg, created, h.changed)
	}
	r2 := h.start()
	if slot, _ := h.slotState(); !strings.HasSuffix(slot, "(active)") {
		t.Errorf("the relay started after outbox-relay migrate is ready but its slot is %s", slot)
	}
	rc, out := h.e.replay(2*time.Minute, append(append([]string{}, h.flags...), strings.Fields(cmd[1])...)...)
	if rc != 0 {
		t.Fatalf("outbox-relay replay %s: exit %d\n%s", cmd[1], rc, testkit.Tail(out, 3000))
	}
	slot, reg = h.slotState()
	t.Logf("recovered: slot %s, registry rows %d; replay: %s", slot, reg, testkit.Tail(strings.TrimSpace(out), 300))
	return r2
}

// figures compares what a consumer reads now with the events written on
// the new history: delivered (distinct new events read), duplicates (their
// extra copies) and event_ids reused (new events whose event_id header
// equals that of an event published from the old history: any record read
// before the history went back, or of an older phase). It logs the table
// line and fails the run on a loss, a reuse or, exactly-once, a duplicate.
func (h *histRun) figures(before, after []record, extra string) {
	t := h.t
	t.Helper()
	old := map[string]string{} // event_id header -> marker of an event of the old history
	for _, r := range before {
		m, _ := payloadMarker(r)
		old[r.Headers["event_id"]] = m
	}
	for _, r := range after {
		if m, p := payloadMarker(r); p != "new" {
			if _, ok := old[r.Headers["event_id"]]; !ok {
				old[r.Headers["event_id"]] = m
			}
		}
	}
	copies := map[string]int{}
	reused := map[string]string{} // new marker -> "event_id X = old event Y"
	for _, r := range after {
		m, p := payloadMarker(r)
		if p != "new" {
			continue
		}
		copies[m]++
		id := r.Headers["event_id"]
		if o, ok := old[id]; ok {
			reused[m] = fmt.Sprintf("%s (event_id %s, outbox_id %q) = %s", m, id, r.Headers["outbox_id"], o)
		}
	}
	written := h.events["new"]
	delivered, dups := 0, 0
	var lost []string
	for _, ev := range written {
		switch n := copies[ev.marker]; {
		case n == 0:
			lost = append(lost, fmt.Sprintf("%s (id %s, lsn %s)", ev.marker, ev.id, ev.lsn))
		default:
			delivered++
			dups += n - 1
		}
	}
	t.Logf("HISTORY | %s | %s | N=%d | delivered %d | duplicates %d | event_ids reused %d |", h.mode.name, h.scenario, len(written), delivered, dups, len(reused))
	t.Logf("HISTORY details %s/%s: %s", h.mode.name, h.scenario, extra)
	if len(lost) > 0 {
		t.Errorf("%d of %d events written on the new history never reached a consumer (lost); first: %s", len(lost), len(written), strings.Join(lost[:min(5, len(lost))], "; "))
	}
	if len(reused) > 0 {
		var vs []string
		for _, v := range reused {
			vs = append(vs, v)
		}
		slices.Sort(vs)
		t.Errorf("%d of %d new events carry the event_id of an event published from the old history: a consumer deduplicating on event_id drops them; e.g. %s", len(reused), len(written), strings.Join(vs[:min(3, len(vs))], "; "))
	}
	if h.mode.eos && dups > 0 {
		t.Errorf("%d duplicate records of new events read read_committed in exactly-once mode", dups)
	}
}

// idRange is "first..last" of the ids of a phase's events.
func (h *histRun) idRange(phase string) string {
	evs := h.events[phase]
	if len(evs) == 0 {
		return "none"
	}
	lo, hi := evs[0].id, evs[0].id
	for _, ev := range evs {
		a, _ := strconv.ParseInt(ev.id, 10, 64)
		if l, _ := strconv.ParseInt(lo, 10, 64); a < l {
			lo = ev.id
		}
		if u, _ := strconv.ParseInt(hi, 10, 64); a > u {
			hi = ev.id
		}
	}
	return lo + ".." + hi
}

// lsnRange is "first..last" of the WAL positions of a phase's events.
func (h *histRun) lsnRange(phase string) string {
	evs := h.events[phase]
	if len(evs) == 0 {
		return "none"
	}
	return evs[0].lsn.String() + ".." + evs[len(evs)-1].lsn.String()
}

var relayDecision = regexp.MustCompile(`(?i)checkpoint|history|timeline|watermark|replication started|skipp|went back|rewound|slot is gone`)

// logRelayDecisions logs, for every relay the run started, its log lines
// about the checkpoint and the server history, shortened to the message
// and the positions and identities they name.
func (h *histRun) logRelayDecisions() {
	for i, r := range h.relays {
		var lines []string
		for _, l := range strings.Split(r.Log(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) != nil || m["config"] != nil {
				continue
			}
			msg, _ := m["message"].(string)
			errText, _ := m["error"].(string)
			if !relayDecision.MatchString(msg + " " + errText) {
				continue
			}
			ts, _ := m["time"].(string)
			if len(ts) >= 23 {
				ts = ts[11:23]
			}
			line := fmt.Sprintf("%s %v %s", ts, m["level"], msg)
			for _, k := range []string{"lsn", "commit_lsn", "end_lsn", "watermark", "confirmed_flush_lsn", "system_id", "timeline", "previous_system_id", "previous_timeline"} {
				if v, ok := m[k]; ok {
					line += fmt.Sprintf(" %s=%v", k, v)
				}
			}
			if errText != "" {
				line += " error=" + errText[:min(len(errText), 400)]
			}
			lines = append(lines, line)
		}
		if len(lines) > 40 {
			lines = append(lines[:20], append([]string{fmt.Sprintf("... %d lines ...", len(lines)-40)}, lines[len(lines)-20:]...)...)
		}
		h.t.Logf("relay %d (%s) on checkpoint/history:\n  %s", i+1, r.LogPath, strings.Join(lines, "\n  "))
	}
}

// cpString is the checkpoint's position and identity, for the logs.
func cpString(cp map[string]string) string {
	if cp == nil {
		return "none (at-least-once)"
	}
	return fmt.Sprintf("commit_lsn %s (system_id %s, slot %s, written %s)", cp["commit_lsn"], cp["system_id"], cp["slot"], cp["written_at"])
}

// skipped is what relay r counted as skipped by the exactly-once checkpoint.
func (h *histRun) skipped(r *relay) string {
	if !h.mode.eos {
		return ""
	}
	return fmt.Sprintf("; the last relay skipped %v events as checkpointed (outbox_relay_exactly_once_skipped_events_total)", r.metric("outbox_relay_exactly_once_skipped_events_total"))
}

// A. Failover to a lagging asynchronous standby. The standby is stopped
// (its walreceiver with it) while the primary goes on: the relay publishes
// and, exactly-once, checkpoints events the standby never gets. The primary
// is killed (pg_ctl stop -m immediate), the standby started again and
// promoted (timeline 2, reusing the old timeline's LSNs and the ids its
// sequence had not logged). On PostgreSQL 15 the logical slot is not on
// the standby: the relay stops with the recovery steps and the test
// performs them as docs/failover.md gives them. Then the application
// writes new events on the new primary.
func TestHistoryFailoverLaggingStandby(t *testing.T) {
	t.Parallel() // own servers, outbox, relays, topics and proxy
	for _, mode := range histModes {
		t.Run(mode.name, func(t *testing.T) {
			began := time.Now()
			h := startHistRun(t, mode, "A lagging standby failover", "hfo"+strconv.FormatBool(mode.eos)[:1], testkit.PGPairOptions{})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			r := h.start()
			h.handled(r, h.insert("pre", histPre, 5), "the first events")
			if err := h.pair.WaitReplayed(ctx, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			// The standby falls behind for good: stopped, it receives nothing more.
			if err := h.pair.StopServer(ctx, h.pair.Standby, "fast"); err != nil {
				t.Fatal(err)
			}
			lastLost := h.insert("lost", histLost, 5)
			h.handled(r, lastLost, "the events the standby never gets")
			before := h.read()
			cp := h.checkpoint()
			if n := published(before, "lost"); n != histLost {
				t.Fatalf("staging: %d of the %d events the standby never gets were published before the failover", n, histLost)
			}
			oldEnd := h.currentLSN()

			if err := h.pair.StopPrimary(ctx, "immediate"); err != nil {
				t.Fatal(err)
			}
			if err := h.pair.StartServer(ctx, h.pair.Standby); err != nil {
				t.Fatal(err)
			}
			if err := h.pair.Promote(ctx); err != nil {
				t.Fatal(err)
			}
			h.px.Retarget(h.pair.Standby.Addr())
			h.px.Reset()
			tl, err := h.pair.Timeline(ctx, h.pair.Standby)
			if err != nil || tl != 2 {
				t.Fatalf("staging: the promoted standby is on timeline %d (%v), want 2", tl, err)
			}
			if pre, lost := h.rows("pre"), h.rows("lost"); pre != histPre || lost != 0 {
				t.Fatalf("staging: the promoted standby has %d of the %d first events and %d of the %d it should never have got", pre, histPre, lost, histLost)
			}
			newEnd := h.currentLSN()
			h.changed = newEnd
			slot, reg := h.slotState()
			t.Logf("promoted: timeline %d, WAL at %s (the old primary's ended at %s); slot %s, registry rows %d", tl, newEnd, oldEnd, slot, reg)

			if h.settle(r) {
				if slot != "absent" {
					t.Errorf("the relay stopped although its slot is on the promoted server (%s)", slot)
				}
				r = h.recover(r)
			} else {
				t.Logf("the relay goes on streaming on timeline 2 without a recovery")
			}
			lastNew := h.insert("new", histNew, 3)
			h.handled(r, lastNew, "the new events")
			after := h.read()
			cpAfter := h.checkpoint()
			h.figures(before, after, fmt.Sprintf("old-history events published %d (ids %s, LSNs %s); checkpoint before the failover %s, after %s; new events ids %s, LSNs %s%s; %s",
				published(before, "lost")+published(before, "pre"), h.idRange("lost"), h.lsnRange("lost"), cpString(cp), cpString(cpAfter), h.idRange("new"), h.lsnRange("new"),
				h.skipped(r), time.Since(began).Round(100*time.Millisecond)))
			if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
				t.Errorf("SIGTERM exit code %d, want 0", code)
			}
		})
	}
}

// B. Snapshot restore. A single server with the relay running; a
// crash-consistent snapshot of its data dir (what a VM or filesystem
// snapshot holds, replication slots included); the relay publishes and
// checkpoints more events past the snapshot; the server is stopped, the
// snapshot restored and started (same system id, same timeline, its WAL
// and slot back where they were). Then the application writes new events.
//
// The cold snapshots (pg_ctl stop -m immediate, cp -a, start again) make
// the relay reconnect, so the snapshot holds the generation the relay's
// last session raised before it, and the restore winds it back: the relay,
// kept running across the restore (it reconnects) or restarted after it,
// finds the generation gone back.
//
// The hot snapshot is taken with the relay streaming and never
// reconnecting (the server frozen, SIGSTOP, for the copy): the restored
// generation is the relay's own session's and does not tell. Were the relay
// let in at once, the restored server's WAL would end before the relay's
// position and that would tell ("the server's WAL ends at ..., before the
// position"). So the relay (kept running) is held off the restored server
// (the proxy refuses) while the application writes half the new events
// and another table's rows take the server's WAL past the position the
// relay kept; then it reconnects, applies that position provisionally and
// must find, in the stream, that the transaction at it is another one (a
// mismatch): it restarts from the slot and publishes everything. The other
// half of the new events is written once it streams again (for 3 s: the
// keepalives of the idle stream come first).
type snapVariant struct {
	name    string // for the HISTORY line
	sub     string // subtest name
	restart bool   // the relay is stopped before the restore and started after it
	hot     bool   // HotSnapshot, the relay held off until the WAL passed its position
}

var snapVariants = []snapVariant{
	{"relay kept running", "relay_kept_running", false, false},
	{"relay restarted", "relay_restarted", true, false},
	{"hot snapshot, relay kept running", "hot_snapshot", false, true},
}

func TestHistorySnapshotRestore(t *testing.T) {
	t.Parallel() // own servers, outbox, relays, topics and proxy
	for _, mode := range histModes {
		for _, v := range snapVariants {
			t.Run(mode.name+"/"+v.sub, func(t *testing.T) {
				began := time.Now()
				name := "hsr" + strconv.FormatBool(mode.eos)[:1] + strconv.FormatBool(v.restart)[:1] + strconv.FormatBool(v.hot)[:1]
				h := startHistRun(t, mode, "B snapshot restore, "+v.name, name, testkit.PGPairOptions{PrimaryOnly: true})
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				srv := h.pair.Primary
				r := h.start()
				h.handled(r, h.insert("pre", histPre, 5), "the first events")
				var snap, snapSlot string
				var err error
				var hot hotSnap
				if v.hot {
					hot = h.hotSnapshot(r, srv)
					snap, snapSlot = hot.dir, hot.slot
				} else {
					// Crash-consistent, the relay running (it reconnects).
					if err := h.pair.StopServer(ctx, srv, "immediate"); err != nil {
						t.Fatal(err)
					}
					if snap, err = h.pair.Snapshot(ctx, srv, "snapshot"); err != nil {
						t.Fatal(err)
					}
					h.restartServer(ctx, srv)
					snapSlot, _ = h.slotState()
				}
				lastLost := h.insert("lost", histLost, 5)
				h.handled(r, lastLost, "the events after the snapshot")
				before := h.read()
				cp := h.checkpoint()
				if n := published(before, "lost"); n != histLost {
					t.Fatalf("staging: %d of the %d events after the snapshot were published before the restore", n, histLost)
				}
				oldEnd := h.currentLSN()
				reconnected := ""
				if v.hot {
					reconnected = h.reconnected(r, hot)
				}
				if v.restart {
					if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
						t.Errorf("SIGTERM before the restore: exit code %d, want 0", code)
					}
				}
				// The restore.
				if v.hot {
					// The relay cannot reach the restored server until it
					// has taken writes past the relay's position.
					if err := h.px.Refuse(); err != nil {
						t.Fatal(err)
					}
					h.px.Reset()
				}
				if err := h.pair.StopServer(ctx, srv, "immediate"); err != nil {
					t.Fatal(err)
				}
				if err := h.pair.Restore(ctx, srv, snap); err != nil {
					t.Fatal(err)
				}
				var newEnd pglogrepl.LSN
				if v.hot {
					newEnd = h.writeHeldOff(ctx, r, srv, oldEnd)
				} else {
					h.restartServer(ctx, srv)
					newEnd = h.currentLSN()
				}
				h.changed = newEnd
				tl, err := h.pair.Timeline(ctx, srv)
				if err != nil || tl != 1 {
					t.Fatalf("staging: the restored server is on timeline %d (%v), want 1", tl, err)
				}
				if pre, lost := h.rows("pre"), h.rows("lost"); pre != histPre || lost != 0 {
					t.Fatalf("staging: the restored server has %d of the %d events before the snapshot and %d of the %d after it", pre, histPre, lost, histLost)
				}
				slot, reg := h.slotState()
				t.Logf("restored: timeline %d, WAL at %s (it had reached %s); slot %s (just after the snapshot: %s), registry rows %d", tl, newEnd, oldEnd, slot, snapSlot, reg)
				if newEnd >= oldEnd {
					t.Fatalf("staging: the restored server's WAL (%s) is not behind where it had been (%s)", newEnd, oldEnd)
				}
				if v.restart {
					r = h.launch()
				}
				if h.settle(r) {
					r = h.recover(r)
				} else {
					t.Logf("the relay streams on the restored server without a recovery")
				}
				lastNew := h.insert("new", histNew-len(h.events["new"]), 3)
				h.handled(r, lastNew, "the new events")
				after := h.read()
				cpAfter := h.checkpoint()
				mismatches := h.decisions(r, "stream", "mismatch")
				h.figures(before, after, fmt.Sprintf("events published past the snapshot %d (ids %s, LSNs %s); checkpoint before the restore %s, after %s; new events ids %s, LSNs %s%s; kept positions against the history: %s; %s",
					published(before, "lost"), h.idRange("lost"), h.lsnRange("lost"), cpString(cp), cpString(cpAfter), h.idRange("new"), h.lsnRange("new"),
					h.skipped(r), h.decisionString(r), time.Since(began).Round(100*time.Millisecond)))
				if v.hot {
					// The point of the variant: the stream, not the
					// generation, told the relay the history changed.
					logged := strings.Contains(r.Log(), mismatchLog) || strings.Contains(r.Log(), passedLog)
					t.Logf("HISTORY path %s/%s: stream mismatches %v, log line %v%s", mode.name, v.sub, mismatches, logged, reconnected)
					if mismatches < 1 || !logged {
						t.Errorf("the relay did not take the stream-mismatch path (outbox_relay_history_decisions_total{source=\"stream\",verdict=\"mismatch\"} %v, log line %q or %q found: %v); its decisions: %s%s",
							mismatches, mismatchLog, passedLog, logged, h.decisionString(r), reconnected)
					}
				}
				if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
					t.Errorf("SIGTERM exit code %d, want 0", code)
				}
			})
		}
	}
}

// mismatchLog is the relay's warning when the stream refutes its kept position.
// The two ways the stream refutes a kept position: another transaction at
// its commit LSN, or a keepalive past it without it (only other tables'
// WAL there, as in the hot variant, where a CREATE TABLE moved the WAL).
const (
	mismatchLog = "the WAL at the kept position holds another transaction"
	passedLog   = "the server streamed past the kept position without its transaction"
)

// hotSnap is a hot snapshot and what the relay was doing when it was taken.
type hotSnap struct {
	dir        string
	slot       string // the slot on the server right after the snapshot
	sessions   int    // the relay's replication sessions so far
	generation int64  // the registry's generation (the relay's session's)
}

// hotSnapshot takes a crash-consistent snapshot of the running srv
// without the relay noticing: the server frozen (every process SIGSTOPped)
// for the copy only, far shorter than the relay's receive timeout (30 s),
// so the relay's replication connection lives on.
func (h *histRun) hotSnapshot(r *relay, srv *testkit.PGServer) hotSnap {
	t := h.t
	t.Helper()
	s := hotSnap{sessions: h.sessions(r)}
	h.mustQuery("SELECT generation FROM "+h.e.Schema+".outbox_relay_slots WHERE slot_name = '"+h.e.Slot+"'", &s.generation)
	// Never leave the server stopped, whatever fails: a stopped postmaster
	// ignores pg_ctl stop. Thaw does nothing to a server not frozen.
	t.Cleanup(func() {
		if err := h.pair.Thaw(srv); err != nil {
			t.Errorf("thaw the server: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, frozen, procs, err := h.pair.HotSnapshot(ctx, srv, "snapshot")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	s.slot, _ = h.slotState()
	t.Logf("hot snapshot: %d server processes frozen (SIGSTOP) for %s, the data dir copied; generation %d, relay sessions %d", procs, frozen.Round(time.Millisecond), s.generation, s.sessions)
	if frozen > 2*time.Second {
		t.Logf("the freeze took %s (over 2 s): the relay may have given up on its connection", frozen.Round(time.Millisecond))
	}
	return s
}

// reconnected says whether relay r started a replication session since the
// hot snapshot s (a new "replication started", or the generation raised):
// then the snapshot's generation is behind the relay's and the restore is
// caught by the generation, not by the stream. "" when it did not.
func (h *histRun) reconnected(r *relay, s hotSnap) string {
	var gen int64
	h.mustQuery("SELECT generation FROM "+h.e.Schema+".outbox_relay_slots WHERE slot_name = '"+h.e.Slot+"'", &gen)
	n := h.sessions(r)
	if n == s.sessions && gen == s.generation {
		h.t.Logf("the relay did not reconnect across the hot snapshot (sessions %d, generation %d)", n, gen)
		return ""
	}
	msg := fmt.Sprintf("; the relay reconnected after the hot snapshot (replication sessions %d -> %d, generation %d -> %d): the restore winds the generation back, so the generation check decides, not the stream", s.sessions, n, s.generation, gen)
	h.t.Errorf("%s", msg[2:])
	return msg
}

// writeHeldOff starts the restored srv with the relay held off (the proxy
// refusing), writes half the new events on it (directly, at WAL positions
// the lost history had used) and then other tables' rows until its WAL is
// past until, the position the relay kept; then lets the relay in (the
// proxy re-pointed at srv) and waits for its new session. It returns the
// restored server's WAL end before the writes.
func (h *histRun) writeHeldOff(ctx context.Context, r *relay, srv *testkit.PGServer, until pglogrepl.LSN) pglogrepl.LSN {
	t := h.t
	t.Helper()
	sessions := h.sessions(r)
	if err := h.pair.StartServer(ctx, srv); err != nil {
		t.Fatal(err)
	}
	c, err := h.pair.Conn(ctx, srv, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	lsn := func() pglogrepl.LSN {
		var s string
		if err := c.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, _ := pglogrepl.ParseLSN(s)
		return l
	}
	end := lsn()
	h.insertOn(ctx, c, "new", histNew/2, 3)
	filler := h.e.Schema + ".hot_filler"
	if _, err := c.Exec(ctx, "CREATE TABLE "+filler+" (id bigserial PRIMARY KEY, b text)"); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for lsn() <= until {
		if _, err := c.Exec(ctx, "INSERT INTO "+filler+" (b) SELECT repeat('x', 500) FROM generate_series(1, 100)"); err != nil {
			t.Fatal(err)
		}
		rows += 100
	}
	t.Logf("held off the relay: %d new events, a table and %d rows of it written on the restored server, its WAL from %s to %s (past the relay's position, at most %s)", len(h.events["new"]), rows, end, lsn(), until)
	h.px.Retarget(srv.Addr())
	if err := h.px.Heal(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the relay's session on the restored server", func() bool { return h.sessions(r) > sessions })
	return end
}

// sessions counts relay r's replication sessions ("replication started").
func (h *histRun) sessions(r *relay) int {
	return strings.Count(r.Log(), `"message":"replication started"`)
}

// decisions is outbox_relay_history_decisions_total{source, verdict} of r.
func (h *histRun) decisions(r *relay, source, verdict string) float64 {
	ss, err := r.Scrape()
	if err != nil {
		h.t.Fatalf("scrape the relay: %v", err)
	}
	v, _ := testkit.SumMetric(ss, "outbox_relay_history_decisions_total", map[string]string{"source": source, "verdict": verdict})
	return v
}

// decisionString lists r's outbox_relay_history_decisions_total series.
func (h *histRun) decisionString(r *relay) string {
	ss, err := r.Scrape()
	if err != nil {
		return "(no metrics: " + err.Error() + ")"
	}
	var out []string
	for _, s := range ss {
		if s.Name == "outbox_relay_history_decisions_total" && s.Value > 0 {
			out = append(out, fmt.Sprintf("%s/%s %v", s.Labels["source"], s.Labels["verdict"], s.Value))
		}
	}
	slices.Sort(out)
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// restartServer starts srv (on a new port) and re-points the proxy at it,
// cutting the connections still open through it.
func (h *histRun) restartServer(ctx context.Context, srv *testkit.PGServer) {
	h.t.Helper()
	if err := h.pair.StartServer(ctx, srv); err != nil {
		h.t.Fatal(err)
	}
	h.px.Retarget(srv.Addr())
	h.px.Reset()
}
