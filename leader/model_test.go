package leader

import (
	"container/heap"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The lease model: two relay processes and one PostgreSQL, simulated in
// virtual time, deterministic for a seed. The processes run the elector's
// protocol (campaign, serve, renew, Check, the stream's Valid gate) with
// this package's own decisions: newLease, validAt, keepaliveIdle,
// renewVerdict, checkVerdict, fenceVerdict. The database runs the lease's
// statements as leader.go writes them: the advisory lock that ends with its
// session, the row, now() at statement start, row locks held to commit,
// pg_terminate_backend, one walsender per slot, tcp keepalives.
//
// Faults, at random: processes paused (SIGSTOP; the clock runs on, the
// kernel still answers keepalives), cut off from the database for a while
// or for good (packets held, delivered at heal if their session still
// lives), killed (FIN) and restarted, slow round trips, a slow database,
// Check abandoned by its caller (pgx closes the connection), and each
// process's monotonic clock running up to 8% fast or slow against the
// database's.
//
// What must hold: at no instant do two processes hold a valid lease (so at
// most one may publish or confirm), and confirmations reach the slot in
// epoch order, each epoch from one process.
//
// Not modelled: a PostgreSQL restart or an operator terminating a lease
// session, which free the lock without the holder knowing until its next
// round trip (its walsender goes too, so it confirms nothing; see
// docs/leader-election.md), and steps of the database's clock.

var (
	modelSeeds   = flag.Int("lease-model-seeds", 400, "schedules TestLeaseModel runs")
	modelSeed    = flag.Uint64("lease-model-seed", 0, "run TestLeaseModel on this seed only, with its trace")
	modelVariant = flag.String("lease-model-variant", "", "run TestLeaseModel on a broken variant (see variants)")
)

// variant breaks the protocol on purpose, to show the model catches it.
type variant struct {
	renewIgnoresExpiry bool // renew an expired lease: sent and extended without the local check, UPDATE without renewed_at's
	noDBExpiryCheck    bool // the renewal's UPDATE matches a row stale by the database's clock
	noRowLock          bool // the fence reads the row without FOR UPDATE
	noFenceOnConnLoss  bool // a lease connection the elector closes leaves the term valid until the next renewal
	noMargin           bool // a lease runs the whole TTL from its send
	keepaliveFloor     bool // tcp_keepalives_idle rounded down: a silent lease session is dropped before the TTL
	untilFromReply     bool // a lease runs from the reply's arrival, not the statement's send
}

// variants by name: "before" is this package before the model found what
// it fixed.
var variants = map[string]variant{
	"renew-ignores-expiry":                {renewIgnoresExpiry: true},
	"renew-ignores-expiry+fence-unlocked": {renewIgnoresExpiry: true, noRowLock: true},
	"fence-unlocked+no-db-expiry":         {noRowLock: true, noDBExpiryCheck: true},
	"no-fence-on-conn-loss":               {noFenceOnConnLoss: true},
	"no-margin":                           {noMargin: true},
	"keepalive-floor":                     {keepaliveFloor: true},
	"until-from-reply":                    {untilFromReply: true},
	"before":                              {noDBExpiryCheck: true, noRowLock: true, noFenceOnConnLoss: true, noMargin: true, keepaliveFloor: true},
}

func TestLeaseModel(t *testing.T) {
	v, ok := variants[*modelVariant]
	if *modelVariant != "" && !ok {
		t.Fatalf("no variant %q", *modelVariant)
	}
	if *modelSeed != 0 {
		m := runModel(*modelSeed, v, true)
		t.Logf("%s\n%s", m.summary(), strings.Join(m.trace, "\n"))
		if m.failed != "" {
			t.Errorf("seed %d (-lease-model-seed %d): %s", *modelSeed, *modelSeed, m.failed)
		}
		return
	}
	if seed, m := firstFailure(v, *modelSeeds); m != nil {
		t.Errorf("seed %d: %s\n%s\nlast steps:\n%s\nreplay: go test ./leader -run TestLeaseModel -lease-model-seed %d -lease-model-variant %q",
			seed, m.failed, m.summary(), strings.Join(m.tail(40), "\n"), seed, *modelVariant)
	}
}

// Each broken variant must fail on some schedule: the model can fail, and
// every layer the protocol has is needed (or, for renew-ignores-expiry,
// made redundant by the row-locked fence, which the model also shows).
func TestLeaseModelCatchesBrokenVariants(t *testing.T) {
	tests := []struct {
		name   string
		caught bool // false: another layer covers it
		seeds  int
	}{
		{"renew-ignores-expiry", false, 400}, // the row-locked fence terminates the session it would renew on
		{"renew-ignores-expiry+fence-unlocked", true, 3000},
		{"fence-unlocked+no-db-expiry", true, 3000},
		{"no-fence-on-conn-loss", true, 3000},
		{"no-margin", true, 3000},
		{"keepalive-floor", true, 3000},
		{"until-from-reply", true, 3000},
		{"before", true, 3000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			seed, m := firstFailure(variants[tt.name], tt.seeds)
			switch {
			case tt.caught && m == nil:
				t.Errorf("no schedule of %d caught variant %s", tt.seeds, tt.name)
			case !tt.caught && m != nil:
				t.Errorf("variant %s failed on seed %d: %s", tt.name, seed, m.failed)
			case m != nil:
				t.Logf("caught on seed %d: %s", seed, m.failed)
			}
		})
	}
}

