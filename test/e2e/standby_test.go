//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/preflight"
	"github.com/outbox-relay/outbox-relay/status"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// startPair starts a primary and a streaming standby (testkit.PGPair) for
// the test and an outbox on the primary. The relay's connections get
// wal_sender_timeout 5s: a replication session whose status updates stop
// for that long is cut by the server.
func startPair(t *testing.T, name string, opts testkit.PGPairOptions) (*testkit.PGPair, *env) {
	t.Helper()
	pair := newPGPair(t, opts)
	u := pair.URL(pair.Primary) + "&options=" + "-c%20wal_sender_timeout%3D5s"
	return pair, newEnvAt(t, name, u)
}

// pause stops the standby's WAL receiver until the returned func (or the
// cleanup) resumes it.
func pause(t *testing.T, pair *testkit.PGPair) func() {
	t.Helper()
	resume, err := pair.PauseWALReceiver(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resume() })
	return func() {
		t.Helper()
		if err := resume(); err != nil {
			t.Fatal(err)
		}
	}
}

// With postgres.standby_slots the relay publishes nothing the standby has
// not flushed: while its WAL receiver is stopped, events committed on the
// primary wait (for longer than the session's wal_sender_timeout: status
// updates keep the session alive, no reconnect), /readyz says why after
// StallAfter and the log names the slot; once it resumes they are
// published, none lost. Without the key the same events are published at
// once although the standby does not have them: after a failover to it
// they would be phantom events.
func TestStandbyGate(t *testing.T) {
	ctx := context.Background()
	pair, e := startPair(t, "sgate", testkit.PGPairOptions{})
	w := e.newWriter(35)
	write := func(n int) {
		t.Helper()
		for range n {
			if err := w.Write(ctx, 1, 10, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	flushed := func() string {
		t.Helper()
		l, err := pair.StandbyFlushed(ctx)
		return testkit.Must(t, l, err).String()
	}
	published := func(r *relay) float64 { return r.metric("outbox_relay_events_published_total") }

	r := e.startRelay("--standby-slots", testkit.PairSlot)
	write(10)
	waitFor(t, 30*time.Second, "10 events published with a healthy standby", func() bool { return published(r) >= 10 })

	resume := pause(t, pair)
	held := flushed()
	write(20)
	last := w.LastLSN()
	paused := time.Now()
	// 12 s: past the gate's StallAfter (10 s) and twice the session's
	// wal_sender_timeout.
	for time.Since(paused) < 12*time.Second {
		if n := published(r); n != 10 {
			t.Fatalf("%.0f events published while the standby's WAL receiver was stopped at %s (last event at %s); want the 10 from before", n, flushed(), last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if now := flushed(); now != held {
		t.Fatalf("the standby flushed on (%s to %s) while its WAL receiver was stopped: the test proves nothing", held, now)
	}
	code, body := r.get("/readyz")
	if code != 503 || !strings.Contains(body, "standby_slots") || !strings.Contains(body, testkit.PairSlot) {
		t.Errorf("/readyz = %d %q while the gate holds events for 12 s, want 503 naming postgres.standby_slots and %s", code, body, testkit.PairSlot)
	}
	if log := r.log(); !strings.Contains(log, "not publishing: waiting for the standbys of postgres.standby_slots") || !strings.Contains(log, testkit.PairSlot) {
		t.Errorf("no log line naming the standby slot the relay waits for:\n%s", r.LogTail(3000))
	}
	if n := r.metric("outbox_relay_replication_reconnects_total"); n != 0 {
		t.Errorf("%.0f replication reconnects while gated: the session should stay up (status updates every status_interval)\n%s", n, r.LogTail(3000))
	}
	if lag := r.metric("outbox_relay_standby_lag_bytes"); lag <= 0 {
		t.Errorf("outbox_relay_standby_lag_bytes = %v while the standby lags, want > 0", lag)
	}
	resume()
	resumed := time.Now()
	waitFor(t, 60*time.Second, "the 20 held events published once the standby caught up", func() bool { return published(r) >= 30 })
	caughtUp := time.Since(resumed)
	r.waitReady(30 * time.Second)
	ws := w.written()
	rs := consume(t, e.topics(), len(ws), time.Minute, 2*time.Second)
	rep := check(t, ws, rs, e.partitions(t))
	requireClean(t, rep, false)
	t.Logf("standby gate: 20 events held %s while the standby's WAL receiver was stopped (flushed %s, last event %s), published %s after it resumed; %d delivered, %d lost, %d duplicates",
		resumed.Sub(paused).Round(100*time.Millisecond), held, last, caughtUp.Round(10*time.Millisecond), rep.Delivered, rep.Lost, rep.Duplicates)
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}

	// Without the key: published at once, ahead of the standby.
	r2 := e.startRelay()
	resume = pause(t, pair)
	held = flushed()
	write(10)
	last = w.LastLSN()
	waitFor(t, 30*time.Second, "10 events published without postgres.standby_slots", func() bool { return published(r2) >= 10 })
	now := flushed()
	resume()
	if now != held {
		t.Fatalf("the standby flushed on (%s to %s) while its WAL receiver was stopped: the test proves nothing", held, now)
	}
	t.Logf("without postgres.standby_slots: 10 events published while the standby had flushed only to %s, before the last event at %s (phantom events if the primary failed then)", now, last)
	if code := r2.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
}

// The gate's latency cost on a healthy standby: commit (the writer's
// COMMIT returned) to a consumer's receipt, for 300 one-event transactions
// at 50/s, with and without postgres.standby_slots, for an asynchronous and
// a synchronous standby. Logged as "standby gate latency:" lines; it fails
// only when the gate adds more than 50 ms at the median (a poll that does
// not start at once would add up to its idle second).
func TestStandbyGateLatency(t *testing.T) {
	for _, syncCommit := range []bool{false, true} {
		t.Run(fmt.Sprintf("synchronous=%v", syncCommit), func(t *testing.T) {
			pair, e := startPair(t, "sglat", testkit.PGPairOptions{SyncCommit: syncCommit})
			w := e.newWriter(36)
			var p50 [2]time.Duration
			for i, gated := range []bool{false, true} {
				var flags []string
				if gated {
					flags = []string{"--standby-slots", testkit.PairSlot}
				}
				r := e.startRelay(flags...)
				lat := measureLatency(t, e, w, 300, 50)
				q := func(f float64) time.Duration { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
				p50[i] = q(0.5)
				extra := ""
				if gated {
					ss, err := r.Scrape()
					if err != nil {
						t.Fatal(err)
					}
					n, _ := testkit.SumMetric(ss, "outbox_relay_standby_wait_seconds_count", nil)
					sum, _ := testkit.SumMetric(ss, "outbox_relay_standby_wait_seconds_sum", nil)
					extra = fmt.Sprintf("; the gate's own wait over %.0f transactions: mean %.2f ms, median <= %.1f ms, p99 <= %.1f ms (histogram buckets)",
						n, 1000*sum/max(n, 1), 1000*bucketBound(ss, "outbox_relay_standby_wait_seconds", 0.5), 1000*bucketBound(ss, "outbox_relay_standby_wait_seconds", 0.99))
				}
				t.Logf("standby gate latency: PostgreSQL %d, synchronous standby %v, gate %v: commit -> consumer over %d events: median %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms%s",
					pair.Major, syncCommit, gated, len(lat), millis(q(0.5)), millis(q(0.9)), millis(q(0.99)), millis(lat[len(lat)-1]), extra)
				if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
					t.Fatalf("exit code %d, want 0", code)
				}
			}
			if d := p50[1] - p50[0]; d > 50*time.Millisecond {
				t.Errorf("the gate adds %s at the median, want under 50ms", d)
			}
		})
	}
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// bucketBound is the upper bound of the histogram bucket holding quantile
// q of the histogram name: the quantile is at most that.
func bucketBound(ss []testkit.Sample, name string, q float64) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, s := range ss {
		if s.Name != name+"_bucket" {
			continue
		}
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
		if err == nil {
			bs = append(bs, bucket{le, s.Value})
		}
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if len(bs) == 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].n
	for _, b := range bs {
		if b.n >= rank {
			return b.le
		}
	}
	return math.Inf(1)
}

// measureLatency writes n one-event transactions at rate a second (after a
// warm-up whose topics it then consumes from) and returns, sorted, each
// event's time from its COMMIT's return to its receipt by a consumer.
func measureLatency(t *testing.T, e *env, w *writer, n, rate int) []time.Duration {
	t.Helper()
	ctx := context.Background()
	// Warm-up: the topics exist and the relay's producer knows their leaders.
	before := len(w.written())
	for range 10 {
		if err := w.Write(ctx, 1, 10, ""); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu       sync.Mutex
		received = map[int64]time.Time{}
	)
	// Keyed by the writer's transaction number in the payload: one event each.
	c, err := testkit.Consume(brokers, e.topics(), 30*time.Second, func(m *sarama.ConsumerMessage) {
		at := time.Now()
		var p struct{ Txn int64 }
		if json.Unmarshal(m.Value, &p) == nil {
			mu.Lock()
			received[p.Txn] = at
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 30*time.Second, "the warm-up events consumed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(received) >= before+10
	})
	committed := map[int64]time.Time{}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for range n {
		<-tick.C
		if err := w.Write(ctx, 1, 10, ""); err != nil {
			t.Fatal(err)
		}
		ws := w.written()
		committed[ws[len(ws)-1].Txn] = time.Now()
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("%d events consumed", n), func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range committed {
			if _, ok := received[id]; !ok {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	for id, at := range committed {
		lat = append(lat, max(0, received[id].Sub(at)))
	}
	slices.Sort(lat)
	return lat
}

// check and status judge the protections against phantom events on a real
// primary with a streaming standby: without either, check warns and names
// the fixes the server's version has; postgres.standby_slots naming the
// standby's slot is ok, naming a missing slot fails with the statement that
// creates it, and the relay refuses a logical slot there. On 17+ a failover
// slot needs synchronized_standby_slots: warned while empty, ok once it
// names the standby's slot.
func TestStandbyGateChecks(t *testing.T) {
	ctx := context.Background()
	pair, e := startPair(t, "sgcheck", testkit.PGPairOptions{})
	v17 := pair.Major >= 17

	r, out := e.runCheck(t, "")
	c := checkNamed(t, r, pgsetup.CheckFailover)
	if c.Verdict != preflight.Warn || !strings.Contains(c.Value, "phantom events are possible") ||
		!strings.Contains(c.Fix, "postgres.standby_slots: ["+testkit.PairSlot+"]") || strings.Contains(c.Fix, "synchronized_standby_slots") != v17 {
		t.Errorf("check without protection on PostgreSQL %d: %+v", pair.Major, c)
	}
	t.Logf("check, no protection: %s\n  -> %s", c.Value, c.Fix)

	r, out = e.runCheck(t, "", "--standby-slots", testkit.PairSlot)
	if c := checkNamed(t, r, pgsetup.CheckFailoverStandbySlots); c.Verdict != preflight.OK || !strings.Contains(c.Value, `slot "`+testkit.PairSlot+`" active`) {
		t.Errorf("check --standby-slots %s: %+v\n%s", testkit.PairSlot, c, out)
	}
	r, out = e.runCheck(t, "", "--standby-slots", "nope,"+testkit.PairSlot)
	if c := checkNamed(t, r, pgsetup.CheckFailoverStandbySlots); c.Verdict != preflight.Fail || !strings.Contains(c.Fix, "pg_create_physical_replication_slot('nope')") {
		t.Errorf("check --standby-slots nope: %+v\n%s", c, out)
	}
	st := e.statusJSON(t, "--standby-slots", testkit.PairSlot)
	if c := statusCheck(t, st, pgsetup.CheckFailoverStandbySlots); c.Verdict != status.OK ||
		st.Facts.Failover == nil || len(st.Facts.Failover.StandbySlots) != 1 || !st.Facts.Failover.StandbySlots[0].Active {
		t.Errorf("status --standby-slots %s: %+v, facts %+v", testkit.PairSlot, c, st.Facts.Failover)
	}

	// A logical slot is not a standby: the relay refuses it at start.
	if _, err := e.DB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", e.Slot+"_l"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.DB.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", e.Slot+"_l") })
	code, log := e.runRelayToExit(60*time.Second, "--standby-slots", e.Slot+"_l")
	if code == 0 || !strings.Contains(log, `postgres.standby_slots names \"`+e.Slot+`_l\", a logical slot`) {
		t.Errorf("relay --standby-slots <logical slot>: exit %d, want a refusal naming the slot:\n%s", code, testkit.Tail(log, 2000))
	}

	if !v17 {
		r, out = e.runCheck(t, "", "--slot-failover")
		if c := checkNamed(t, r, pgsetup.CheckFailoverSlot); c.Verdict != preflight.Fail || !strings.Contains(c.Value, "refuses to start") {
			t.Errorf("check --slot-failover on PostgreSQL %d: %+v\n%s", pair.Major, c, out)
		}
		return
	}
	r, out = e.runCheck(t, "", "--slot-failover")
	if c := checkNamed(t, r, pgsetup.CheckFailoverSlot); c.Verdict != preflight.Warn || !strings.Contains(c.Fix, "ALTER_REPLICATION_SLOT "+e.Slot+" (FAILOVER true)") {
		t.Errorf("check --slot-failover, slot without failover: %+v\n%s", c, out)
	}
	c = checkNamed(t, r, pgsetup.CheckFailoverSyncSlots)
	if c.Verdict != preflight.Warn || !strings.Contains(c.Fix, "ALTER SYSTEM SET synchronized_standby_slots = '"+testkit.PairSlot+"'; SELECT pg_reload_conf();") {
		t.Errorf("check --slot-failover, synchronized_standby_slots empty: %+v\n%s", c, out)
	}
	t.Logf("check --slot-failover, setting empty: %s\n  -> %s", c.Value, c.Fix)
	for _, q := range []string{"ALTER SYSTEM SET synchronized_standby_slots = '" + testkit.PairSlot + "'", "SELECT pg_reload_conf()"} {
		if _, err := e.DB.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	waitFor(t, 10*time.Second, "synchronized_standby_slots reloaded", func() bool {
		r, _ = e.runCheck(t, "", "--slot-failover")
		return checkNamed(t, r, pgsetup.CheckFailoverSyncSlots).Verdict == preflight.OK
	})
	st = e.statusJSON(t, "--slot-failover")
	if c := statusCheck(t, st, pgsetup.CheckFailoverSyncSlots); c.Verdict != status.OK {
		t.Errorf("status --slot-failover with synchronized_standby_slots set: %+v", c)
	}
}
