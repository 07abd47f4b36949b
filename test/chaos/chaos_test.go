//go:build e2e

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/test/proxy"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// scale sizes the suite: short in make test, long in make chaos.
type scale struct {
	name                      string
	events                    int // per scenario
	aggregates                int
	relayKills, pausedKills   int
	brokerKills, brokerPauses int
	pgRestarts                int
	netRounds                 int           // rounds of blackhole, reset, refuse on each network path
	longCut                   time.Duration // one more Kafka blackhole, past the producer's 30s read timeout (0: none)
	sigterms                  int
	leaderKills               int
	rate                      int           // events/s the writer aims at at most: windows stretch to fit
	deliver                   time.Duration // bound on the relay catching up at the end
	clusterRounds             int           // the cluster scenario: each cluster fault this many times
	clusterEvents             int           // the cluster scenario's events
}

var (
	shortScale = scale{name: "short", events: 4000, aggregates: 300, relayKills: 3, pausedKills: 2, brokerKills: 1,
		brokerPauses: 1, pgRestarts: 2, netRounds: 1, sigterms: 2, leaderKills: 1, rate: 1000, deliver: 2 * time.Minute,
		clusterRounds: 1, clusterEvents: 4000}
	longScale = scale{name: "long", events: 100_000, aggregates: 1000, relayKills: 12, pausedKills: 6, brokerKills: 3,
		brokerPauses: 3, pgRestarts: 4, netRounds: 2, longCut: 40 * time.Second, sigterms: 5, leaderKills: 6, rate: 2000,
		deliver: 10 * time.Minute, clusterRounds: 2, clusterEvents: 60_000}
)

const (
	walSenderTimeout = 5 * time.Second // for the relay's replication connection in broker_pause
	brokerPause      = 7 * time.Second // > walSenderTimeout, < the broker's 9s session timeout
	kafkaBlackhole   = 6 * time.Second
	pgBlackhole      = 8 * time.Second // > the 5s receive timeout set in net_postgres
	refuseFor        = 4 * time.Second
)

// delivery is the relay's delivery mode (OUTBOX_RELAY_DELIVERY) a scenario
// runs in. Exactly-once consumers read with read_committed.
type delivery string

const (
	atLeastOnce delivery = "at_least_once"
	exactlyOnce delivery = "exactly_once"
)

// scenario is one fault type against its own outbox and workload.
type scenario struct {
	name    string   // subtest, schema and topic name
	short   delivery // the short scale runs it in this mode only ("": both)
	cluster bool     // against the three-node cluster (cluster_test.go), not the single broker
	events  int      // events written (0: the scale's)
	faults  int
	per     time.Duration // about how long one fault takes: paces the writer
	prepare func(s *run)  // before the first relay starts: settings, proxies
	inject  func(s *run, i int)
	verify  func(s *run, res result) // scenario assertions after the delivery check
}

func scenarios() []scenario {
	return []scenario{
		// relay_kill9 runs in both modes even in the short run: the kills
		// with the broker stopped are each mode's core proof.
		{name: "relay_kill9", faults: sc.relayKills, per: 3 * time.Second, inject: killRelay, verify: verifyKills},
		{name: "broker_kill9", short: exactlyOnce, faults: sc.brokerKills, per: 10 * time.Second, inject: killBroker},
		{name: "broker_pause", short: atLeastOnce, faults: sc.brokerPauses, per: 8 * time.Second, prepare: func(s *run) {
			s.relayCfg = append(s.relayCfg,
				"OUTBOX_RELAY_POSTGRES_URL="+withOption(pgURL, "wal_sender_timeout", walSenderTimeout.String()),
				"OUTBOX_RELAY_MAX_INFLIGHT_EVENTS=200") // small: the loop blocks on backpressure during the pause
			if s.mode == exactlyOnce { // a Kafka transaction fits the in-flight limit (and holds whole 50-event transactions)
				s.relayCfg = append(s.relayCfg, "OUTBOX_RELAY_EXACTLY_ONCE_MAX_BATCH_EVENTS=100")
			}
		}, inject: pauseBroker},
		{name: "pg_restart", short: atLeastOnce, faults: sc.pgRestarts, per: 3 * time.Second, prepare: sampleWAL, inject: restartPostgres,
			verify: verifyPGRestarts},
		{name: "net_kafka", short: exactlyOnce, faults: len(kafkaCuts()), per: 5 * time.Second, prepare: func(s *run) {
			s.proxy = newProxy(s.t, "127.0.0.1:"+proxyPort, proxyTo)
			s.relayCfg = append(s.relayCfg, "OUTBOX_RELAY_KAFKA_BROKERS="+s.proxy.Addr())
		}, inject: func(s *run, i int) { cutNetwork(s, kafkaCuts()[i], false) }},
		{name: "net_postgres", short: atLeastOnce, faults: len(pgCuts()), per: 6 * time.Second, prepare: func(s *run) {
			s.proxy = newProxy(s.t, "127.0.0.1:0", "127.0.0.1:"+pgPort)
			s.relayCfg = append(s.relayCfg, "OUTBOX_RELAY_POSTGRES_URL="+withHostPort(s.t, pgURL, s.proxy.Addr()),
				"OUTBOX_RELAY_RECEIVE_TIMEOUT=5s")
		}, inject: func(s *run, i int) { cutNetwork(s, pgCuts()[i], true) }},
		{name: "sigterm", short: exactlyOnce, faults: sc.sigterms, per: 3 * time.Second, inject: sigtermRelay, verify: func(s *run, res result) {
			perStop, _ := attribute(res, s.restarts)
			s.note("duplicates per stop: %v", perStop)
			if res.Duplicates != 0 {
				s.t.Errorf("%d duplicates after SIGTERM restarts: a clean stop must republish nothing", res.Duplicates)
			}
		}},
		{name: "leader_kill9", short: exactlyOnce, faults: sc.leaderKills, per: 5 * time.Second, prepare: func(s *run) {
			s.relayCfg = append(s.relayCfg, "OUTBOX_RELAY_LEADER_LEASE_TTL=3s", "OUTBOX_RELAY_LEADER_RENEW_INTERVAL=500ms",
				"OUTBOX_RELAY_LEADER_POLL_INTERVAL=200ms")
		}, inject: killLeader, verify: verifyTakeovers},
		clusterScenario(),
	}
}