// firstFailure runs seeds 1..n and returns the first that fails.
func firstFailure(v variant, n int) (uint64, *model) {
	for seed := uint64(1); seed <= uint64(n); seed++ {
		if m := runModel(seed, v, false); m.failed != "" {
			return seed, runModel(seed, v, true)
		}
	}
	return 0, nil
}

// --- the simulation ----------------------------------------------------------

const forever = time.Duration(math.MaxInt64)

type event struct {
	at  time.Duration
	seq int
	fn  func()
}

type events []*event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type model struct {
	rng     *rand.Rand
	v       variant
	ttl     time.Duration
	renew   time.Duration
	poll    time.Duration
	horizon time.Duration
	now     time.Duration
	seq     int
	q       events
	tracing bool
	trace   []string
	failed  string

	// the database
	row      *row
	lock     *session // holds the advisory lock
	slot     *session // the slot's walsender
	rowLock  *session // holds the row lock until its statement commits
	waiters  []waiter
	nextSess int
	slowDB   time.Duration // statements are slow until then
	slowExec time.Duration

	procs       []*proc
	lastConfirm int64
	epochOf     map[int64]string // which process confirmed an epoch
	stats       struct{ terms, fences, confirms, violations int }
}

type row struct {
	holder    string
	epoch     int64
	renewedAt time.Duration // database clock: the model's real time
}

type session struct {
	id       int
	p        *proc
	gen      int
	alive    bool
	lastRecv time.Duration
	conn     *conn
}

type waiter struct {
	s  *session
	fn func()
}

// conn is the client's side of a connection.
type conn struct {
	s       *session
	broken  bool          // closed by the client, or the client learned the server closed it
	toSrv   time.Duration // FIFO: the last delivery towards the server
	toCli   time.Duration
	pending *query
	queue   []*query
}

type result struct {
	took int64 // campaign: the epoch taken, 0 none
	rows int64 // renew
	ok   bool  // check, start
	err  error
}

type query struct {
	name string
	done func(result)
	over bool
}

type proc struct {
	m          *model
	name       string
	gen        int // a restart is a new process: older events are dropped
	alive      bool
	born       time.Duration
	rate       float64 // local clock speed against the database's
	pausedTill time.Duration
	cutTill    time.Duration // packets to and from the database are held until then
	slowNet    time.Duration // round trips are slow until then
	held       *lease
	lc         *conn // lease connection
	repl       *conn // replication connection
	term       int   // counts terms; callbacks of an ended term do nothing
	termEpoch  int64
	status     time.Duration // status update interval, local
}

var (
	errNoConn   = errors.New("no lease connection")
	errClosed   = errors.New("connection closed")
	errTimeout  = errors.New("timeout")
	errCanceled = errors.New("canceled by the caller")
)

