//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/outboxschema"
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
	a := r.roleAnswer()
	return a.role, a.epoch
}

// roleAnswer is one relay's /role answer. A relay computes it at some
// instant between sent and got (on the sampler's clock): answers to one
// sample come from different instants, so a relay killed just after
// answering "leader" and its successor taking over before answering both
// say leader in one sample, one after the other.
type roleAnswer struct {
	pid       int    // the process asked
	instance  string // what it says it is
	role      string // "" when it did not answer; "exited" when the process had exited
	epoch     int64
	sent, got time.Duration
}

func (r *relay) roleAnswer() roleAnswer {
	a := roleAnswer{pid: r.PID()}
	resp, err := roleClient.Get("http://" + r.Metrics + "/role")
	if err != nil {
		return a
	}
	defer resp.Body.Close()
	var st struct {
		Role     string `json:"role"`
		Instance string `json:"instance"`
		Epoch    int64  `json:"epoch"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return a
	}
	a.role, a.instance, a.epoch = st.Role, st.Instance, st.Epoch
	return a
}

// roleSample is one round of the sampler: every relay's answer, and the
// lease row and the slot's walsender read meanwhile.
type roleSample struct {
	n       int
	answers []roleAnswer
	row     leaseRead
}

// leaseRead is the lease row and the slot's walsender as read between sent
// and got; err when the read failed.
type leaseRead struct {
	holder    string
	epoch     int64
	renewed   string // age of renewed_at
	walsender int32  // 0: none
	dbNow     time.Time
	sent, got time.Duration
	err       error
}

func (s roleSample) String() string {
	var b strings.Builder
	r := s.row
	fmt.Fprintf(&b, "#%d", s.n)
	if r.err != nil {
		fmt.Fprintf(&b, " row unread (%v)", r.err)
	} else {
		fmt.Fprintf(&b, " [%s..%s] db %s row %s/e%d renewed %s ago, walsender %d", ms(r.sent), ms(r.got),
			r.dbNow.Format("15:04:05.000"), r.holder, r.epoch, r.renewed, r.walsender)
	}
	for _, a := range s.answers {
		switch a.role {
		case "exited":
			fmt.Fprintf(&b, " | pid %d exited", a.pid)
		case "":
			fmt.Fprintf(&b, " | pid %d no answer [%s..%s]", a.pid, ms(a.sent), ms(a.got))
		default:
			fmt.Fprintf(&b, " | %s pid %d %s e%d [%s..%s]", a.instance, a.pid, a.role, a.epoch, ms(a.sent), ms(a.got))
		}
	}
	return b.String()
}

// ms formats a sampler time in seconds with milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// sampler asks every relay's /role and reads the lease row every 100 ms,
// logs every sample (instance, pid, role, epoch, when) to a file next to the
// relay logs, and checks what the samples prove: see overlaps.
type sampler struct {
	mu      sync.Mutex
	relays  []*relay
	samples []roleSample
	start   time.Time
	path    string // the sample log
	notes   chan string
	stop    chan struct{}
	done    chan struct{}
}

func (e *env) watch(relays ...*relay) *sampler {
	s := &sampler{relays: relays, start: time.Now(), notes: make(chan string, 16), stop: make(chan struct{}), done: make(chan struct{}),
		path: filepath.Join(logDir, fmt.Sprintf("%s-%s-samples.log", strings.ReplaceAll(e.t.Name(), "/", "_"), e.Slot))}
	f, err := os.Create(s.path)
	if err != nil {
		e.t.Fatal(err)
	}
	fmt.Fprintf(f, "sampler started %s; times are seconds since then; an answer was computed between its [sent..got]\n",
		s.start.Format(time.RFC3339Nano))
	lease := e.Schema + "." + outboxschema.LeaseTable
	go func() {
		defer close(s.done)
		defer f.Close()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for n := 1; ; n++ {
			select {
			case <-s.stop:
				return
			case note := <-s.notes:
				fmt.Fprintln(f, note)
				n--
				continue
			case <-t.C:
			}
			s.mu.Lock()
			rs := slices.Clone(s.relays)
			s.mu.Unlock()
			smp := roleSample{n: n, answers: make([]roleAnswer, len(rs))}
			var wg sync.WaitGroup
			for i, r := range rs {
				if !r.running() {
					// Never ask a dead relay's address: another relay may
					// listen there now, and would be counted twice.
					smp.answers[i] = roleAnswer{pid: r.PID(), role: "exited"}
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					sent := time.Since(s.start)
					a := r.roleAnswer()
					a.sent, a.got = sent, time.Since(s.start)
					smp.answers[i] = a
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				smp.row = s.readLease(e, lease)
			}()
			wg.Wait()
			fmt.Fprintln(f, smp)
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sampler) readLease(e *env, lease string) leaseRead {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r := leaseRead{sent: time.Since(s.start)}
	var holder *string
	var epoch *int64
	var renewed *time.Duration
	var sender *int32
	r.err = e.DB.QueryRow(ctx, `SELECT now(), s.active_pid, l.holder, l.epoch,
			CASE WHEN isfinite(l.renewed_at) THEN now() - l.renewed_at END
		FROM pg_replication_slots s LEFT JOIN `+lease+` l ON l.slot_name = s.slot_name
		WHERE s.slot_name = $1`, e.Slot).Scan(&r.dbNow, &sender, &holder, &epoch, &renewed)
	r.got = time.Since(s.start)
	if holder != nil {
		r.holder, r.epoch = *holder, *epoch
	}
	r.renewed = "never"
	if renewed != nil {
		r.renewed = renewed.Round(time.Millisecond).String()
	}
	if sender != nil {
		r.walsender = *sender
	}
	return r
}

// note puts what the test did (a kill, a stop) into the sample log, timed
// like the samples.
func (s *sampler) note(format string, args ...any) {
	now := time.Now()
	s.notes <- fmt.Sprintf("-- %s (%s): %s", ms(now.Sub(s.start)), now.UTC().Format("15:04:05.000000"), fmt.Sprintf(format, args...))
}

func (s *sampler) add(r *relay) {
	s.mu.Lock()
	s.relays = append(s.relays, r)
	s.mu.Unlock()
}

// overlaps returns what the samples prove about two leaders: an epoch two
// processes said they led, a relay that said it led an epoch after another
// had said it led a newer one, or after the lease row had a newer one. Two
// "leader" answers in one sample prove nothing by themselves: they were
// computed at different instants (see roleAnswer).
func overlaps(samples []roleSample) []string {
	type claim struct {
		a roleAnswer
		n int
	}
	var claims []claim
	var rows []roleSample
	for _, smp := range samples {
		for _, a := range smp.answers {
			if a.role == "leader" {
				claims = append(claims, claim{a, smp.n})
			}
		}
		if smp.row.err == nil {
			rows = append(rows, smp)
		}
	}
	var found []string
	holder := map[int64]claim{}
	for _, c := range claims {
		if h, ok := holder[c.a.epoch]; ok && h.a.pid != c.a.pid {
			found = append(found, fmt.Sprintf("epoch %d led by pid %d (sample #%d) and pid %d (sample #%d)", c.a.epoch, h.a.pid, h.n, c.a.pid, c.n))
		} else if !ok {
			holder[c.a.epoch] = c
		}
	}
	for _, old := range claims {
		// The first proof is enough for each claim.
		for _, newer := range claims {
			if newer.a.epoch > old.a.epoch && newer.a.pid != old.a.pid && newer.a.got < old.a.sent {
				found = append(found, fmt.Sprintf("pid %d said leader of epoch %d (sample #%d, from %s) after pid %d had said leader of epoch %d (sample #%d, by %s)",
					old.a.pid, old.a.epoch, old.n, ms(old.a.sent), newer.a.pid, newer.a.epoch, newer.n, ms(newer.a.got)))
				break
			}
		}
		for _, r := range rows {
			if r.row.epoch > old.a.epoch && r.row.got < old.a.sent {
				found = append(found, fmt.Sprintf("pid %d said leader of epoch %d (sample #%d, from %s) after the lease row had epoch %d (sample #%d, by %s)",
					old.a.pid, old.a.epoch, old.n, ms(old.a.sent), r.row.epoch, r.n, ms(r.row.got)))
				break
			}
		}
	}
	return found
}

func (s *sampler) finish(t *testing.T) (answered, maxLeaders, notOne int) {
	t.Helper()
	close(s.stop)
	<-s.done
	var unanswered int
	for _, smp := range s.samples {
		leaders, silent := 0, 0
		for _, a := range smp.answers {
			switch a.role {
			case "leader":
				leaders++
			case "":
				silent++
			}
		}
		senders := 0 // PostgreSQL allows one walsender per slot: active_pid is it
		if smp.row.walsender != 0 {
			senders = 1
		}
		if leaders > 1 {
			// Not an error by itself: overlaps judges.
			t.Logf("%d leader answers in one sample (computed at different instants): %s", leaders, smp)
		}
		maxLeaders = max(maxLeaders, leaders)
		switch {
		case silent > 0 || smp.row.err != nil:
			unanswered++
		case leaders != 1 || senders != 1:
			notOne++
		}
	}
	t.Logf("role samples: %d (%d with a relay not answering), most leader answers in one sample %d, answered samples without exactly one leader and walsender %d; every sample in %s",
		len(s.samples), unanswered, maxLeaders, notOne, s.path)
	for _, o := range overlaps(s.samples) {
		t.Errorf("two leaders: %s", o)
	}
	return len(s.samples) - unanswered, maxLeaders, notOne
}

// The sampler's judgement: two leader answers in one sample are a handover
// seen from two instants, unless the old leader answered after the new one
// (or after the row had the new epoch) had.
func TestLeaderSamplerOverlaps(t *testing.T) {
	at := func(s, g float64) (time.Duration, time.Duration) {
		return time.Duration(s * float64(time.Second)), time.Duration(g * float64(time.Second))
	}
	claim := func(pid int, role string, epoch int64, s, g float64) roleAnswer {
		a := roleAnswer{pid: pid, instance: fmt.Sprint(pid), role: role, epoch: epoch}
		a.sent, a.got = at(s, g)
		return a
	}
	row := func(epoch int64, s, g float64) leaseRead {
		r := leaseRead{holder: "x", epoch: epoch}
		r.sent, r.got = at(s, g)
		return r
	}
	tests := []struct {
		name    string
		samples []roleSample
		want    []string // in each finding, in order
	}{
		{"one leader at a time", []roleSample{
			{1, []roleAnswer{claim(1, "leader", 5, 1.0, 1.001), claim(2, "standby", 5, 1.0, 1.001)}, row(5, 1.0, 1.002)},
			{2, []roleAnswer{claim(1, "", 0, 1.1, 2.1), claim(2, "leader", 6, 1.1, 1.101)}, row(6, 1.1, 1.102)},
		}, nil},
		// The old leader answered before it was killed, its successor after
		// it took over, a slow 30 ms later: the old sampler's two leaders.
		{"killed leader and successor in one sample", []roleSample{
			{1, []roleAnswer{claim(1, "leader", 5, 1.0, 1.001), claim(2, "leader", 6, 1.0, 1.030)}, row(5, 1.0, 1.002)},
		}, nil},
		{"old leader answers after the new one did", []roleSample{
			{1, []roleAnswer{claim(1, "standby", 5, 1.0, 1.001), claim(2, "leader", 6, 1.0, 1.001)}, row(6, 1.0, 1.002)},
			{2, []roleAnswer{claim(1, "leader", 5, 1.1, 1.101), claim(2, "leader", 6, 1.1, 1.101)}, row(6, 1.1, 1.102)},
		}, []string{"pid 1 said leader of epoch 5 (sample #2, from 1.100) after pid 2 had said leader of epoch 6 (sample #1, by 1.001)",
			"pid 1 said leader of epoch 5 (sample #2, from 1.100) after the lease row had epoch 6 (sample #1, by 1.002)"}},
		{"old leader answers after the row had a newer epoch", []roleSample{
			{1, []roleAnswer{claim(1, "", 0, 1.0, 2.0)}, row(6, 1.0, 1.002)},
			{2, []roleAnswer{claim(1, "leader", 5, 1.1, 1.101)}, row(6, 1.1, 1.102)},
		}, []string{"after the lease row had epoch 6"}},
		{"one epoch, two processes", []roleSample{
			{1, []roleAnswer{claim(1, "leader", 5, 1.0, 1.001)}, row(5, 1.0, 1.002)},
			{2, []roleAnswer{claim(2, "leader", 5, 1.1, 1.101)}, row(5, 1.1, 1.102)},
		}, []string{"epoch 5 led by pid 1 (sample #1) and pid 2 (sample #2)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := overlaps(tt.samples)
			ok := len(got) == len(tt.want)
			for i := 0; ok && i < len(got); i++ {
				ok = strings.Contains(got[i], tt.want[i])
			}
			if !ok {
				t.Errorf("overlaps = %q, want findings with %q", got, tt.want)
			}
		})
	}
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
		s.note("kill -9 %s pid %d", curID, cur.PID())
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

	s.note("SIGSTOP a pid %d", a.PID())
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
	s.note("SIGCONT a pid %d", a.PID())
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

	s.note("blackhole a pid %d", a.PID())
	px.Blackhole()
	cut := time.Now()
	waitFor(t, testTTL+15*time.Second, "b leading and publishing", func() bool {
		role, _ := b.role()
		return role == "leader" && b.metric("outbox_relay_events_published_total") > 0
	})
	takeover := time.Since(cut)
	waitFor(t, 15*time.Second, "a to step down", func() bool { role, _ := a.role(); return role == "standby" })
	time.Sleep(2 * time.Second) // deliberate: the sampler watches the new term under load for a while
	s.note("heal a pid %d", a.PID())
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
	s.note("SIGTERM a pid %d", a.PID())
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