// runsIn: whether scn runs in mode. OUTBOX_CHAOS_DELIVERY picks the modes of
// every scenario; without it the long scale runs each scenario in both and
// the short one (make test) in its short mode only.
func runsIn(scn scenario, mode delivery) bool {
	switch {
	case len(deliveries) > 0:
		return slices.Contains(deliveries, mode)
	case sc.name == "short" && scn.short != "":
		return scn.short == mode
	}
	return true
}

// TestChaos runs every scenario in each delivery mode, then prints one table
// per mode and writes them to $OUTBOX_TEST_RUN_DIR/chaos-table.md.
func TestChaos(t *testing.T) {
	rows := map[delivery][]row{}
	modes := []delivery{atLeastOnce, exactlyOnce}
	for m, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			for i, scn := range scenarios() {
				if !runsIn(scn, mode) {
					continue
				}
				t.Run(scn.name, func(t *testing.T) {
					s := &run{t: t, sc: scn, mode: mode, count: map[string]*[2]int{}, net: map[string]*netStat{}}
					defer func() { rows[mode] = append(rows[mode], s.row(t.Failed())) }()
					s.execute(uint64(time.Now().UnixNano()) + uint64(10*m+i))
				})
			}
		})
	}
	var md string
	for _, mode := range modes {
		if len(rows[mode]) > 0 {
			md += fmt.Sprintf("**%s** (%s scale)\n\n%s\n", mode, sc.name, table(rows[mode]))
		}
		if len(clusterRows[mode]) > 0 {
			md += fmt.Sprintf("**%s**, cluster faults one by one (three-node KRaft, replication factor 3, min.insync.replicas 2)\n\n%s\n",
				mode, faultTable(clusterRows[mode]))
		}
	}
	fmt.Printf("\n%s\n", md)
	path := filepath.Join(runDir, "chaos-table.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		t.Errorf("write %s: %v", path, err)
	}
}

// --- one scenario run --------------------------------------------------------

type run struct {
	t        *testing.T
	sc       scenario
	mode     delivery
	e        *env
	w        *writer
	r        *relay   // the current relay process (the leader)
	standby  *relay   // leader_kill9: the relay waiting for the lease
	relayCfg []string // relay settings beyond the base config
	proxy    *proxy.Proxy

	kinds    []string           // fault kinds, in order of first use
	count    map[string]*[2]int // kind -> injected, landed with events in flight
	net      map[string]*netStat
	restarts []restart // relay restarts (kill -9, SIGTERM)
	notes    []string
	res      *result

	phases []*phase       // cluster: the faults, with the events written from each to the next
	recs   []record       // what the final read found
	parts  map[string]int // partitions per topic

	readPoints int // reads while no relay ran (after a kill or SIGTERM)
	partialMid int // partial PostgreSQL transactions seen at them

	wal      *walTimeline       // pg_restart: when the server wrote each WAL position
	slotBack [][2]pglogrepl.LSN // pg_restart: per restart, where the relay resumed and what it had confirmed before
}

// restart is one relay death and restart.
type restart struct {
	from pglogrepl.LSN // slot confirmed_flush_lsn once the old walsender let go: the new relay resumes here
	wal  pglogrepl.LSN // WAL end right after the death: the old relay read nothing later
}