func runModel(seed uint64, v variant, tracing bool) *model {
	rng := rand.New(rand.NewPCG(seed, 0x1ea5e))
	m := &model{rng: rng, v: v, tracing: tracing, epochOf: map[int64]string{}}
	m.ttl = []time.Duration{time.Second, 3 * time.Second, 5 * time.Second, 10 * time.Second}[rng.IntN(4)]
	m.renew = m.ttl / time.Duration([]int{2, 3, 4, 6, 10}[rng.IntN(5)])
	m.poll = max(100*time.Millisecond, m.ttl*time.Duration(3+rng.IntN(38))/100)
	m.horizon = 40 * m.ttl
	for _, name := range []string{"a", "b"} {
		p := &proc{m: m, name: name}
		m.procs = append(m.procs, p)
		m.at(m.uniform(0, m.poll), func() { p.start() })
	}
	m.schedule()
	for m.q.Len() > 0 && m.failed == "" {
		e := heap.Pop(&m.q).(*event)
		if e.at > m.horizon {
			break
		}
		m.now = e.at
		e.fn()
		m.check()
	}
	return m
}

func (m *model) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ttl %s renew %s poll %s horizon %s; terms %d, stale fences %d, confirmations %d", m.ttl, m.renew, m.poll, m.horizon,
		m.stats.terms, m.stats.fences, m.stats.confirms)
	for _, p := range m.procs {
		fmt.Fprintf(&b, "; %s clock rate %.3f", p.name, p.rate)
	}
	return b.String()
}

func (m *model) tail(n int) []string {
	return m.trace[max(0, len(m.trace)-n):]
}

// logf adds to the trace, kept only when tracing: a failing seed runs
// again with it (the run is deterministic).
func (m *model) logf(format string, args ...any) {
	if !m.tracing {
		return
	}
	m.trace = append(m.trace, fmt.Sprintf("%9.3fs ", m.now.Seconds())+fmt.Sprintf(format, args...))
	if len(m.trace) > 4000 {
		m.trace = append(m.trace[:0], m.trace[2000:]...)
	}
}

func (m *model) at(d time.Duration, fn func()) {
	m.seq++
	heap.Push(&m.q, &event{at: m.now + max(0, d), seq: m.seq, fn: fn})
}

func (m *model) uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(m.rng.Int64N(int64(hi-lo)))
}

// schedule draws the faults of one run.
func (m *model) schedule() {
	for _, p := range m.procs {
		p.rate = 1 + (m.rng.Float64()*2-1)*0.08
	}
	ttl := m.ttl
	length := func() time.Duration {
		switch m.rng.IntN(3) {
		case 0:
			return m.uniform(0, ttl/2)
		case 1:
			return m.uniform(ttl*7/10, ttl*13/10)
		default:
			return m.uniform(ttl*3/2, 3*ttl)
		}
	}
	for n := 3 + m.rng.IntN(8); n > 0; n-- {
		when := m.uniform(2*ttl, m.horizon-3*ttl)
		p := m.procs[m.rng.IntN(len(m.procs))]
		switch k := m.rng.IntN(100); {
		case k < 35:
			d := length()
			m.at(when, func() { p.pause(d) })
		case k < 60:
			d := length()
			if m.rng.IntN(10) == 0 {
				d = forever
			}
			m.at(when, func() { p.cut(d) })
		case k < 75:
			d := m.uniform(0, 3*ttl)
			m.at(when, func() { p.kill(d) })
		case k < 90:
			d, x := m.uniform(ttl/2, 3*ttl), m.uniform(time.Millisecond, ttl*4/10)
			m.at(when, func() {
				m.logf("database slow for %s: statements take up to %s", d, x)
				m.slowDB, m.slowExec = m.now+d, x
			})
		default:
			d := m.uniform(ttl/2, 3*ttl)
			m.at(when, func() {
				m.logf("%s: slow network for %s", p.name, d)
				p.slowNet = m.now + d
			})
		}
	}
}

// latency of one packet from or to p.
func (m *model) latency(p *proc) time.Duration {
	switch k := m.rng.IntN(100); {
	case m.now < p.slowNet:
		return m.uniform(m.ttl/20, m.ttl*6/10)
	case k < 97:
		return m.uniform(100*time.Microsecond, 2*time.Millisecond)
	default:
		return m.uniform(2*time.Millisecond, m.ttl*3/10)
	}
}

