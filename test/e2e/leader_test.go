//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/proxy"
)

// Fast leases for tests: TTL 3s, renew 500ms, standby poll 200ms.
var leaseFlags = []string{"--leader-lease-ttl", "3s", "--leader-renew-interval", "500ms", "--leader-poll-interval", "200ms"}

const testTTL = 3 * time.Second

// A stopped relay must not stall the sampler; a busy one answers within this.
var roleClient = &http.Client{Timeout: time.Second}

// role returns what /role says, or "" when the relay does not answer
// (stopped, dead, or slower than roleClient's timeout).
func (r *relay) role() (string, int64) {
	resp, err := roleClient.Get("http://" + r.Metrics + "/role")
	if err != nil {
		return "", 0
	}
	defer resp.Body.Close()
	var st struct {
		Role  string `json:"role"`
		Epoch int64  `json:"epoch"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return "", 0
	}
	return st.Role, st.Epoch
}

// sampler watches, every 100 ms, how many relays say they lead and how many
// walsenders serve the slot.
type sampler struct {
	mu         sync.Mutex
	relays     []*relay
	samples    int
	maxLeaders int
	maxSenders int
	notOne     int // answered samples without exactly one leader and one walsender
	unanswered int // samples where some relay did not answer /role
	stop       chan struct{}
	done       chan struct{}
}

func (e *env) watch(relays ...*relay) *sampler {
	s := &sampler{relays: relays, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			s.mu.Lock()
			rs := slices.Clone(s.relays)
			s.mu.Unlock()
			var (
				wg              sync.WaitGroup
				leaders, silent int
				lmu             sync.Mutex
			)
			for _, r := range rs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					role, _ := r.role()
					lmu.Lock()
					defer lmu.Unlock()
					switch role {
					case "leader":
						leaders++
					case "":
						silent++
					}
				}()
			}
			wg.Wait()
			var senders int
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := e.DB.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid
				WHERE s.slot_name = $1`, e.Slot).Scan(&senders)
			cancel()
			s.mu.Lock()
			s.samples++
			s.maxLeaders = max(s.maxLeaders, leaders)
			if err == nil {
				s.maxSenders = max(s.maxSenders, senders)
			}
			switch {
			case silent > 0 || err != nil:
				s.unanswered++
			case leaders != 1 || senders != 1:
				s.notOne++
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sampler) add(r *relay) {
	s.mu.Lock()
	s.relays = append(s.relays, r)
	s.mu.Unlock()
}

func (s *sampler) finish(t *testing.T) (answered, maxLeaders, notOne int) {
	t.Helper()
	close(s.stop)
	<-s.done
	t.Logf("role samples: %d (%d with a relay not answering), most leaders at once %d, most walsenders on the slot %d, answered samples without exactly one leader and walsender %d",
		s.samples, s.unanswered, s.maxLeaders, s.maxSenders, s.notOne)
	if s.maxLeaders > 1 {
		t.Errorf("%d instances said they were leader at the same time", s.maxLeaders)
	}
	if s.maxSenders > 1 {
		t.Errorf("%d walsenders on the slot at once", s.maxSenders)
	}
	return s.samples - s.unanswered, s.maxLeaders, s.notOne
}

func (e *env) startInstance(id string, extra ...string) *relay {
	e.t.Helper()
	return e.startRelay(append(append([]string{"--instance-id", id}, leaseFlags...), extra...)...)
}

// waitLeader waits until exactly one of rs says leader and returns it.
func waitLeader(t *testing.T, d time.Duration, rs ...*relay) *relay {
	t.Helper()
	var l *relay
	waitFor(t, d, "one leader", func() bool {
		l = nil
		n := 0
		for _, r := range rs {
			if role, _ := r.role(); role == "leader" {
				l, n = r, n+1
			}
		}
		return n == 1
	})
	return l
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1)+0.5)]
}

// Two and three instances: at every sample exactly one says leader, the
// slot has exactly one walsender, the others are ready standbys.
func TestLeaderElectionExactlyOneLeader(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) {
			e := newEnv(t, fmt.Sprintf("elect%d", n))
			var rs []*relay
			for i := 0; i < n; i++ {
				rs = append(rs, e.startInstance(fmt.Sprintf("i%d", i)))
			}
			leader := waitLeader(t, 30*time.Second, rs...)
			waitFor(t, 30*time.Second, "leader streaming", func() bool { return leader.readyStatus() == 200 })
			s := e.watch(rs...)
			w := e.newWriter(31)
			if err := w.run(context.Background(), 500, 5, 20, 4*time.Second, ""); err != nil {
				t.Fatal(err)
			}
			answered, _, notOne := s.finish(t)
			if answered < 20 || notOne != 0 {
				t.Errorf("%d of %d answered samples lacked exactly one leader and one walsender (want 0 of at least 20)", notOne, answered)
			}
			for _, r := range rs {
				role, _ := r.role()
				if r != leader && (role != "standby" || r.readyStatus() != 200) {
					t.Errorf("a non-leader says %q, ready %d; want a ready standby", role, r.readyStatus())
				}
				if got, want := r.metric("outbox_relay_leader"), map[bool]float64{true: 1, false: 0}[r == leader]; got != want {
					t.Errorf("outbox_relay_leader = %v, want %v", got, want)
				}
			}
			rs2 := consume(t, e.topics(), len(w.written()), 60*time.Second, 2*time.Second)
			requireClean(t, check(t, w.written(), rs2, e.partitions(t)), false)
		})
	}
}

