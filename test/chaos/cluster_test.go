//go:build e2e

package chaos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// The cluster scenario runs against the three-node KRaft cluster of
// test/services.sh cluster-start (replication factor 3, min.insync.replicas
// 2): partition leaders killed and restarted, stalled, two of three nodes
// down (the ISR below the minimum), a partition reassignment, each under
// load, in sequence, in one relay run per delivery mode. Events are tagged
// by the fault that was going on (or last) when they were written, and the
// table below the scenario table gives each fault's figures.

const (
	clusterPause   = 14 * time.Second // a stalled leader: past the 9 s session timeout, so it is fenced
	clusterBelowTo = 10 * time.Second // two of three nodes down
	clusterSettle  = 3 * time.Minute  // bound on leaders and ISRs coming back after a fault
)

var (
	clusterMu      sync.Mutex
	clusterBrokers []string
	clusterStarted bool // by this process: cluster-stop at the end
)

// ensureCluster returns the cluster's brokers, starting it (once per test
// process, stopped by stopCluster) when the env file names none. It fails,
// never skips, when the cluster cannot start.
func ensureCluster(t *testing.T) []string {
	t.Helper()
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if clusterBrokers != nil {
		return clusterBrokers
	}
	read := func() *testkit.Services {
		if svcs.File == "" {
			t.Fatal("the cluster scenario needs the services' env file (OUTBOX_TEST_RUN_DIR/env): its cluster lines are written there")
		}
		s, err := testkit.ReadServices(svcs.File)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := read()
	if s.Get("OUTBOX_TEST_CLUSTER_BROKERS") == "" {
		start := time.Now()
		svc(t, "cluster-start")
		clusterStarted = true
		t.Logf("three-node cluster started in %s", time.Since(start).Round(time.Second))
		s = read()
	}
	clusterBrokers = strings.Split(s.Get("OUTBOX_TEST_CLUSTER_BROKERS"), ",")
	if len(clusterBrokers) != 3 {
		t.Fatalf("OUTBOX_TEST_CLUSTER_BROKERS=%v: want three brokers", clusterBrokers)
	}
	return clusterBrokers
}

// stopCluster stops the cluster if this process started it.
func stopCluster() {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if !clusterStarted {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := svcs.Run(ctx, "cluster-stop"); err != nil {
		fmt.Println("cluster-stop:", err)
	}
	clusterStarted, clusterBrokers = false, nil
}

// clusterScenario is the scenario of the cluster faults, rounds times each.
func clusterScenario() scenario {
	faults := sc.clusterRounds * len(clusterFaults)
	return scenario{name: "cluster", cluster: true, events: sc.clusterEvents, faults: faults, per: 15 * time.Second,
		inject: func(s *run, i int) { injectCluster(s, clusterFaults[i%len(clusterFaults)]) }, verify: verifyCluster}
}

// clusterFault is one kind of cluster fault: it injects itself (calling
// s.fault once the fault is decided) and returns a note.
type clusterFault struct {
	kind   string
	inject func(s *run, kind string) string
}

// The reassignment comes first: it is short, and later in the run the
// writer, behind its schedule after the long faults, could finish before it.
var clusterFaults = []clusterFault{
	{"partition reassignment, preferred leader election", reassign},
	{"leader kill -9, restart", killLeaderNode},
	{"leader SIGSTOP " + clusterPause.String(), pauseLeaderNode},
	{"follower kill -9, ISR 2 < min.insync.replicas 3 for " + clusterBelowTo.String(), raiseMinISR},
	{"2 of 3 nodes kill -9 " + clusterBelowTo.String(), killTwoNodes},
}

// phase is what happened from the start of one fault to the start of the
// next: the events written meanwhile are its events.
type phase struct {
	kind          string
	from          int64 // events written before the fault started
	before, after relayCounters
	note          string
	took          time.Duration
}

// relayCounters are the relay's counters that say how a fault was taken.
type relayCounters struct {
	rewinds, republished, aborted float64
	errors                        map[string]float64 // publish errors by reason
}

func (s *run) counters() relayCounters {
	c := relayCounters{errors: map[string]float64{}}
	ss, err := s.r.Scrape()
	if err != nil {
		s.t.Fatalf("scrape the relay's metrics: %v", err)
	}
	c.rewinds, _ = testkit.SumMetric(ss, "outbox_relay_rewinds_total", nil)
	c.republished, _ = testkit.SumMetric(ss, "outbox_relay_republished_events_total", nil)
	c.aborted, _ = testkit.SumMetric(ss, "outbox_relay_kafka_transactions_total", map[string]string{"result": "aborted"})
	for _, x := range ss {
		if x.Name == "outbox_relay_publish_errors_total" && x.Value > 0 {
			c.errors[x.Labels["reason"]] += x.Value
		}
	}
	return c
}

func injectCluster(s *run, f clusterFault) {
	if n := len(s.phases); n > 0 {
		s.phases[n-1].after = s.counters()
	}
	p := &phase{kind: f.kind, from: s.w.Count(), before: s.counters()}
	s.phases = append(s.phases, p)
	start := time.Now()
	defer func() {
		if s.t.Failed() { // a fault cut short: the next scenario needs every node
			healCluster(s.t)
		}
	}()
	p.note = f.inject(s, f.kind)
	s.settle()
	p.took = time.Since(start).Round(100 * time.Millisecond)
}

// healCluster resumes and starts every node that is stopped or down.
func healCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for n := 1; n <= 3; n++ {
		for _, c := range []string{"cluster-resume", "cluster-node-start"} {
			if err := svcs.Run(ctx, c, fmt.Sprint(n)); err != nil {
				t.Logf("heal the cluster: %v", err)
			}
		}
	}
}

// --- the cluster's state -------------------------------------------------------

// partitionState is one partition's leader, replicas and in-sync replicas.
type partitionState struct {
	leader        int32
	replicas, isr []int32
}

// adminConfig is the clients' config with short timeouts: a stopped node
// accepts TCP (the kernel does) and never answers.
func adminConfig() *sarama.Config {
	c := testkit.SaramaConfig()
	c.Net.DialTimeout, c.Net.ReadTimeout, c.Net.WriteTimeout = 3*time.Second, 5*time.Second, 5*time.Second
	c.Admin.Timeout = 10 * time.Second
	return c
}

// without is kafka without node n (broker id n is the nth address).
func without(kafka []string, n int32) []string {
	var out []string
	for i, b := range kafka {
		if int32(i+1) != n {
			out = append(out, b)
		}
	}
	return out
}

// describe returns the state of every partition of topics (topics that do
// not exist are left out).
func describe(kafka, topics []string) (map[string][]partitionState, error) {
	admin, err := sarama.NewClusterAdmin(kafka, adminConfig())
	if err != nil {
		return nil, fmt.Errorf("kafka admin on %v: %w", kafka, err)
	}
	defer admin.Close()
	metas, err := admin.DescribeTopics(topics)
	if err != nil {
		return nil, fmt.Errorf("describe topics %v: %w", topics, err)
	}
	out := map[string][]partitionState{}
	for _, m := range metas {
		if errors.Is(m.Err, sarama.ErrUnknownTopicOrPartition) {
			continue
		}
		ps := make([]partitionState, len(m.Partitions))
		for _, p := range m.Partitions {
			if int(p.ID) < len(ps) {
				ps[p.ID] = partitionState{leader: p.Leader, replicas: p.Replicas, isr: p.Isr}
			}
		}
		out[m.Name] = ps
	}
	return out, nil
}

// metadataLeader is the leader of partition p of topic in the metadata of
// the brokers kafka (a metadata request goes to any of them; an admin's
// describe goes to the "controller" it was told of, which may be the node
// just stopped).
func metadataLeader(kafka []string, topic string, p int) (int32, error) {
	cfg := adminConfig()
	// Quick: the client learns of every node, the stopped one too, and may
	// ask it; the stall must not outlast clusterPause.
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout = time.Second, time.Second
	cfg.Metadata.Retry.Max = 0
	c, err := sarama.NewClient(kafka, cfg)
	if err != nil {
		return -1, fmt.Errorf("kafka client on %v: %w", kafka, err)
	}
	defer c.Close()
	if err := c.RefreshMetadata(topic); err != nil {
		return -1, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	b, err := c.Leader(topic, int32(p))
	if err != nil {
		return -1, fmt.Errorf("leader of %s/%d: %w", topic, p, err)
	}
	return b.ID(), nil
}

// watched are the topics whose health a fault waits for: the outbox's, and
// in exactly-once mode the transaction state and the checkpoints.
func (s *run) watched() []string {
	ts := append(s.e.topics(), s.e.Prefix+".dlq")
	if s.mode == exactlyOnce {
		ts = append(ts, "__transaction_state", testkit.CheckpointTopic)
	}
	return ts
}

// leaderOf is the node leading partition p of topic, asked of kafka.
func (s *run) leaderOf(kafka []string, topic string, p int) int32 {
	var leader int32 = -1
	waitFor(s.t, clusterSettle, fmt.Sprintf("a leader for %s/%d", topic, p), func() bool {
		st, err := describe(kafka, []string{topic})
		if err != nil || len(st[topic]) <= p {
			return false
		}
		leader = st[topic][p].leader
		return leader > 0
	})
	return leader
}

// settle waits until every watched partition has a leader and all three
// replicas in sync, and the relay streams: the next fault starts from a
// healthy cluster.
func (s *run) settle() {
	t := s.t
	last := ""
	err := testkit.Poll(clusterSettle, 500*time.Millisecond, func() (bool, error) {
		s.r.alive()
		st, err := describe(s.e.kafka, s.watched())
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for tp, ps := range st {
			for i, p := range ps {
				if p.leader <= 0 || len(p.isr) != 3 {
					last = fmt.Sprintf("%s/%d leader %d isr %v", tp, i, p.leader, p.isr)
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the cluster did not settle within %s (every partition led, three replicas in sync): last seen %s", clusterSettle, last)
	}
	s.e.waitStreaming(s.r, clusterSettle, 0)
}

// --- the faults ----------------------------------------------------------------

// loadPartition is the partition whose leader a fault hits: the first
// topic's, a different partition each round.
func (s *run) loadPartition() (string, int) {
	return s.e.topics()[0], len(s.phases) % 4
}

func killLeaderNode(s *run, kind string) string {
	tp, p := s.loadPartition()
	n := s.leaderOf(s.e.kafka, tp, p)
	s.fault(kind)
	svc(s.t, "cluster-kill", fmt.Sprint(n))
	killed := time.Now()
	// cluster-node-start waits for the old registration to expire
	// (broker.session.timeout.ms): meanwhile the controller fences node n
	// and moves its leaders.
	svc(s.t, "cluster-node-start", fmt.Sprint(n))
	return fmt.Sprintf("node %d (leader of %s/%d) back after %s", n, short(tp), p, time.Since(killed).Round(100*time.Millisecond))
}

func pauseLeaderNode(s *run, kind string) string {
	tp, p := s.loadPartition()
	n := s.leaderOf(s.e.kafka, tp, p)
	s.fault(kind)
	svc(s.t, "cluster-pause", fmt.Sprint(n))
	paused := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			svc(s.t, "cluster-resume", fmt.Sprint(n))
		}
	}()
	// Who leads meanwhile, asked of the others only, and in time: the stall
	// must not outlast clusterPause.
	after := fmt.Sprintf("still node %d after %s", n, clusterPause-2*time.Second)
	for time.Since(paused) < clusterPause-2*time.Second {
		time.Sleep(500 * time.Millisecond)
		if l, err := metadataLeader(without(s.e.kafka, n), tp, p); err == nil && l != n {
			after = fmt.Sprintf("node %d after %s", l, time.Since(paused).Round(100*time.Millisecond))
			break
		}
	}
	time.Sleep(time.Until(paused.Add(clusterPause)))
	svc(s.t, "cluster-resume", fmt.Sprint(n))
	resumed = true
	return fmt.Sprintf("node %d (leader of %s/%d) stalled; leader during the stall: %s", n, short(tp), p, after)
}

// raiseMinISR takes the ISR below the minimum while the controller quorum
// stands: the outbox topics' min.insync.replicas is raised to 3 (the
// cluster's is 2), a follower of the load partition is killed, and once
// the controller fenced it (the ISRs shrink to 2) every produce to them is
// refused (NOT_ENOUGH_REPLICAS) for clusterBelowTo; then the override is
// dropped and the node restarted. Two nodes killed (killTwoNodes) take the
// quorum with them, and no ISR can shrink.
func raiseMinISR(s *run, kind string) string {
	t := s.t
	tp, p := s.loadPartition()
	n := s.leaderOf(s.e.kafka, tp, p)
	f := n%3 + 1 // a follower: every node holds a replica
	three := "3"
	s.setMinISR(s.e.kafka, &three)
	s.fault(kind)
	svc(t, "cluster-kill", fmt.Sprint(f))
	killed := time.Now()
	waitFor(t, clusterSettle, fmt.Sprintf("node %d out of every ISR", f), func() bool {
		st, err := describe(without(s.e.kafka, f), s.e.topics())
		if err != nil {
			return false
		}
		for _, ps := range st {
			for _, p := range ps {
				if slices.Contains(p.isr, f) {
					return false
				}
			}
		}
		return true
	})
	shrunk := time.Since(killed).Round(100 * time.Millisecond)
	refused := s.counters().errors["not_enough_replicas"]
	time.Sleep(time.Second) // acks already on their way may land
	published := s.r.metric("outbox_relay_events_published_total")
	time.Sleep(clusterBelowTo - time.Second)
	published = s.r.metric("outbox_relay_events_published_total") - published
	refused = s.counters().errors["not_enough_replicas"] - refused
	s.setMinISR(without(s.e.kafka, f), nil)
	svc(t, "cluster-node-start", fmt.Sprint(f))
	if published != 0 {
		t.Errorf("%v events acked while every ISR was below min.insync.replicas: the relay's produce bypassed acks=all", published)
	}
	// At-least-once sees the refusals. Exactly-once sends nothing meanwhile:
	// the coordinator cannot write the last transaction's commit markers
	// (refused NOT_ENOUGH_REPLICAS too, in the broker's log), so the next
	// transaction waits on CONCURRENT_TRANSACTIONS.
	if s.mode == atLeastOnce && refused == 0 {
		t.Errorf("no produce refused with NOT_ENOUGH_REPLICAS while the ISR (2) was below min.insync.replicas (3): the fault missed the relay")
	}
	return fmt.Sprintf("node %d (follower on %s/%d) out of the ISRs %s after the kill; in the %s after: %v produces refused NOT_ENOUGH_REPLICAS, %v events acked",
		f, short(tp), p, shrunk, clusterBelowTo, refused, published)
}

// setMinISR sets the outbox topics' min.insync.replicas to *v (nil: drops
// the override) and waits until the brokers report it. A change sent while
// the controller quorum elects a leader can be lost; it is sent again.
func (s *run) setMinISR(kafka []string, v *string) {
	want := "2" // the cluster's
	op := sarama.IncrementalAlterConfigsOperationDelete
	if v != nil {
		want, op = *v, sarama.IncrementalAlterConfigsOperationSet
	}
	for _, tp := range s.e.topics() {
		var last error
		err := testkit.Poll(time.Minute, 500*time.Millisecond, func() (bool, error) {
			admin, err := sarama.NewClusterAdmin(kafka, adminConfig())
			if err != nil {
				last = err
				return false, nil
			}
			defer admin.Close()
			entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: tp, ConfigNames: []string{"min.insync.replicas"}})
			if err == nil && len(entries) == 1 && entries[0].Value == want {
				return true, nil
			}
			last = admin.IncrementalAlterConfig(sarama.TopicResource, tp,
				map[string]sarama.IncrementalAlterConfigsEntry{"min.insync.replicas": {Operation: op, Value: v}}, false)
			if last == nil {
				last = fmt.Errorf("described as %v", entries)
			}
			return false, nil
		})
		if err != nil {
			s.t.Fatalf("topic %s: min.insync.replicas %s not taken: %v", tp, want, last)
		}
	}
}

// killTwoNodes kills the two followers of the load partition's leader: the
// leader is left alone, and with them the controller quorum is lost, so
// the ISRs cannot shrink: produces to the survivor wait for the followers
// and time out (NOT_ENOUGH_REPLICAS needs a controller to shrink the ISR:
// raiseMinISR).
func killTwoNodes(s *run, kind string) string {
	tp, p := s.loadPartition()
	n := s.leaderOf(s.e.kafka, tp, p)
	var down []int32
	for i := int32(1); i <= 3; i++ {
		if i != n {
			down = append(down, i)
		}
	}
	s.fault(kind)
	for _, d := range down {
		svc(s.t, "cluster-kill", fmt.Sprint(d))
	}
	time.Sleep(clusterBelowTo)
	// Both at once: each needs the other (or the survivor) for a quorum.
	errs := make(chan error, len(down))
	for _, d := range down {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			errs <- svcs.Run(ctx, "cluster-node-start", fmt.Sprint(d))
		}()
	}
	for range down {
		if err := <-errs; err != nil {
			s.t.Fatal(err)
		}
	}
	return fmt.Sprintf("nodes %v down, node %d (leader of %s/%d) alone", down, n, short(tp), p)
}

// reassign rotates the replica list of every partition of the outbox's
// topics (AlterPartitionReassignments), waits for the reassignment, then
// elects the preferred (first) replicas: every partition's leader moves
// while the writer goes on.
func reassign(s *run, kind string) string {
	t := s.t
	admin, err := sarama.NewClusterAdmin(s.e.kafka, adminConfig())
	if err != nil {
		t.Fatalf("kafka admin: %v", err)
	}
	defer admin.Close()
	topics := s.e.topics()
	before, err := describe(s.e.kafka, topics)
	if err != nil {
		t.Fatal(err)
	}
	s.fault(kind)
	elect := map[string][]int32{}
	for _, tp := range topics {
		var assign [][]int32
		for i, p := range before[tp] {
			r := p.replicas
			if len(r) != 3 {
				t.Fatalf("%s/%d has replicas %v: want 3", tp, i, r)
			}
			assign = append(assign, []int32{r[1], r[2], r[0]})
			elect[tp] = append(elect[tp], int32(i))
		}
		if err := admin.AlterPartitionReassignments(tp, assign); err != nil {
			t.Fatalf("reassign %s to %v: %v", tp, assign, err)
		}
	}
	waitFor(t, clusterSettle, "the reassignment to finish", func() bool {
		st, err := describe(s.e.kafka, topics)
		if err != nil {
			return false
		}
		for _, tp := range topics {
			for i, p := range st[tp] {
				b := before[tp][i].replicas
				if !slices.Equal(p.replicas, []int32{b[1], b[2], b[0]}) {
					return false
				}
			}
		}
		return true
	})
	res, err := admin.ElectLeaders(sarama.PreferredElection, elect)
	if err != nil {
		t.Fatalf("preferred leader election: %v", err)
	}
	for tp, ps := range res {
		for p, r := range ps {
			if r != nil && !errors.Is(r.ErrorCode, sarama.ErrNoError) && !errors.Is(r.ErrorCode, sarama.ErrElectionNotNeeded) {
				t.Errorf("preferred leader election %s/%d: %v", tp, p, r.ErrorCode)
			}
		}
	}
	moved, total := 0, 0
	waitFor(t, clusterSettle, "the preferred leaders to lead", func() bool {
		st, err := describe(s.e.kafka, topics)
		if err != nil {
			return false
		}
		moved, total = 0, 0
		ok := true
		for _, tp := range topics {
			for i, p := range st[tp] {
				total++
				if p.leader != before[tp][i].leader {
					moved++
				}
				ok = ok && p.leader == p.replicas[0]
			}
		}
		return ok
	})
	if moved == 0 {
		t.Errorf("the reassignment moved no leader: the fault proves nothing")
	}
	return fmt.Sprintf("leaders moved on %d of %d partitions", moved, total)
}

func short(topic string) string { return topic[strings.LastIndex(topic, ".")+1:] }

// --- the per-fault figures -------------------------------------------------------

// faultRow is one fault's figures: its events checked on their own.
type faultRow struct {
	kind                                    string
	written, lost, dups, reordered, partial int
	rewinds, republished, aborted           float64
	errors                                  string
	note                                    string
}

// clusterRows are the per-fault rows of every cluster run, by mode.
var clusterRows = map[delivery][]faultRow{}

// verifyCluster checks each fault's events apart (every event belongs to
// the fault going on or last when it was written) and asserts, on the
// whole run, no duplicate in either mode and no rewind: a produce refused
// or timed out by a cluster that moves its leaders must be retried in
// place, in order, never republished.
func verifyCluster(s *run, res result) {
	t := s.t
	if n := len(s.phases); n > 0 {
		s.phases[n-1].after = s.counters()
	}
	events, _ := s.w.snapshot()
	var rows []faultRow
	var rewinds, republished, aborted float64
	for i, p := range s.phases {
		to := int64(len(events))
		if i+1 < len(s.phases) {
			to = s.phases[i+1].from
		}
		var evs []event
		ids := map[int64]bool{}
		for _, ev := range events {
			if int64(ev.Written) >= p.from && int64(ev.Written) < to {
				evs = append(evs, ev)
				ids[ev.ID] = true
			}
		}
		var recs []record
		for _, r := range s.recs {
			if id, err := testkit.RecordID(r); err == nil && ids[id] {
				recs = append(recs, r)
			}
		}
		pr := check(s.mode, evs, recs, s.parts, s.e.Prefix)
		var errs []string
		for _, k := range slices.Sorted(maps.Keys(p.after.errors)) {
			if d := p.after.errors[k] - p.before.errors[k]; d > 0 {
				errs = append(errs, fmt.Sprintf("%s %v", k, d))
			}
		}
		row := faultRow{kind: p.kind, written: pr.Written, lost: pr.Lost, dups: pr.Duplicates, reordered: pr.OrderViolations,
			partial: pr.PartialTxns, rewinds: p.after.rewinds - p.before.rewinds, republished: p.after.republished - p.before.republished,
			aborted: p.after.aborted - p.before.aborted, errors: strings.Join(errs, ", "),
			note: fmt.Sprintf("%s; settled %s after the fault began", p.note, p.took)}
		rewinds += row.rewinds
		republished += row.republished
		aborted += row.aborted
		rows = append(rows, row)
		t.Logf("fault %d %s: written %d, lost %d, duplicates %d, reordered %d, rewinds %v, republished %v, aborted %v, publish errors [%s]; %s",
			i+1, p.kind, row.written, row.lost, row.dups, row.reordered, row.rewinds, row.republished, row.aborted, row.errors, row.note)
	}
	clusterRows[s.mode] = append(clusterRows[s.mode], rows...)
	for i, r := range rows {
		if r.written == 0 {
			t.Errorf("fault %d (%s): no event written from its start to the next fault's: not under load", i+1, r.kind)
		}
	}
	if res.Duplicates != 0 {
		t.Errorf("%d duplicates (event ids %v): on a cluster that loses leaders the relay retries in place, it republishes nothing",
			res.Duplicates, firstN(res.DuplicateIDs, 10))
	}
	switch {
	case s.mode == atLeastOnce && (rewinds != 0 || republished != 0):
		t.Errorf("%v rewinds, %v events republished: the direct producer retries a produce refused or timed out by a cluster that "+
			"moves its leaders in place, in order; it must not rewind", rewinds, republished)
	case s.mode == exactlyOnce && rewinds != aborted:
		// A record that fails after sarama's few retries inside a Kafka
		// transaction aborts it; the rewind resends its events in the
		// next one, unseen by read_committed consumers. Any other rewind
		// is unexplained.
		t.Errorf("%v rewinds but %v aborted Kafka transactions: every exactly-once rewind must replace an aborted transaction", rewinds, aborted)
	}
	if got := len(s.phases); got != s.sc.faults {
		t.Errorf("%d cluster faults injected, want %d", got, s.sc.faults)
	}
}

func faultTable(rows []faultRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| fault | events written | lost | duplicates | reordered | partial txns | rewinds | republished | aborted Kafka txns | publish errors | notes |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %v | %v | %v | %s | %s |\n", r.kind, r.written, r.lost, r.dups, r.reordered,
			r.partial, r.rewinds, r.republished, r.aborted, r.errors, strings.ReplaceAll(r.note, "|", "/"))
	}
	return b.String()
}