// execTime of one statement.
func (m *model) execTime() time.Duration {
	if m.now < m.slowDB {
		return m.uniform(0, m.slowExec)
	}
	return m.uniform(50*time.Microsecond, time.Millisecond)
}

// check asserts the invariant after every step: at most one process holds
// a valid lease. Validity changes only at steps or by running out, so
// checking at every step sees every overlap begin.
func (m *model) check() {
	n := 0
	for _, p := range m.procs {
		if p.alive && p.held.validAt(p.local()) {
			n++
		}
	}
	if n < 2 {
		return
	}
	var valid []string
	for _, p := range m.procs {
		if p.alive && p.held.validAt(p.local()) {
			valid = append(valid, fmt.Sprintf("%s (epoch %d, %s left)", p.name, p.held.epoch,
				time.Duration(float64(p.held.until-p.local())/p.rate).Round(time.Millisecond)))
		}
	}
	m.fail("two valid leases: " + strings.Join(valid, ", "))
}

func (m *model) fail(what string) {
	if m.failed == "" {
		m.failed = fmt.Sprintf("at %.3fs: %s", m.now.Seconds(), what)
		m.logf("VIOLATION: %s", what)
	}
}

// --- network -------------------------------------------------------------------

// toServer delivers fn to c's session after a packet's trip, in order;
// packets of a cut process wait for the heal, and are lost if it never
// comes or their session has ended by then.
func (m *model) toServer(p *proc, c *conn, fn func(s *session)) {
	m.packet(p, c, func() {
		if c.s.alive {
			c.s.lastRecv = m.now
			fn(c.s)
		}
	})
}

// packet delivers fn at the server after a trip on c, in order, held while
// p is cut off.
func (m *model) packet(p *proc, c *conn, fn func()) {
	at := max(m.now+m.latency(p), c.toSrv)
	c.toSrv = at
	var deliver func()
	deliver = func() {
		if p.cutTill > m.now {
			if p.cutTill == forever {
				return
			}
			heal := p.cutTill + m.latency(p)
			c.toSrv = max(c.toSrv, heal)
			m.at(heal-m.now, deliver)
			return
		}
		fn()
	}
	m.at(at-m.now, deliver)
}

// dial opens c: its session starts when the startup packet arrives, and
// at runs then.
func (m *model) dial(p *proc, c *conn, at func(s *session)) {
	m.nextSess++
	s := &session{id: m.nextSess, p: p, gen: p.gen, conn: c}
	c.s = s
	m.packet(p, c, func() {
		s.alive, s.lastRecv = true, m.now
		if p.cutTill > m.now {
			m.keepalive(s)
		}
		at(s)
	})
}

// toClient delivers fn at the client of c, in order, run by the process
// (held while it is paused).
func (m *model) toClient(c *conn, fn func()) {
	p, gen := c.s.p, c.s.gen
	at := max(m.now+m.latency(p), c.toCli)
	c.toCli = at
	var deliver func()
	deliver = func() {
		if p.cutTill > m.now {
			if p.cutTill == forever {
				return
			}
			heal := p.cutTill + m.latency(p)
			c.toCli = max(c.toCli, heal)
			m.at(heal-m.now, deliver)
			return
		}
		p.run(gen, fn)
	}
	m.at(at-m.now, deliver)
}

// --- database ------------------------------------------------------------------

// endSession ends s (terminated, dropped by keepalive, or closed by its
// client): the advisory lock, the slot and a row lock go with it; the client
// hears of it a trip later.
func (m *model) endSession(s *session, why string) {
	if !s.alive {
		return
	}
	s.alive = false
	m.logf("db: session %d of %s ends: %s", s.id, s.p.name, why)
	if m.lock == s {
		m.lock = nil
	}
	if m.slot == s {
		m.slot = nil
	}
	if m.rowLock == s {
		m.releaseRow()
	}
	c := s.conn
	m.toClient(c, func() { c.p().closedByServer(c) })
}

func (c *conn) p() *proc { return c.s.p }

// withRow runs fn holding the row lock, once it is free.
func (m *model) withRow(s *session, fn func()) {
	if m.rowLock == nil {
		m.rowLock = s
		fn()
		return
	}
	m.waiters = append(m.waiters, waiter{s, fn})
}