func (s *run) execute(seed uint64) {
	t := s.t
	t.Logf("%s scale: %d events over %d aggregates, %d faults, seed %d", sc.name, s.total(), sc.aggregates, s.sc.faults, seed)
	t.Logf("delivery %s", s.mode)
	if s.sc.cluster {
		s.e = newEnvOn(t, s.sc.name, s.mode, ensureCluster(t), 3)
	} else {
		s.e = newEnv(t, s.sc.name, s.mode)
	}
	defer s.logWarnings() // also after a failed assertion
	if s.sc.prepare != nil {
		s.sc.prepare(s)
	}
	s.r = s.e.startRelay(s.relayCfg...)
	s.w = newWriter(s.e, seed)
	start := time.Now()
	s.drive()
	events, retries := s.w.snapshot()
	t.Logf("workload and faults took %s; writer retried %d statements", time.Since(start).Round(time.Second), retries)
	recs, parts := s.e.consume(t, sc.deliver)
	res := check(s.mode, events, recs, parts, s.e.Prefix)
	s.res, s.recs, s.parts = &res, recs, parts
	t.Logf("written %d, delivered %d (%d records), lost %d, duplicates %d, order violations %d, wrong partition %d, "+
		"partial transactions %d at the end and %d at %d read points",
		res.Written, res.Delivered, res.Records, res.Lost, res.Duplicates, res.OrderViolations, res.PartitionViolations,
		res.PartialTxns, s.partialMid, s.readPoints)
	if s.mode == exactlyOnce {
		if res.Duplicates != 0 {
			t.Errorf("%d duplicates (event ids %v): exactly-once delivers each event once", res.Duplicates, firstN(res.DuplicateIDs, 10))
		}
		if res.PartialTxns+s.partialMid != 0 {
			t.Errorf("partial PostgreSQL transactions visible to a read_committed consumer: %d at the end, %d at the %d read points",
				res.PartialTxns, s.partialMid, s.readPoints)
		}
	}
	s.r.alive()
	if s.sc.verify != nil {
		s.sc.verify(s, res)
	}
	if epoch := s.r.metric("outbox_relay_leader_epoch"); epoch > 0 {
		s.note("leader epoch %v at the end", epoch) // leader election: each lost lease starts a new term
	}
	if code := s.r.stop(syscall.SIGTERM, time.Minute); code != 0 {
		t.Errorf("final SIGTERM: exit code %d, want 0", code)
	}
	for tp, n := range parts {
		if n < 2 {
			t.Errorf("topic %s has %d partition(s): the partition check needs several", tp, n)
		}
	}
	for _, tp := range s.e.topics() {
		if parts[tp] == 0 {
			t.Errorf("topic %s is missing (found %v)", tp, parts)
		}
	}
	var poisoned int
	if err := s.e.DB.QueryRow(context.Background(), "SELECT count(*) FROM "+s.e.Table+
		" WHERE attempt_count > 0 OR last_error IS NOT NULL").Scan(&poisoned); err != nil || poisoned > 0 {
		t.Errorf("%d outbox rows marked as failed (poison) by the relay, %v: a transient fault must be retried, not dead-lettered", poisoned, err)
	}
	if res.Lost != 0 || res.OrderViolations != 0 || res.PartitionViolations != 0 || len(res.Problems) > 0 {
		t.Errorf("delivery check failed:\n  %s", strings.Join(res.Problems, "\n  "))
	}
	inFlight := 0
	for _, c := range s.count {
		inFlight += c[1]
	}
	if inFlight == 0 {
		t.Error("no fault landed while events were in flight: the scenario proves nothing")
	}
}

// drive runs the writer and injects fault i once the writer has written
// about (i+1)/(faults+1) of the events. The writer may not pass the middle
// of the next segment before the fault started, so however long faults take,
// each lands mid-workload and events are written after the last.
func (s *run) drive() {
	t := s.t
	total, n := s.total(), s.sc.faults
	seg := total / (n + 1)
	s.w.limit.Store(int64(seg + seg/2))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	window := max(time.Duration(n+1)*s.sc.per, time.Duration(total/sc.rate)*time.Second)
	go func() { errc <- s.w.run(ctx, total, sc.aggregates, window) }()
	for i := range n {
		at := int64(seg*(i+1) + rand.IntN(seg/4+1))
		waitFor(t, 5*time.Minute, fmt.Sprintf("the writer to reach event %d", at), func() bool {
			select {
			case err := <-errc:
				t.Fatalf("writer stopped before fault %d: %v", i, err)
			default:
			}
			return s.w.Count() >= at
		})
		if i == n-1 {
			s.w.limit.Store(int64(total))
		} else {
			s.w.limit.Store(int64(seg*(i+2) + seg/2))
		}
		if s.w.Count() >= int64(total) {
			t.Fatal("the workload ended before the last fault: the scenario proves nothing")
		}
		s.sc.inject(s, i)
		s.r.alive()
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
	case <-time.After(10 * time.Minute):
		t.Fatal("the writer did not finish within 10 minutes")
	}
}

// fault records one injected fault of kind, counting it as landed in flight
// if the relay holds unacked events or the slot has not confirmed the last
// event transaction.
func (s *run) fault(kind string) (landed bool) {
	c, ok := s.count[kind]
	if !ok {
		c = new([2]int)
		s.count[kind] = c
		s.kinds = append(s.kinds, kind)
	}
	c[0]++
	// The slot confirms within ~100 ms of the ack, so a fault injected at
	// a random instant often falls between transactions. Wait (bounded)
	// for events in flight, so the fault lands where it proves something.
	if waitInFlight(s) {
		c[1]++
		return true
	}
	return false
}

