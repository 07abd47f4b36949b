//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/test/proxy"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// failover is one failover test: a primary and a streaming standby the
// test started, the relay and the writer connected through a proxy that is
// re-pointed at the standby once it is promoted, the shared Kafka.
type failover struct {
	t    *testing.T
	pair *testkit.PGPair
	px   *proxy.Proxy
	e    *env
	w    *writer
	// load runs the writer until stop is closed; its error arrives on done.
	stop chan struct{}
	done chan error
}

// newPGPair starts a primary and a streaming standby for t, stopped when t
// ends; when t failed, with their logs and data kept.
func newPGPair(t *testing.T, opts testkit.PGPairOptions) *testkit.PGPair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pair, err := testkit.StartPGPair(ctx, opts)
	t.Cleanup(func() {
		if pair == nil {
			return
		}
		if err := pair.Close(t.Failed()); err != nil {
			t.Errorf("stop the pair: %v", err)
		}
		if t.Failed() {
			t.Logf("servers' logs and data kept in %s", pair.Dir())
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %d primary %s, standby %s (%s, synchronous %v)", pair.Major, pair.Primary.Addr(), pair.Standby.Addr(), pair.BaseBackup, opts.SyncCommit)
	return pair
}

func startFailover(t *testing.T, name string, opts testkit.PGPairOptions) *failover {
	t.Helper()
	opts.SyncCommit = true // a commit the writer saw survives the failover: every loss would be the relay's
	pair := newPGPair(t, opts)
	px := startProxy(t, "127.0.0.1:0", pair.Primary.Addr())
	f := &failover{t: t, pair: pair, px: px, stop: make(chan struct{}), done: make(chan error, 1)}
	f.e = newEnvAt(t, name, pair.URLAt(px.Addr()))
	f.w = f.e.newWriter(uint64(len(name)))
	return f
}

// startLoad writes transactions of 1..5 events over 20 aggregates, about
// perSec events a second, until stopLoad; statements cut off by the
// failover are retried on the new primary (testkit.Writer).
func (f *failover) startLoad(perSec int) {
	go func() {
		tick := time.NewTicker(time.Second / time.Duration(perSec/3))
		defer tick.Stop()
		for {
			select {
			case <-f.stop:
				f.done <- nil
				return
			case <-tick.C:
			}
			if err := f.w.Write(context.Background(), 1+f.w.Rand.IntN(5), 20, ""); err != nil {
				f.done <- err
				return
			}
		}
	}()
}

// stopLoad stops the writer and returns what it committed.
func (f *failover) stopLoad() []written {
	f.t.Helper()
	close(f.stop)
	select {
	case err := <-f.done:
		if err != nil {
			f.t.Fatalf("writer: %v", err)
		}
	case <-time.After(3 * time.Minute):
		f.t.Fatal("the writer did not stop")
	}
	return f.w.written()
}

// failOver crashes the primary (immediate), promotes the standby and points
// the proxy at it, resetting the connections still open through it. It
// returns when the standby was promoted.
func (f *failover) failOver() time.Time {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := f.pair.StopPrimary(ctx, "immediate"); err != nil {
		f.t.Fatal(err)
	}
	if err := f.pair.Promote(ctx); err != nil {
		f.t.Fatal(err)
	}
	promoted := time.Now()
	f.px.Retarget(f.pair.Standby.Addr())
	f.px.Reset()
	return promoted
}

// figures logs the measured figures of one failover case, one line a test,
// grep-able ("failover figures:"), and returns the number of records of
// events the writer never committed: published from the old primary's WAL
// but not in the new primary's history (the standby is synchronous, so
// only a commit the relay decoded before the standby had it).
func (f *failover) figures(ws []written, rs []record, rep report, extra string) (foreign int) {
	f.t.Helper()
	known := make(map[string]bool, len(ws))
	for _, w := range ws {
		known[w.Identity()] = true // by event_id: a row id the new primary handed out again is another event
	}
	for _, r := range rs {
		if !known[r.Headers["event_id"]] {
			foreign++
		}
	}
	f.t.Logf("failover figures: PostgreSQL %d, %s: events %d, delivered %d, lost %d, duplicates %d, order violations %d, records of uncommitted events %d; %s",
		f.pair.Major, f.t.Name(), rep.Written, rep.Delivered, rep.Lost, rep.Duplicates, rep.OrderViolations, foreign, extra)
	return foreign
}

// consumeAll waits until the slot confirmed the writer's last event, then
// reads every record of the test's topics.
func (f *failover) consumeAll(ws []written) []record {
	f.t.Helper()
	if err := f.e.WaitConfirmed(context.Background(), f.w.LastLSN(), 2*time.Minute); err != nil {
		f.t.Fatal(err)
	}
	return consume(f.t, f.e.topics(), len(ws), 2*time.Minute, 3*time.Second)
}

// failoverRelayFlags make the relay reconnect quickly after the failover.
var failoverRelayFlags = []string{"--reconnect-min", "100ms", "--reconnect-max", "1s"}

// Without failover slots (PostgreSQL before 17, or 17+ without
// postgres.slot_failover and the standby settings) the promoted standby has
// no logical slot. The registry row was replicated with the outbox, so the
// relay knows its slot existed: it stops with the recovery steps instead of
// creating a fresh slot that would skip what was written meanwhile.
// Following them (registry row, migrate, relay, the replay command it
// names) puts every committed event in Kafka.
func TestFailoverWithoutFailoverSlots(t *testing.T) {
	f := startFailover(t, "promote", testkit.PGPairOptions{})
	testFailoverReplay(t, f, nil)
}

func testFailoverReplay(t *testing.T, f *failover, relayFlags []string) {
	ctx := context.Background()
	e := f.e
	flags := append(append([]string{}, failoverRelayFlags...), relayFlags...)
	r := e.startRelay(flags...)
	f.startLoad(300)
	waitFor(t, 60*time.Second, "300 events published before the failover", func() bool {
		return r.metric("outbox_relay_events_published_total") >= 300
	})
	promoted := f.failOver()

	select {
	case <-r.Done():
	case <-time.After(90 * time.Second):
		t.Fatalf("the relay still runs 90 s after the promotion; it should have stopped: its slot is not on the new primary\n%s", r.LogTail(4000))
	}
	stopped := time.Since(promoted)
	if code, _ := testkit.ExitCode(r.Err()); code == 0 {
		t.Fatalf("the relay exited 0 after losing its slot; want a fatal exit\n%s", r.LogTail(3000))
	}
	log := strings.ReplaceAll(r.Log(), `\"`, `"`)
	cmd, del := replayCmd.FindStringSubmatch(log), deleteCmd.FindString(log)
	if cmd == nil || del == "" {
		t.Fatalf("the relay's error lacks the recovery steps (DELETE FROM the registry, replay command):\n%s", r.LogTail(4000))
	}
	if !strings.Contains(log, "a restart refuses the same way until the recovery steps in the error are done") {
		t.Errorf("the relay's last words do not say that a restart will not help:\n%s", r.LogTail(2000))
	}
	// The relay saw the history change (timeline 1 to 2) and says so.
	if !strings.Contains(log, "history changed") || !strings.Contains(log, "timeline 2") || !strings.Contains(log, "docs/failover.md") {
		t.Errorf("the error does not say that the server history changed (a failover) and where the procedure is:\n%s", r.LogTail(3000))
	}
	// A relay started now (a fresh process: no earlier history to compare)
	// refuses too, from the timeline alone.
	if code, out := e.runRelayToExit(60*time.Second, flags...); code == 0 || !strings.Contains(out, "promoted from a standby") || !replayCmd.MatchString(strings.ReplaceAll(out, `\"`, `"`)) {
		t.Fatalf("a relay started on the promoted server: exit %d, want a refusal naming the promotion and the replay command:\n%s", code, testkit.Tail(out, 3000))
	}
	// The documented procedure (docs/failover.md), on the new primary.
	if _, err := e.DB.Exec(ctx, del); err != nil {
		t.Fatalf("%s: %v", del, err)
	}
	e.migrate(t)
	r2 := e.startRelay(flags...)
	waitFor(t, 60*time.Second, "the new relay to publish", func() bool {
		return r2.metric("outbox_relay_events_published_total") >= 1
	})
	resumed := time.Since(promoted)
	code, out := e.replay(3*time.Minute, strings.Fields(cmd[1])...)
	if code != 0 {
		t.Fatalf("%s: exit %d\n%s", cmd[0], code, testkit.Tail(out, 3000))
	}
	replayed := time.Since(promoted)
	ws := f.stopLoad()
	rs := f.consumeAll(ws)
	rep := check(t, ws, rs, e.partitions(t))
	f.figures(ws, rs, rep, fmt.Sprintf("relay stopped %s after the promotion; publishing again %s after it (procedure automated); replay done %s after it; %s",
		stopped.Round(10*time.Millisecond), resumed.Round(10*time.Millisecond), replayed.Round(10*time.Millisecond), cmd[0]))
	// Replay republishes the gap after the events the new slot streamed:
	// order across the gap is not kept, loss and partitioning are checked.
	if rep.Lost != 0 || rep.PartitionViolations != 0 || rep.Delivered != len(ws) {
		t.Fatalf("lost %d, partition violations %d, delivered %d of %d:\n  %s", rep.Lost, rep.PartitionViolations, rep.Delivered, len(ws), strings.Join(rep.Problems, "\n  "))
	}
	if code := r2.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// serverVersionNum is server_version_num of the services' PostgreSQL.
func serverVersionNum(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Failover slots (postgres.slot_failover) on the services' PostgreSQL. On
// 17+: the slot is a failover slot (created so by migrate, or turned on by
// the relay for an existing one), the standby syncs it
// (sync_replication_slots, hot_standby_feedback, primary_slot_name, dbname
// in primary_conninfo), the primary waits for the standby's physical slot
// before decoding (synchronized_standby_slots). After the promotion the relay
// reconnects through the re-pointed proxy, sees the new timeline, drops its
// in-memory watermark and continues from the synced slot: nothing lost,
// duplicates counted. Before 17 the relay and migrate refuse the key,
// naming the server's version.
func TestFailoverSlots(t *testing.T) {
	if n := serverVersionNum(t); n < 170000 {
		testFailoverSlotsRefused(t, n)
		return
	}
	ctx := context.Background()
	f := startFailover(t, "fslots", testkit.PGPairOptions{FailoverSlots: true})
	e := f.e
	slotFailover := func(slot string) bool {
		t.Helper()
		var on bool
		if err := e.DB.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&on); err != nil {
			t.Fatalf("read failover of slot %s: %v", slot, err)
		}
		return on
	}
	// migrate with the key creates a failover slot ...
	created := e.Slot + "_c"
	if code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append(append([]string{"migrate"}, e.flags()...), "--slot", created, "--slot-failover")...); err != nil || code != 0 {
		t.Fatalf("migrate --slot-failover: exit %d %v\n%s", code, err, out)
	}
	if !slotFailover(created) {
		t.Fatalf("migrate --slot-failover created slot %s without failover", created)
	}
	if _, err := e.DB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", created); err != nil {
		t.Fatal(err)
	}
	// ... and the relay turns failover on for the slot newEnv's migrate
	// made without it.
	if slotFailover(e.Slot) {
		t.Fatalf("slot %s has failover on before the relay ran with the key", e.Slot)
	}
	r := e.startRelay(append(append([]string{}, failoverRelayFlags...), "--slot-failover")...)
	if !slotFailover(e.Slot) || !strings.Contains(r.log(), "turned failover on") {
		t.Fatalf("the relay did not turn failover on for slot %s:\n%s", e.Slot, r.LogTail(3000))
	}
	f.startLoad(300)
	waitFor(t, 60*time.Second, "300 events published before the failover", func() bool {
		return r.metric("outbox_relay_events_published_total") >= 300
	})
	var syncedAt string
	waitFor(t, 90*time.Second, "the slot synced to the standby (synced, not temporary)", func() bool {
		ok, confirmed, err := f.pair.SlotOnStandby(ctx, e.Slot)
		syncedAt = confirmed
		return err == nil && ok
	})
	slotAt, _ := e.Confirmed(ctx)
	promoted := f.failOver()
	waitFor(t, 90*time.Second, "the relay to see the new server history", func() bool {
		return r.metric("outbox_relay_server_history_changes_total") >= 1
	})
	before := r.metric("outbox_relay_events_published_total")
	waitFor(t, 90*time.Second, "the relay to publish again", func() bool {
		if err := r.Exited(); err != nil {
			t.Fatalf("the relay stopped after the promotion; with a synced failover slot it should continue: %v", err)
		}
		return r.metric("outbox_relay_events_published_total") > before
	})
	resumed := time.Since(promoted)
	ws := f.stopLoad()
	rs := f.consumeAll(ws)
	rep := check(t, ws, rs, e.partitions(t))
	foreign := f.figures(ws, rs, rep, fmt.Sprintf("publishing again %s after the promotion, from the synced slot (synced confirmed_flush_lsn seen %s, primary's %s before the crash)",
		resumed.Round(10*time.Millisecond), syncedAt, slotAt))
	// synchronized_standby_slots: nothing reached the relay before the standby.
	if foreign > 0 {
		t.Errorf("%d records of events not in the new primary's history: the relay decoded commits the standby did not have", foreign)
	}
	requireClean(t, rep, true)
	log := r.log()
	if !strings.Contains(log, "server history changed") {
		t.Errorf("the relay log does not say the server history changed:\n%s", r.LogTail(3000))
	}
	// The promoted server has no synchronized_standby_slots (it has no
	// standby): the relay says so.
	if !strings.Contains(log, "synchronized_standby_slots is empty") {
		t.Errorf("the relay did not warn that the new primary has no synchronized_standby_slots:\n%s", r.LogTail(3000))
	}
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// testFailoverSlotsRefused: before PostgreSQL 17 postgres.slot_failover is a
// start-time error naming the version, for migrate and the relay.
func testFailoverSlotsRefused(t *testing.T, versionNum int) {
	e := newEnv(t, "fslots")
	want := fmt.Sprintf("server_version_num %d) and failover slots need PostgreSQL 17 or later", versionNum)
	code, out, err := testkit.Run(context.Background(), os.Environ(), relayBin, append(append([]string{"migrate"}, e.flags()...), "--slot-failover")...)
	if err != nil || code == 0 || !strings.Contains(out, want) {
		t.Fatalf("migrate --slot-failover on server_version_num %d: exit %d %v, want a refusal containing %q:\n%s", versionNum, code, err, want, testkit.Tail(out, 3000))
	}
	code, out = e.runRelayToExit(60*time.Second, "--slot-failover")
	if code == 0 || !strings.Contains(out, want) || !strings.Contains(out, "postgres.slot_failover") {
		t.Fatalf("relay --slot-failover on server_version_num %d: exit %d, want a refusal containing %q:\n%s", versionNum, code, want, testkit.Tail(out, 3000))
	}
	t.Logf("refused on server_version_num %d", versionNum)
}