func (m *model) releaseRow() {
	m.rowLock = nil
	for len(m.waiters) > 0 {
		w := m.waiters[0]
		m.waiters = m.waiters[1:]
		if w.s.alive {
			m.rowLock = w.s
			w.fn()
			return
		}
	}
}

// commit runs fn at the end of s's statement, after x; a session ended
// meanwhile aborts it (no reply: its client hears the connection close).
func (m *model) commit(s *session, fn func()) {
	m.at(m.execTime(), func() {
		if !s.alive {
			return
		}
		fn()
	})
}

func (m *model) reply(s *session, r result) {
	c := s.conn
	m.toClient(c, func() { c.p().answered(c, r) })
}

// campaign: pg_try_advisory_lock; if taken, the INSERT ... ON CONFLICT
// with epoch+1 and renewed_at = now(), then the slot's walsender is
// terminated; else the fencing statement (fenceStale).
func (m *model) campaign(s *session) {
	start := m.now // now() of the statement
	if m.lock == nil || m.lock == s {
		m.lock = s
		m.withRow(s, func() {
			m.commit(s, func() {
				epoch := int64(1)
				if m.row != nil {
					epoch = m.row.epoch + 1
				}
				m.row = &row{holder: s.p.name, epoch: epoch, renewedAt: start}
				m.releaseRow()
				m.logf("db: %s took the lease, epoch %d", s.p.name, epoch)
				if m.slot != nil {
					m.endSession(m.slot, "walsender terminated by the new leader")
				}
				m.reply(s, result{took: epoch})
			})
		})
		return
	}
	// fenceStale: the row (FOR UPDATE: after any renewal in progress), and
	// if stale the lock holder's session and the walsender, terminated
	// while the row lock is held.
	body := func() {
		r := m.row
		if r == nil {
			m.commit(s, func() { m.reply(s, result{}) })
			return
		}
		stale := r.renewedAt < start-m.ttl // renewed_at < now() - TTL
		act := fenceVerdict(nil, stale)
		m.commit(s, func() {
			if act == holderFenced {
				m.stats.fences++
				m.logf("db: %s fences holder %s epoch %d (renewed %s ago)", s.p.name, r.holder, r.epoch, m.now-r.renewedAt)
				if m.lock != nil && m.lock != s {
					m.endSession(m.lock, "lock holder terminated by the fence")
				}
				if m.slot != nil {
					m.endSession(m.slot, "walsender terminated by the fence")
				}
			}
			if m.rowLock == s {
				m.releaseRow()
			}
			m.reply(s, result{})
		})
	}
	if m.v.noRowLock {
		body()
		return
	}
	m.withRow(s, body)
}

// renew: UPDATE ... SET renewed_at = now() WHERE holder, epoch and
// renewed_at >= now() - TTL, under the row lock.
func (m *model) renewRow(s *session, epoch int64) {
	start := m.now
	m.withRow(s, func() {
		r := m.row
		match := r != nil && r.holder == s.p.name && r.epoch == epoch
		if !m.v.noDBExpiryCheck && !m.v.renewIgnoresExpiry && match {
			match = r.renewedAt >= start-m.ttl
		}
		m.commit(s, func() {
			var n int64
			if match {
				r.renewedAt, n = start, 1
			}
			m.releaseRow()
			m.reply(s, result{rows: n})
		})
	})
}

// checkRow: SELECT EXISTS (... holder, epoch).
func (m *model) checkRow(s *session, epoch int64) {
	r := m.row
	ok := r != nil && r.holder == s.p.name && r.epoch == epoch
	m.commit(s, func() { m.reply(s, result{ok: ok}) })
}

// startReplication: a second walsender on the slot is refused.
func (m *model) startReplication(s *session) {
	if m.slot != nil {
		m.logf("db: START_REPLICATION by %s refused: slot active for session %d", s.p.name, m.slot.id)
		m.reply(s, result{err: errors.New("replication slot is active")})
		m.endSession(s, "replication refused")
		return
	}
	m.slot = s
	m.reply(s, result{ok: true})
}