// inFlightNow: the relay holds unacked events, or the slot has not
// confirmed the last event transaction.
func (s *run) inFlightNow() bool {
	inflight := !s.r.exited() && s.r.metric("outbox_relay_inflight_events") > 0
	last := s.w.last()
	return inflight || (last > 0 && s.e.confirmed(s.t) <= last)
}

// relayGone records a relay death: it waits for the walsender to let go
// (its last status update is then in the slot) and notes where the next
// relay resumes.
func (s *run) relayGone() {
	wal, err := s.e.lsn("SELECT pg_current_wal_lsn()::text")
	if err != nil {
		s.t.Fatal(err)
	}
	waitFor(s.t, 30*time.Second, "the walsender to release the slot", func() bool { return s.e.walsender(s.t) == 0 })
	s.restarts = append(s.restarts, restart{from: s.e.confirmed(s.t), wal: wal})
}

// total is the scenario's number of events.
func (s *run) total() int {
	if s.sc.events > 0 {
		return s.sc.events
	}
	return sc.events
}

func (s *run) note(format string, a ...any) { s.notes = append(s.notes, fmt.Sprintf(format, a...)) }

// --- scenarios ---------------------------------------------------------------

// killRelay: kill -9 at a random moment; every other kill with the broker
// stopped, after the relay has read events it cannot get acked, so a relay
// that confirmed before the ack would lose them.
func killRelay(s *run, i int) {
	t := s.t
	if i%2 == 0 && i/2 < sc.pausedKills {
		svc(t, "kafka-pause")
		paused := true
		defer func() {
			if paused {
				svc(t, "kafka-resume")
			}
		}()
		waitFor(t, 30*time.Second, "events read but unacked while the broker is stopped", func() bool {
			return s.r.metric("outbox_relay_inflight_events") > 0
		})
		sleepJitter(500 * time.Millisecond)
		s.fault("relay kill -9, broker stopped")
		s.r.stop(syscall.SIGKILL, 10*time.Second)
		s.relayGone()
		svc(t, "kafka-resume")
		paused = false
	} else {
		sleepJitter(time.Second)
		s.fault("relay kill -9")
		s.r.stop(syscall.SIGKILL, 10*time.Second)
		s.relayGone()
	}
	s.readPoint()
	s.r = s.e.startRelay(s.relayCfg...)
}

// verifyKills charges each duplicate to the kills that caused it and fails
// on one no kill explains (the event was confirmed before every kill after
// its commit).
func verifyKills(s *run, res result) {
	perKill, unexplained := attribute(res, s.restarts)
	s.note("duplicates per kill: %v", perKill)
	if unexplained > 0 {
		s.t.Errorf("%d duplicates of events the slot had confirmed before every later kill: only unconfirmed events may be resent", unexplained)
	}
	if c := s.count["relay kill -9, broker stopped"]; c == nil || c[1] < sc.pausedKills {
		s.t.Errorf("kills with the broker stopped and events in flight: %v, want %d", c, sc.pausedKills)
	}
}

// attribute charges the extra copies of each duplicated event (commit LSN
// L) to the latest restarts that could have resent it: those whose resume
// point is at or before L and that happened after L was committed. The
// relays that published an event are consecutive, so its n extra copies
// come from the last n such restarts. Copies beyond the candidates are
// unexplained.
func attribute(res result, restarts []restart) (perKill []int, unexplained int) {
	perKill = make([]int, len(restarts))
	for id, extra := range res.Extra {
		l := res.CommitLSN[id]
		var cands []int
		for k, r := range restarts {
			if r.from <= l && l < r.wal {
				cands = append(cands, k)
			}
		}
		if extra > len(cands) {
			unexplained += extra - len(cands)
			extra = len(cands)
		}
		for _, k := range cands[len(cands)-extra:] {
			perKill[k]++
		}
	}
	return perKill, unexplained
}

func killBroker(s *run, _ int) {
	t := s.t
	const kind = "broker kill -9, restart"
	landed := s.fault(kind)
	svc(t, "kafka-kill")
	started := false
	defer func() {
		if !started {
			svc(t, "kafka-start")
		}
	}()
	time.Sleep(2 * time.Second)
	// The writer went on while the broker was down: what it wrote since is
	// unacked now, so the outage did land under load even if the instant
	// before the kill happened to be quiet.
	if !landed && s.inFlightNow() {
		s.count[kind][1]++
	}
	svc(t, "kafka-start")
	started = true
	s.e.waitStreaming(s.r, 3*time.Minute, 0)
}