// kill -9 the leader ten times under load, alternating instances: a standby
// takes over each time; nothing is lost, order holds among first
// deliveries; takeover (kill to the new leader's first publish) is timed.
func TestLeaderKill9Takeover(t *testing.T) {
	e := newEnv(t, "killlead")
	ids := []string{"a", "b"}
	rs := map[string]*relay{}
	for _, id := range ids {
		rs[id] = e.startInstance(id)
	}
	cur := waitLeader(t, 30*time.Second, rs["a"], rs["b"])
	s := e.watch(rs["a"], rs["b"])
	w := e.newWriter(41)
	stopWriter := w.background(t)

	var takeovers []time.Duration
	for k := 0; k < 10; k++ {
		waitFor(t, 30*time.Second, "leader publishing", func() bool { return cur.metric("outbox_relay_events_published_total") > 0 })
		// Let it lead for a while (1-2 status intervals), so kills land at
		// random points of real terms, not always before the first confirm.
		time.Sleep(time.Duration(1000+rand.IntN(1000)) * time.Millisecond)
		var next *relay
		var nextID, curID string
		for id, r := range rs {
			if r == cur {
				curID = id
			} else {
				next, nextID = r, id
			}
		}
		waitFor(t, 30*time.Second, "standby ready", func() bool { role, _ := next.role(); return role == "standby" && next.readyStatus() == 200 })
		killed := time.Now()
		cur.Cmd.Process.Signal(syscall.SIGKILL)
		<-cur.Done()
		waitFor(t, 30*time.Second, "new leader publishing", func() bool {
			role, _ := next.role()
			return role == "leader" && next.metric("outbox_relay_events_published_total") > 0
		})
		takeovers = append(takeovers, time.Since(killed))
		t.Logf("kill %d of leader %s: %s published first after %s", k+1, curID, nextID, takeovers[k].Round(time.Millisecond))
		rs[curID] = e.startInstance(curID)
		s.add(rs[curID])
		cur = next
	}
	stopWriter()
	s.finish(t)
	ws := w.written()
	got := consume(t, e.topics(), len(ws), 120*time.Second, 3*time.Second)
	rep := check(t, ws, got, e.partitions(t))
	requireClean(t, rep, true)
	p50, pmax := percentile(takeovers, 0.5), slices.Max(takeovers)
	t.Logf("kill -9 takeover (kill -> first publish by the new leader) over %d kills: p50 %s, max %s; %d events, %d duplicates",
		len(takeovers), p50.Round(time.Millisecond), pmax.Round(time.Millisecond), len(ws), rep.Duplicates)
	if pmax > 5*time.Second {
		t.Errorf("slowest takeover %s, want within 5s", pmax)
	}
}

// A leader stopped (SIGSTOP) for twice the TTL is fenced: a standby takes
// over within TTL + 5 s; when the old one wakes it steps down without a
// single status update; nothing is lost.
func TestLeaderStallIsFenced(t *testing.T) {
	e := newEnv(t, "stall")
	a := e.startInstance("a")
	waitLeader(t, 30*time.Second, a)
	b := e.startInstance("b")
	s := e.watch(a, b)
	w := e.newWriter(51)
	stopWriter := w.background(t)
	waitFor(t, 30*time.Second, "a publishing", func() bool { return a.metric("outbox_relay_events_published_total") > 0 })
	oldSender := e.walsenderPID(t)

	a.Cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	waitFor(t, testTTL+10*time.Second, "b leading and publishing", func() bool {
		role, _ := b.role()
		return role == "leader" && b.metric("outbox_relay_events_published_total") > 0
	})
	takeover := time.Since(stopped)
	var alive bool
	e.DB.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", oldSender).Scan(&alive)
	time.Sleep(2*testTTL - time.Since(stopped)) // the fault: a stays stopped for two lease TTLs
	logBefore := len(a.log())
	a.Cmd.Process.Signal(syscall.SIGCONT)
	waitFor(t, 15*time.Second, "a to step down", func() bool { role, _ := a.role(); return role == "standby" })
	time.Sleep(2 * time.Second) // deliberate: the sampler watches the new term under load for a while
	stopWriter()
	s.finish(t)
	after := a.log()[logBefore:]
	t.Logf("stalled leader: takeover after %s (TTL %s); old walsender %d still alive after takeover: %v", takeover.Round(time.Millisecond), testTTL, oldSender, alive)
	if takeover > testTTL+5*time.Second {
		t.Errorf("takeover after %s, want within TTL + 5s", takeover)
	}
	if alive {
		t.Error("the stalled leader's walsender survived the takeover: it was not fenced")
	}
	for _, bad := range []string{"final status update sent", `"role":"leader"`} {
		if strings.Contains(after, bad) {
			t.Errorf("after waking, the old leader logged %q:\n%s", bad, tail([]byte(after), 3000))
		}
	}
	if !strings.Contains(after, `"role":"standby"`) {
		t.Errorf("after waking, the old leader did not log its step-down:\n%s", tail([]byte(after), 3000))
	}
	ws := w.written()
	rep := check(t, ws, consume(t, e.topics(), len(ws), 120*time.Second, 3*time.Second), e.partitions(t))
	requireClean(t, rep, true)
	t.Logf("stall: %d events, %d duplicates", len(ws), rep.Duplicates)
}