// confirm: a standby status update reaching the slot's walsender.
func (m *model) confirm(s *session, epoch int64) {
	if m.slot != s {
		return
	}
	who := fmt.Sprintf("%s#%d", s.p.name, s.gen)
	m.stats.confirms++
	if epoch < m.lastConfirm {
		m.fail(fmt.Sprintf("%s confirmed for epoch %d after epoch %d had confirmed", who, epoch, m.lastConfirm))
	}
	if prev, ok := m.epochOf[epoch]; ok && prev != who {
		m.fail(fmt.Sprintf("epoch %d confirmed by %s and %s", epoch, prev, who))
	}
	m.epochOf[epoch], m.lastConfirm = who, epoch
}

// keepalive drops s when its peer has been silent (cut off) for three
// keepalive idles: the probes go unanswered.
func (m *model) keepalive(s *session) {
	idle := keepaliveIdle(m.ttl)
	if m.v.keepaliveFloor {
		idle = max(1, int(m.ttl/time.Second/3))
	}
	drop := 3 * time.Duration(idle) * time.Second
	var probe func()
	probe = func() {
		p := s.p
		if !s.alive || p.cutTill <= m.now {
			return // answered: the peer's kernel acks probes even while the process is stopped
		}
		if due := s.lastRecv + drop; due > m.now {
			m.at(due-m.now, probe)
			return
		}
		m.endSession(s, "dropped by tcp keepalive")
	}
	m.at(s.lastRecv+drop-m.now, probe)
}

// --- the processes ---------------------------------------------------------------

// local is the process's monotonic clock: time since it started, at its rate.
func (p *proc) local() time.Duration {
	return time.Duration(float64(p.m.now-p.born) * p.rate)
}

// run runs fn as the process gen, once it is not paused; events of an
// earlier process of the same name are dropped.
func (p *proc) run(gen int, fn func()) {
	if !p.alive || p.gen != gen {
		return
	}
	if p.pausedTill > p.m.now {
		p.m.at(p.pausedTill-p.m.now, func() { p.run(gen, fn) })
		return
	}
	fn()
}

// after runs fn after d on the process's clock.
func (p *proc) after(d time.Duration, fn func()) {
	gen := p.gen
	p.m.at(time.Duration(float64(d)/p.rate), func() { p.run(gen, fn) })
}

func (p *proc) start() {
	m := p.m
	p.alive, p.gen, p.born, p.pausedTill = true, p.gen+1, m.now, 0
	p.held, p.lc, p.repl = nil, nil, nil
	p.status = m.uniform(m.ttl/50, m.ttl/10)
	m.logf("%s#%d starts", p.name, p.gen)
	p.loop()
}

func (p *proc) pause(d time.Duration) {
	if !p.alive {
		return
	}
	p.m.logf("%s: SIGSTOP for %s", p.name, d)
	p.pausedTill = max(p.pausedTill, p.m.now+d)
}

func (p *proc) cut(d time.Duration) {
	m := p.m
	m.logf("%s: cut off from the database for %s", p.name, d)
	if d == forever {
		p.cutTill = forever
	} else {
		p.cutTill = max(p.cutTill, m.now+d)
	}
	for _, c := range []*conn{p.lc, p.repl} {
		if c != nil && c.s.alive {
			m.keepalive(c.s)
		}
	}
}

// kill: the process dies; its kernel closes its connections (a FIN, held
// like any packet while cut off), and it starts again after d.
func (p *proc) kill(d time.Duration) {
	m := p.m
	if !p.alive {
		return
	}
	m.logf("%s: kill -9, restart in %s", p.name, d)
	p.alive, p.held = false, nil
	for _, c := range []*conn{p.lc, p.repl} {
		if c != nil && !c.broken {
			m.toServer(p, c, func(s *session) { m.endSession(s, "client died") })
		}
	}
	m.at(d, func() {
		p.cutTill = 0
		p.start()
	})
}

// loop is Run's: connect when needed, then campaign.
func (p *proc) loop() {
	if p.lc != nil {
		p.campaign()
		return
	}
	c := &conn{}
	p.m.dial(p, c, func(s *session) { p.m.reply(s, result{ok: true}) })
	p.lc = c
	c.pending = &query{name: "connect", done: func(r result) {
		if r.err != nil {
			p.after(p.m.poll, p.loop)
			return
		}
		p.campaign()
	}}
	p.timeout(c, c.pending, 10*time.Second)
}