// pauseBroker stops the broker longer than wal_sender_timeout while the
// relay is blocked on its in-flight limit: the replication connection must
// survive, because status updates keep flowing.
func pauseBroker(s *run, i int) {
	t := s.t
	pid := s.e.walsender(t)
	reconnects := s.r.metric("outbox_relay_replication_reconnects_total")
	if pid == 0 || reconnects < 0 {
		t.Fatalf("before the pause: walsender pid %d, reconnects %v", pid, reconnects)
	}
	kind := fmt.Sprintf("broker SIGSTOP %s (wal_sender_timeout %s)", brokerPause, walSenderTimeout)
	landed := s.fault(kind)
	svc(t, "kafka-pause")
	paused := true
	defer func() {
		if paused {
			svc(t, "kafka-resume")
		}
	}()
	peak := 0.0
	for end := time.Now().Add(brokerPause); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		peak = max(peak, s.r.metric("outbox_relay_inflight_events"))
	}
	// The slot now confirms within ~100 ms of the ack, so the instant before
	// SIGSTOP is often between transactions: the pause landed in flight if
	// events waited for the stopped broker during it.
	if !landed && peak > 0 {
		s.count[kind][1]++
	}
	svc(t, "kafka-resume")
	paused = false
	s.e.waitStreaming(s.r, 2*time.Minute, 0)
	if got := s.e.walsender(t); got != pid {
		t.Errorf("pause %d: walsender pid %d -> %d: the replication connection was dropped", i+1, pid, got)
	}
	if got := s.r.metric("outbox_relay_replication_reconnects_total"); got != reconnects {
		t.Errorf("pause %d: outbox_relay_replication_reconnects_total %v -> %v", i+1, reconnects, got)
	}
	// Transactions enter whole (up to 50 events here), so a blocked loop
	// sits within one transaction of the limit. Exactly-once blocks sooner:
	// while one Kafka transaction waits for its commit the loop fills the
	// next (exactly_once.max_batch_events 100) and stops there.
	floor := 200.0 - 50
	if s.mode == exactlyOnce {
		floor = 100 - 1
	}
	if peak <= floor {
		t.Errorf("pause %d: in-flight peaked at %v, not above %v: the loop never blocked, so the pause proves less", i+1, peak, floor)
	}
	s.note("pause %d: walsender pid %d -> %d, reconnects %v -> %v, in-flight peak %v/200", i+1, pid, s.e.walsender(t),
		reconnects, s.r.metric("outbox_relay_replication_reconnects_total"), peak)
}

// maxSlotBack bounds how far back (in time the server took to write the
// WAL between them) a PostgreSQL restart may put the slot's confirmed
// position behind what the relay had confirmed. Before 17 the server writes
// a logical slot's confirmed_flush_lsn to disk only when a confirmation also
// moves restart_lsn or catalog_xmin (17 also writes it at a clean shutdown;
// a crash loses it on every version), so the relay makes that happen about
// every replication.SlotSaveInterval (1 s; measured 0 to 0.6 s back); the
// rest is margin for its next confirmation under load. Without that a
// restart put the slot back to its last write, seconds or minutes back (to
// its creation in the short run), and every event since was published again.
const maxSlotBack = 2500 * time.Millisecond

// restartPostgres: the same relay process must come back streaming on a new
// walsender by itself, and the slot may go back by at most maxSlotBack of
// what the relay had confirmed (the events after it are published again).
func restartPostgres(s *run, i int) {
	t := s.t
	mode := []string{"fast", "immediate"}[i%2]
	pid := s.e.walsender(t)
	s.fault("postgres restart -m " + mode)
	before := s.e.confirmed(t) // the relay's last confirmation, as the server holds it in memory
	at := time.Now()
	svc(t, "pg-restart", mode)
	s.e.DB.Reset() // pooled connections died with the server
	start := time.Now()
	s.e.waitStreaming(s.r, 90*time.Second, pid)
	from := s.resumedFrom(at)
	s.slotBack = append(s.slotBack, [2]pglogrepl.LSN{from, before})
	back := s.wal.span(from, before)
	s.note("%s: streaming again %s after the restart; confirmed %s before it, resumed at %s (%s of WAL back)", mode,
		time.Since(start).Round(100*time.Millisecond), before, from, back.Round(100*time.Millisecond))
	if back > maxSlotBack {
		t.Errorf("restart %d (%s): the slot went back from %s (confirmed before the restart) to %s, %s of WAL writing, more than %s: "+
			"the server did not keep the relay's confirmations, and every event acked since is published again",
			i+1, mode, before, from, back.Round(100*time.Millisecond), maxSlotBack)
	}
}

