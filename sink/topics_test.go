package sink

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"
)

// gateRig is a topic gate over a fake lookup: exists names the topics that
// exist (with their max.message.bytes), passed and failed what it let
// through and refused.
type gateRig struct {
	g      *topicGate
	mu     sync.Mutex
	exists map[string]int
	down   bool // lookups fail as with the cluster unreachable
	passed []*Message
	failed map[*Message]error
	looked map[string]int
	limits map[string]int
}

func newGateRig(t *testing.T, timeout time.Duration, precheck bool) *gateRig {
	r := &gateRig{exists: map[string]int{}, failed: map[*Message]error{}, looked: map[string]int{}, limits: map[string]int{}}
	r.g = newTopicGate(timeout, precheck, zerolog.Nop())
	r.g.lookup = func(topic string) (topicMeta, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.looked[topic]++
		if r.down {
			return topicMeta{}, sarama.ErrOutOfBrokers
		}
		max, ok := r.exists[topic]
		return topicMeta{exists: ok, maxBytes: max}, nil
	}
	r.g.pass = func(m *Message) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.passed = append(r.passed, m)
		return nil
	}
	r.g.fail = func(_ string, msgs []*Message, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range msgs {
			r.failed[m] = err
		}
	}
	r.g.limit = func(topic string, n int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.limits[topic] = n
	}
	t.Cleanup(r.g.close)
	return r
}

// publish is Producer.Publish over the rig: admitted records pass at once.
func (r *gateRig) publish(m *Message) {
	if r.g.admit(m) {
		_ = r.g.pass(m)
	}
}

func (r *gateRig) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func msg(topic string, i, size int) *Message {
	return &Message{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i)), Value: make([]byte, size)}
}

// Issue 36: one record for a missing topic holds up only its topic. The
// records of a topic that exists go through while it is looked up; after
// kafka.missing_topic_timeout it fails, certainly, as unknown_topic, and
// later records of it fail at once without waiting again.
func TestGateMissingTopicIsolated(t *testing.T) {
	r := newGateRig(t, 300*time.Millisecond, true)
	r.exists["orders"] = 0
	bad := msg("ordr", 0, 10)
	bad.Partition = 3 // left from an earlier attempt
	r.publish(bad)
	var good []*Message
	for i := range 1000 {
		m := msg("orders", i, 10)
		good = append(good, m)
		r.publish(m)
	}
	r.eventually(t, "the existing topic's records to pass", func() bool { return len(r.passed) == len(good) })
	r.mu.Lock()
	for i, m := range r.passed {
		if m != good[i] {
			t.Fatalf("record %d passed out of order", i)
		}
	}
	if _, done := r.failed[bad]; done {
		t.Fatal("the missing topic's record failed before the timeout")
	}
	r.mu.Unlock()
	start := time.Now()
	r.eventually(t, "the missing topic's record to fail", func() bool { return r.failed[bad] != nil })
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("failed after %s, want about the 300ms timeout", waited)
	}
	err := r.failed[bad]
	if bad.Partition != -1 {
		t.Errorf("refused record has partition %d, want -1 (none chosen)", bad.Partition)
	}
	var missing *MissingTopicError
	if !errors.As(err, &missing) || missing.Topic != "ordr" {
		t.Fatalf("verdict %v, want a MissingTopicError naming ordr", err)
	}
	if reason, kind := Classify(err); reason != "unknown_topic" || kind != Poison || !Certain(err) {
		t.Errorf("Classify: %s/%v certain %v; want unknown_topic, poison, certain", reason, kind, Certain(err))
	}
	for _, want := range []string{"ordr", "kafka.missing_topic_timeout", "create it"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// A later record of the missing topic fails at once.
	next := msg("ordr", 1, 10)
	start = time.Now()
	r.publish(next)
	r.eventually(t, "the next record of the missing topic to fail", func() bool { return r.failed[next] != nil })
	if waited := time.Since(start); waited > 200*time.Millisecond {
		t.Errorf("the next record waited %s for a topic known missing", waited)
	}
}