// query runs a statement on the lease connection, one at a time, bounded
// by timeout (on the process's clock, from when it is sent): a timeout
// closes the connection, as pgx does.
func (p *proc) query(name string, timeout time.Duration, exec func(s *session), done func(result)) {
	c := p.lc
	if c == nil || c.broken {
		done(result{err: errNoConn})
		return
	}
	q := &query{name: name, done: done}
	start := func() {
		c.pending = q
		p.m.toServer(p, c, exec)
		p.timeout(c, q, timeout)
	}
	if c.pending != nil {
		c.queue = append(c.queue, &query{name: name, done: func(r result) {
			if r.err != nil {
				done(r)
				return
			}
			start()
		}})
		return
	}
	start()
}

func (p *proc) timeout(c *conn, q *query, d time.Duration) {
	p.after(max(0, d), func() {
		if !q.over && c.pending == q {
			p.connLost(c, errTimeout)
		}
	})
}

// answered: the reply to c's pending statement.
func (p *proc) answered(c *conn, r result) {
	if c == p.repl {
		p.replAnswered(c, r)
		return
	}
	q := c.pending
	if q == nil || q.over || c.broken {
		return
	}
	q.over, c.pending = true, nil
	q.done(r)
	if len(c.queue) > 0 && !c.broken && c.pending == nil {
		next := c.queue[0]
		c.queue = c.queue[1:]
		next.done(result{})
	}
}

// closedByServer: the server's FIN or RST arrives.
func (p *proc) closedByServer(c *conn) {
	if c == p.repl {
		p.m.logf("%s: replication connection closed by the server", p.name)
		c.broken = true
		return
	}
	if c != p.lc || c.broken {
		return
	}
	if c.pending != nil {
		p.connLost(c, errClosed)
		return
	}
	c.broken = true // pgx notices at the next statement
}

// connLost is query's closing path: the lease connection is unusable and
// is closed, and (closeConn, query) the term ends with it.
func (p *proc) connLost(c *conn, err error) {
	m := p.m
	if !p.v().noFenceOnConnLoss {
		p.fence()
	}
	m.logf("%s: lease connection closed (%v)", p.name, err)
	c.broken = true
	m.toServer(p, c, func(s *session) { m.endSession(s, "closed by the client") })
	if p.lc == c {
		p.lc = nil
	}
	pending, queue := c.pending, c.queue
	c.pending, c.queue = nil, nil
	if pending != nil && !pending.over {
		pending.over = true
		pending.done(result{err: err})
	}
	for _, q := range queue {
		q.done(result{err: errNoConn})
	}
}

func (p *proc) v() variant { return p.m.v }

func (p *proc) fence() { p.held = nil }

func (p *proc) closeConn() {
	if p.lc == nil {
		p.fence()
		return
	}
	c := p.lc
	p.connLost(c, errors.New("closed after the term"))
}

func (p *proc) lease(epoch int64, sent time.Duration) *lease {
	switch {
	case p.v().untilFromReply:
		return newLease(epoch, p.local(), p.m.ttl)
	case p.v().noMargin:
		return &lease{epoch: epoch, until: sent + p.m.ttl}
	}
	return newLease(epoch, sent, p.m.ttl)
}

// campaign is one standby round.
func (p *proc) campaign() {
	m := p.m
	sent := p.local()
	p.query("campaign", m.ttl, m.campaign, func(r result) {
		switch {
		case r.err != nil:
			p.closeConn()
			p.after(m.poll, p.loop)
		case r.took == 0:
			p.after(m.poll, p.loop)
		default:
			p.serve(p.lease(r.took, sent))
		}
	})
}

// serve is one term: renewals every renew interval, and the stream.
func (p *proc) serve(l *lease) {
	m := p.m
	m.stats.terms++
	p.term++
	p.held, p.termEpoch = l, l.epoch
	m.logf("%s: leader, epoch %d, valid for %s", p.name, l.epoch, l.until-p.local())
	m.check()
	term := p.term
	p.after(m.renew, func() { p.renewTick(term, p.local()) })
	p.stream(term)
}