// verifyPGRestarts splits the duplicates: those the server forgot (commit
// LSN between where the relay resumed and what it had confirmed before the
// restart) and the others (not yet confirmed at a restart: in flight, or
// acked after the last status update), which at-least-once resends anyway.
func verifyPGRestarts(s *run, res result) {
	forgot := make([]int, len(s.slotBack))
	total, charged := 0, 0
	for id, extra := range res.Extra {
		total += extra
		l := res.CommitLSN[id]
		var cands []int
		for i, b := range s.slotBack {
			if b[0] <= l && l < b[1] {
				cands = append(cands, i)
			}
		}
		n := min(extra, len(cands)) // the latest restarts that could have resent it
		for _, i := range cands[len(cands)-n:] {
			forgot[i]++
		}
		charged += n
	}
	s.note("duplicates of events confirmed before a restart and forgotten by the server, per restart: %v; not yet confirmed at a restart: %d",
		forgot, total-charged)
	// The same process on the same history: the relay skips what it had
	// acked, verified by the stream (relay/resume.go), whatever the server
	// forgot of its confirmations.
	for i, n := range forgot {
		if n > 0 {
			s.t.Errorf("restart %d: %d events the relay had confirmed were published again after the server forgot the confirmation; on the same history the relay resumes from its own position (outbox_relay_resume_skipped_events_total)", i+1, n)
		}
	}
}

// walSample is the server's WAL end at a moment.
type walSample struct {
	at  time.Time
	lsn pglogrepl.LSN
}

// walTimeline samples pg_current_wal_lsn() every 20 ms, so a WAL position
// can be given the time the server wrote it.
type walTimeline struct {
	mu      sync.Mutex
	samples []walSample
}