// A topic created while its records wait lets them through, in order, and
// one created after the timeout is found on the next lookup (every
// missingRecheck).
func TestGateTopicCreated(t *testing.T) {
	r := newGateRig(t, time.Minute, true)
	var held []*Message
	for i := range 5 {
		m := msg("late", i, 10)
		held = append(held, m)
		r.publish(m)
	}
	r.eventually(t, "a lookup", func() bool { return r.looked["late"] > 0 })
	r.mu.Lock()
	if len(r.passed) != 0 {
		t.Fatal("records of a missing topic passed")
	}
	r.exists["late"] = 0
	r.mu.Unlock()
	r.eventually(t, "the held records to pass", func() bool { return len(r.passed) == len(held) })
	for i, m := range held {
		if r.passed[i] != m {
			t.Fatalf("held record %d passed out of order", i)
		}
	}

	// Missing for the timeout, then created: the recheck opens it.
	r2 := newGateRig(t, 50*time.Millisecond, true)
	first := msg("gone", 0, 10)
	r2.publish(first)
	r2.eventually(t, "the timeout", func() bool { return r2.failed[first] != nil })
	r2.mu.Lock()
	r2.exists["gone"] = 0
	r2.mu.Unlock()
	r2.g.mu.Lock()
	r2.g.topics["gone"].checked = time.Now().Add(-missingRecheck) // the recheck is due
	r2.g.mu.Unlock()
	r2.publish(msg("gone", 1, 10)) // fails (known missing) and starts the recheck
	r2.eventually(t, "the recheck", func() bool { return r2.looked["gone"] >= 2 })
	after := msg("gone", 2, 10)
	r2.eventually(t, "the topic to open", func() bool {
		r2.g.mu.Lock()
		defer r2.g.mu.Unlock()
		return r2.g.topics["gone"].state == gateOpen
	})
	r2.publish(after)
	r2.eventually(t, "a record of the created topic to pass", func() bool { return len(r2.passed) == 1 && r2.passed[0] == after })
}

// A cluster that cannot be reached is no answer about the topic: its
// records wait, no timeout runs out on them.
func TestGateClusterDownIsNoVerdict(t *testing.T) {
	r := newGateRig(t, 50*time.Millisecond, true)
	r.down = true
	m := msg("orders", 0, 10)
	r.publish(m)
	time.Sleep(300 * time.Millisecond)
	r.mu.Lock()
	if err := r.failed[m]; err != nil {
		t.Fatalf("record failed while the cluster was unreachable: %v", err)
	}
	r.down = false
	r.exists["orders"] = 0
	r.mu.Unlock()
	r.eventually(t, "the record to pass once the cluster answers", func() bool { return len(r.passed) == 1 })
}

// Without compression a record larger than its topic's max.message.bytes
// is refused before it is sent, certainly; with compression only the
// broker can tell. The engine learns the topic's limit.
func TestGateTopicMaxMessageBytes(t *testing.T) {
	for _, precheck := range []bool{true, false} {
		t.Run(fmt.Sprintf("precheck=%v", precheck), func(t *testing.T) {
			r := newGateRig(t, time.Minute, precheck)
			r.exists["small"] = 2000
			fits := msg("small", 0, 100)
			r.publish(fits) // resolves the topic
			r.eventually(t, "the first record", func() bool { return len(r.passed) == 1 })
			if r.limits["small"] != 2000 {
				t.Errorf("engine told limit %d, want 2000", r.limits["small"])
			}
			big := msg("small", 1, 3000)
			r.publish(big)
			if !precheck {
				r.eventually(t, "the large record to pass", func() bool { return len(r.passed) == 2 })
				return
			}
			r.eventually(t, "the large record to fail", func() bool { return r.failed[big] != nil })
			err := r.failed[big]
			if reason, kind := Classify(err); reason != "message_too_large" || kind != Poison || !Certain(err) {
				t.Errorf("%v: %s/%v certain %v, want message_too_large, poison, certain", err, reason, kind, Certain(err))
			}
			if !strings.Contains(err.Error(), "max.message.bytes of topic small (2000)") {
				t.Errorf("error %q does not name the topic's limit", err)
			}
		})
	}
}

// soleBatchSize is what the broker compares with max.message.bytes: the
// encoded size of a batch holding the record alone.
func TestSoleBatchSizeExact(t *testing.T) {
	d, _, _, _ := directRig(t, 5, 1<<20)
	cases := []*Message{
		{Topic: "orders", Key: []byte("k"), Value: []byte("v")},
		{Topic: "orders", Value: make([]byte, 300)},
		{Topic: "orders", Key: make([]byte, 200), Value: make([]byte, 70000),
			Headers: []Header{{Key: []byte("event_id"), Value: make([]byte, 36)}, {Key: []byte("h"), Value: nil}}},
		{Topic: "orders", Key: []byte("k")}, // null value: a tombstone
	}
	for i, m := range cases {
		b := &dbatch{msgs: []*Message{m}, first: 1700000000000}
		enc, err := (&wire{}).appendBatch(nil, d, b)
		if err != nil {
			t.Fatal(err)
		}
		if got := soleBatchSize(m); got != len(enc) {
			t.Errorf("case %d: soleBatchSize %d, encoded %d", i, got, len(enc))
		}
	}
}