func (p *proc) endTerm(term int, why error) {
	if p.term != term {
		return
	}
	p.fence()
	p.term++
	p.m.logf("%s: term of epoch %d ends: %v", p.name, p.termEpoch, why)
	if c := p.repl; c != nil {
		p.repl = nil
		c.broken = true
		p.m.toServer(p, c, func(s *session) { p.m.endSession(s, "replication closed by the client") })
	}
	p.closeConn()
	p.after(0, p.loop)
}

// renewTick is serve's ticker: a tick that comes while a renewal runs waits
// for it (time.Ticker's buffered tick).
func (p *proc) renewTick(term int, ticked time.Duration) {
	m := p.m
	if p.term != term {
		return
	}
	l, sent := p.held, p.local()
	if l == nil || !p.v().renewIgnoresExpiry && !l.validAt(sent) {
		p.endTerm(term, errors.New("lease expired before it could be renewed"))
		return
	}
	timeout := l.until - sent
	if timeout <= 0 {
		timeout = m.ttl // renew-ignores-expiry only
	}
	p.query("renew", timeout, func(s *session) { m.renewRow(s, l.epoch) }, func(r result) {
		if p.term != term {
			return
		}
		if err := renewVerdict(r.rows, r.err); err != nil {
			p.endTerm(term, err)
			return
		}
		m.logf("%s: renewed epoch %d (sent %s ago)", p.name, l.epoch, time.Duration(float64(p.local()-sent)/p.rate).Round(time.Millisecond))
		if p.held != l && !p.v().renewIgnoresExpiry {
			p.endTerm(term, errors.New("lease connection lost during the renewal"))
			return
		}
		p.held = p.lease(l.epoch, sent)
		m.check()
		next := ticked + m.renew
		p.after(max(0, next-p.local()), func() { p.renewTick(term, next) })
	})
}

// stream is the replication stream of a term: Check, then
// START_REPLICATION, then status updates gated by Valid.
func (p *proc) stream(term int) {
	m := p.m
	if p.term != term {
		return
	}
	l, now := p.held, p.local()
	retry := func() { p.after(m.uniform(m.ttl/30, m.ttl/5), func() { p.stream(term) }) }
	if !l.validAt(now) {
		retry()
		return
	}
	q := func(r result) {
		if p.term != term {
			return
		}
		if err := checkVerdict("s", r.ok, r.err); err != nil {
			retry()
			return
		}
		p.startReplication(term)
	}
	p.query("check", l.until-now, func(s *session) { m.checkRow(s, l.epoch) }, q)
	// The caller may give up on Check (its context ends): pgx closes the
	// connection.
	if c := p.lc; c != nil && c.pending != nil && c.pending.name == "check" && m.rng.IntN(10) == 0 {
		pending := c.pending
		p.after(m.uniform(0, l.until-now), func() {
			if c.pending == pending && !pending.over {
				p.connLost(c, errCanceled)
			}
		})
	}
}

func (p *proc) startReplication(term int) {
	m := p.m
	c := &conn{}
	m.dial(p, c, m.startReplication)
	p.repl = c
	c.pending = &query{name: "start", done: func(r result) {
		if p.term != term || p.repl != c {
			return
		}
		if r.err != nil || !r.ok {
			p.repl = nil
			p.after(m.uniform(m.ttl/30, m.ttl/5), func() { p.stream(term) })
			return
		}
		p.after(p.status, func() { p.statusTick(term, c) })
	}}
}

func (p *proc) replAnswered(c *conn, r result) {
	if q := c.pending; q != nil && !q.over {
		q.over, c.pending = true, nil
		q.done(r)
	}
}

// statusTick sends a standby status update when Valid (sendStatus's gate).
func (p *proc) statusTick(term int, c *conn) {
	m := p.m
	if p.term != term || p.repl != c {
		return
	}
	if c.broken {
		p.repl = nil
		p.stream(term)
		return
	}
	if p.held.validAt(p.local()) {
		epoch := p.termEpoch
		m.toServer(p, c, func(s *session) { m.confirm(s, epoch) })
	}
	p.after(p.status, func() { p.statusTick(term, c) })
}