// sampleWAL starts the scenario's WAL timeline (until the test ends).
func sampleWAL(s *run) {
	w := &walTimeline{}
	s.wal = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	s.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if l, err := s.e.lsn("SELECT pg_current_wal_lsn()::text"); err == nil { // fails while the server restarts
				w.mu.Lock()
				w.samples = append(w.samples, walSample{time.Now(), l})
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// written is when the WAL first reached l: the first sample at or past it
// (the first sample for a position before the timeline began).
func (w *walTimeline) written(l pglogrepl.LSN) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.samples {
		if x.lsn >= l {
			return x.at
		}
	}
	return time.Now()
}

// span is how long the server took to write the WAL from from to to (0
// when from is not before to).
func (w *walTimeline) span(from, to pglogrepl.LSN) time.Duration {
	if from >= to {
		return 0
	}
	return w.written(to).Sub(w.written(from))
}

// resumedFrom is the position of the current relay's first replication
// session started after since ("replication started" in its log).
func (s *run) resumedFrom(since time.Time) pglogrepl.LSN {
	path := filepath.Join(runDir, "chaos-relay-logs", fmt.Sprintf("%s-%d.log", s.e.Slot, s.e.logs))
	f, err := os.Open(path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			Message, LSN string
			Time         time.Time
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "replication started" && l.Time.After(since) {
			lsn, err := pglogrepl.ParseLSN(l.LSN)
			if err != nil {
				s.t.Fatalf("%s: replication started at %q: %v", path, l.LSN, err)
			}
			return lsn
		}
	}
	s.t.Fatalf("%s: no replication session started after %s", path, since.Format(time.RFC3339Nano))
	return 0
}

// netCut is one network fault on a proxied path, healed after hold.
type netCut struct {
	name string
	hold time.Duration
	cut  func(p *proxy.Proxy) error
}

func cuts(blackhole time.Duration, rounds int, extra ...netCut) []netCut {
	var out []netCut
	for range rounds {
		out = append(out,
			netCut{"blackhole " + blackhole.String(), blackhole, func(p *proxy.Proxy) error { p.Blackhole(); return nil }},
			netCut{"reset", 0, func(p *proxy.Proxy) error { p.Reset(); return nil }},
			// Refuse first: a client reconnecting between the two would survive.
			netCut{"refuse+reset " + refuseFor.String(), refuseFor, func(p *proxy.Proxy) error { err := p.Refuse(); p.Reset(); return err }})
	}
	return append(out, extra...)
}

func kafkaCuts() []netCut {
	if sc.longCut == 0 {
		return cuts(kafkaBlackhole, sc.netRounds)
	}
	return cuts(kafkaBlackhole, sc.netRounds, netCut{"blackhole " + sc.longCut.String(), sc.longCut,
		func(p *proxy.Proxy) error { p.Blackhole(); return nil }})
}

func pgCuts() []netCut { return cuts(pgBlackhole, sc.netRounds) }

// netStat sums what the relay showed under one kind of network cut.
type netStat struct {
	n, unready, detected int     // cuts; readiness false during the cut; dialed anew before heal
	errors               float64 // publish errors, summed
	slowest              time.Duration
}

// cutNetwork applies c to the scenario's proxy, holds, heals and waits for
// the relay to be ready again. On the PostgreSQL path the relay must replace
// its replication connection by itself, a blackholed one within the receive
// timeout; on the Kafka path nothing may be acked while the path is cut
// (else the cut missed the relay's traffic).
func cutNetwork(s *run, c netCut, replication bool) {
	t := s.t
	path, progress := "relay<->kafka ", "outbox_relay_events_published_total"
	if replication {
		path, progress = "relay<->postgres ", "outbox_relay_received_lsn"
	}
	kind := path + c.name
	conns := s.proxy.Stats()
	if conns.Active == 0 {
		t.Fatalf("%s: no relay connection goes through the proxy (%+v): the cut would miss it", kind, conns)
	}
	pid := s.e.walsender(t)
	reconnects := s.r.metric("outbox_relay_replication_reconnects_total") // per leadership term: a hint only
	errs := s.r.metric("outbox_relay_publish_errors_total")
	s.fault(kind)
	if err := c.cut(s.proxy); err != nil {
		t.Fatal(err)
	}
	st := s.net[kind]
	if st == nil {
		st = &netStat{}
		s.net[kind] = st
	}
	st.n++
	unready, detected := false, false
	before := -1.0
	for start := time.Now(); time.Since(start) < c.hold; time.Sleep(200 * time.Millisecond) {
		unready = unready || !s.r.ready()
		// A relay that gave up on a connection dials a new one.
		detected = detected || s.proxy.Stats().Accepted > conns.Accepted ||
			s.r.metric("outbox_relay_replication_reconnects_total") > reconnects
		if before < 0 && time.Since(start) > time.Second { // acks already on their way may land
			before = s.r.metric(progress)
		}
	}
	if after := s.r.metric(progress); !replication && before >= 0 && after != before {
		t.Errorf("%s: %v events acked while the path was cut: the relay's Kafka traffic bypasses the proxy", kind, after-before)
	}
	if err := s.proxy.Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	if replication {
		s.e.waitStreaming(s.r, 3*time.Minute, pid) // a new replication session
	} else {
		s.e.waitStreaming(s.r, 3*time.Minute, 0)
	}
	st.slowest = max(st.slowest, time.Since(healed))
	st.errors += max(0, s.r.metric("outbox_relay_publish_errors_total")-errs)
	if unready {
		st.unready++
	}
	if detected {
		st.detected++
	}
	if replication && strings.HasPrefix(c.name, "blackhole") && !detected {
		t.Errorf("%s: the relay did not give up on the silent connection within %s (receive timeout 5s)", kind, c.hold)
	}
}

// sigtermRelay stops the relay cleanly mid-load and starts the next one;
// every other stop lands in a write burst, with the relay behind the server.
// The relay logs the position of its final status update; the slot must
// hold exactly that afterwards, or the next relay republishes the gap.
func sigtermRelay(s *run, i int) {
	kind := "SIGTERM, restart"
	if i%2 == 1 {
		kind = "SIGTERM in a write burst, restart"
		from := s.w.Count()
		s.w.burst.Store(true)
		defer s.w.burst.Store(false)
		start := time.Now()
		waitFor(s.t, time.Minute, "a write burst", func() bool { return s.w.Count()-from >= int64(sc.events/(4*sc.sigterms)) })
		s.t.Logf("burst: %d events in %s", s.w.Count()-from, time.Since(start).Round(time.Millisecond))
	}
	s.fault(kind)
	start := time.Now()
	if code := s.r.stop(syscall.SIGTERM, time.Minute); code != 0 {
		s.t.Errorf("SIGTERM %d: exit code %d, want 0", i+1, code)
	}
	took := time.Since(start).Round(10 * time.Millisecond)
	s.relayGone()
	final, slot := s.r.logLSN("final status update sent"), s.restarts[len(s.restarts)-1].from
	if final != 0 && slot < final {
		s.note("stop %d (%s): final status update %s NOT applied, slot stayed at %s", i+1, took, final, slot)
	} else {
		s.note("stop %d (%s): slot at the final status update %s", i+1, took, final)
	}
	s.readPoint()
	s.r = s.e.startRelay(s.relayCfg...)
}

// killLeader: kill -9 of the leader while a standby waits for the lease
// (TTL 3 s); the standby must take over and stream, and the killed one comes
// back as the next standby.
func killLeader(s *run, i int) {
	if s.standby == nil {
		s.standby = s.e.startStandby(s.relayCfg...)
	}
	sleepJitter(time.Second)
	s.fault("leader kill -9, standby takes over")
	s.r.stop(syscall.SIGKILL, 10*time.Second)
	killed := time.Now()
	s.relayGone()
	s.r, s.standby = s.standby, nil
	s.e.waitStreaming(s.r, 90*time.Second, 0)
	s.note("takeover %d: the standby streamed %s after the kill", i+1, time.Since(killed).Round(100*time.Millisecond))
	s.standby = s.e.startStandby(s.relayCfg...)
}

// verifyTakeovers: as verifyKills, every duplicate explained by a takeover
// (at-least-once resends only what the slot had not confirmed); the standby
// left at the end stops cleanly.
func verifyTakeovers(s *run, res result) {
	perKill, unexplained := attribute(res, s.restarts)
	s.note("duplicates per takeover: %v", perKill)
	if unexplained > 0 {
		s.t.Errorf("%d duplicates of events the slot had confirmed before every later takeover: only unconfirmed events may be resent", unexplained)
	}
	if s.standby != nil {
		if code := s.standby.stop(syscall.SIGTERM, time.Minute); code != 0 {
			s.t.Errorf("standby SIGTERM: exit code %d, want 0", code)
		}
	}
}

// readPoint reads every topic now, while no relay runs (after a kill or a
// SIGTERM, before the next relay starts), and counts the writer's
// PostgreSQL transactions visible in part or out of commit order
// (testkit.PartialTxns). Exactly-once: a commit the killed relay sent just
// before it died may still be writing its transaction markers, so a
// transaction counts only if it is still partial 5 s later (nothing can
// complete it then: no relay runs). At-least-once promises no such thing:
// its figure is shown, not asserted.
func (s *run) readPoint() {
	partial := func() (int, []string) {
		recs, _ := s.e.read(s.t)
		return testkit.PartialTxns(s.w.Events(), recs) // events after the read: every visible one is in it
	}
	n, probs := partial()
	if n > 0 && s.mode == exactlyOnce {
		_ = testkit.Poll(5*time.Second, 500*time.Millisecond, func() (bool, error) {
			n, probs = partial()
			return n == 0, nil
		})
	}
	s.readPoints++
	s.partialMid += n
	if n > 0 {
		s.t.Logf("read point %d: %d partial transaction(s): %s", s.readPoints, n, strings.Join(probs, "; "))
	}
}

func firstN[T any](xs []T, n int) []T { return xs[:min(n, len(xs))] }

func newProxy(t *testing.T, listen, target string) *proxy.Proxy {
	t.Helper()
	p, err := proxy.New(listen, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// logWarnings logs the distinct warn/error messages of the scenario's relay
// logs (what the relay said about the faults) and fails on a data race the
// race detector reported: a killed relay has no exit code to show it.
func (s *run) logWarnings() {
	counts := map[string]int{}
	for n := 1; n <= s.e.logs; n++ {
		path := filepath.Join(runDir, "chaos-relay-logs", fmt.Sprintf("%s-%d.log", s.e.Slot, n))
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		var all strings.Builder
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l struct{ Level, Message, Error string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && (l.Level == "warn" || l.Level == "error") {
				counts[l.Level+": "+l.Message]++
			} else {
				all.Write(sc.Bytes())
				all.WriteByte('\n')
			}
		}
		f.Close()
		unknown, known, refs := testkit.Races(all.String())
		if unknown > 0 {
			s.t.Errorf("the relay's race detector reported %d data race(s): %s", unknown, path)
			s.note("%d DATA RACE(s) in %s", unknown, filepath.Base(path))
		}
		if known > 0 {
			s.t.Logf("the relay's race detector reported %d known data race(s) of a dependency (%s): %s", known, strings.Join(refs, ", "), path)
			s.note("%d known DATA RACE(s) of a dependency (%s) in %s", known, strings.Join(refs, ", "), filepath.Base(path))
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s.t.Logf("relay log: %dx %s", counts[k], k)
	}
}

// --- the table ---------------------------------------------------------------

type row struct {
	scenario, faults   string
	injected, inFlight int
	res                *result
	partialMid         int
	notes              string
	failed             bool
}

func (s *run) row(failed bool) row {
	r := row{scenario: s.sc.name, res: s.res, partialMid: s.partialMid, failed: failed}
	var fs []string
	notes := s.notes
	if s.readPoints > 0 {
		notes = append(notes, fmt.Sprintf("partial transactions at %d read points with no relay running: %d", s.readPoints, s.partialMid))
	}
	for _, k := range s.kinds {
		c := s.count[k]
		r.injected += c[0]
		r.inFlight += c[1]
		fs = append(fs, fmt.Sprintf("%s ×%d", k, c[0]))
		if st := s.net[k]; st != nil {
			notes = append(notes, fmt.Sprintf("%s: not ready during %d/%d, dialed anew before heal %d/%d, publish errors +%v, streaming again within %s of heal",
				strings.TrimPrefix(strings.TrimPrefix(k, "relay<->kafka "), "relay<->postgres "), st.unready, st.n, st.detected, st.n,
				st.errors, st.slowest.Round(100*time.Millisecond)))
		}
	}
	r.faults = strings.Join(fs, ", ")
	r.notes = strings.Join(notes, "; ")
	return r
}

func table(rows []row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| scenario | faults | injected | in flight | written | delivered | lost | duplicates | order violations | wrong partition | partial txns | result | notes |\n")
	fmt.Fprintf(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		nums := "- | - | - | - | - | - | -"
		if r.res != nil {
			nums = fmt.Sprintf("%d | %d | %d | %d | %d | %d | %d", r.res.Written, r.res.Delivered, r.res.Lost, r.res.Duplicates,
				r.res.OrderViolations, r.res.PartitionViolations, r.res.PartialTxns+r.partialMid)
		}
		verdict := "pass"
		if r.failed {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s | %s |\n", r.scenario, r.faults, r.injected, r.inFlight, nums, verdict,
			strings.ReplaceAll(r.notes, "|", "/"))
	}
	return b.String()
}

// waitInFlight polls, for up to 3 s, until the relay holds events in flight.
func waitInFlight(s *run) bool {
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // polling, bounded
		if s.inFlightNow() {
			return true
		}
	}
	return false
}