// A leader cut off from PostgreSQL (every byte blackholed by a proxy) is
// replaced; when the cut heals it stays standby.
func TestLeaderCutOffFromPostgres(t *testing.T) {
	e := newEnv(t, "cut")
	px, err := proxy.New("127.0.0.1:0", pgHostPort())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	a := e.startInstance("a", "--postgres-url", replaceHostPort(pgURL, px.Addr()), "--receive-timeout", "5s")
	waitLeader(t, 30*time.Second, a)
	b := e.startInstance("b")
	s := e.watch(a, b)
	w := e.newWriter(61)
	stopWriter := w.background(t)
	waitFor(t, 30*time.Second, "a publishing", func() bool { return a.metric("outbox_relay_events_published_total") > 0 })

	px.Blackhole()
	cut := time.Now()
	waitFor(t, testTTL+15*time.Second, "b leading and publishing", func() bool {
		role, _ := b.role()
		return role == "leader" && b.metric("outbox_relay_events_published_total") > 0
	})
	takeover := time.Since(cut)
	waitFor(t, 15*time.Second, "a to step down", func() bool { role, _ := a.role(); return role == "standby" })
	time.Sleep(2 * time.Second) // deliberate: the sampler watches the new term under load for a while
	if err := px.Heal(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * testTTL); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if role, _ := a.role(); role == "leader" {
			t.Fatal("the cut-off leader took the lead back after the cut healed")
		}
	}
	stopWriter()
	s.finish(t)
	t.Logf("network cut: takeover after %s (TTL %s)", takeover.Round(time.Millisecond), testTTL)
	if takeover > testTTL+5*time.Second {
		t.Errorf("takeover after %s, want within TTL + 5s", takeover)
	}
	ws := w.written()
	rep := check(t, ws, consume(t, e.topics(), len(ws), 120*time.Second, 3*time.Second), e.partitions(t))
	requireClean(t, rep, true)
	t.Logf("network cut: %d events, %d duplicates", len(ws), rep.Duplicates)
}

// SIGTERM to the leader hands over cleanly: the standby takes over at once
// and nothing is published twice.
func TestLeaderSigtermHandsOverWithoutDuplicates(t *testing.T) {
	e := newEnv(t, "handover")
	a := e.startInstance("a")
	waitLeader(t, 30*time.Second, a)
	b := e.startInstance("b")
	s := e.watch(a, b)
	w := e.newWriter(71)
	stopWriter := w.background(t)
	waitFor(t, 30*time.Second, "a publishing", func() bool { return a.metric("outbox_relay_events_published_total") > 100 })
	term := time.Now()
	if code := a.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Errorf("leader exit code %d after SIGTERM, want 0", code)
	}
	waitFor(t, 30*time.Second, "b leading and publishing", func() bool {
		role, _ := b.role()
		return role == "leader" && b.metric("outbox_relay_events_published_total") > 0
	})
	handover := time.Since(term)
	time.Sleep(2 * time.Second) // deliberate: the sampler watches the new term under load for a while
	stopWriter()
	s.finish(t)
	ws := w.written()
	rep := check(t, ws, consume(t, e.topics(), len(ws), 120*time.Second, 3*time.Second), e.partitions(t))
	requireClean(t, rep, false)
	t.Logf("SIGTERM handover: SIGTERM -> first publish by the standby %s; %d events, 0 duplicates", handover.Round(time.Millisecond), len(ws))
}

// pgHostPort is host:port of the test PostgreSQL.
func pgHostPort() string {
	return pgURL[strings.LastIndex(pgURL, "@")+1 : strings.LastIndex(pgURL, "/")]
}

// replaceHostPort points a postgres URL at another host:port.
func replaceHostPort(url, hostPort string) string {
	return strings.Replace(url, "@"+pgHostPort()+"/", "@"+hostPort+"/", 1)
}

// background writes about 330 events/s (transactions of 1-5 events over 50
// aggregates) until the returned stop is called; stop fails the test if
// the writer failed.
func (w *writer) background(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.run(ctx, 200_000, 5, 50, 10*time.Minute, "") }()
	return func() {
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("writer: %v", err)
		}
	}
}
