package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// MissingTopicError is the verdict on a record whose topic did not exist
// for kafka.missing_topic_timeout: poison (reason unknown_topic) and
// certain, so on_poison applies at once.
type MissingTopicError struct {
	Topic  string
	Waited time.Duration
}

func (e *MissingTopicError) Error() string {
	return fmt.Sprintf("topic %s does not exist (looked up for %s, kafka.missing_topic_timeout); create it, or fix the rows that route to it (kafka.topic_template), or set kafka.auto_create_topics: true, then replay the dead letter",
		e.Topic, e.Waited.Round(time.Second))
}

// topicMeta is what one lookup learned about a topic.
type topicMeta struct {
	exists     bool
	maxBytes   int // its max.message.bytes; 0 when not known (no DescribeConfigs right)
	partitions int // its partition count; 0 when not known
}

// topicGate stands before the producer engine. It holds the records of a
// topic until the relay knows the topic exists, asking a broker itself
// with a metadata request for that topic alone: sarama's client shares one
// metadata refresh between all callers and retries a refresh for a missing
// topic for up to an hour (Metadata.Retry), so one record routed to a
// missing topic held up every topic published to for the first time after
// it. A topic that stays missing for kafka.missing_topic_timeout fails its
// records (MissingTopicError) and every later one at once, and is looked up
// again every missingRecheck: created, it receives records again.
//
// It also reads each topic's max.message.bytes (refreshed every
// describeRefresh): without compression a record's size on the wire is
// known, so a record over it is refused before it is sent (certain, like
// one over kafka.max_message_bytes), and the direct engine keeps its
// batches for the topic under it.
//
// The same periodic lookup reads each topic's partition count: a change
// (an operator added partitions, or the topic was recreated with fewer) is
// logged and handed to partitions, which reports it and has the engine
// follow it (the direct engine drains the topic first: direct.repartition).
type topicGate struct {
	timeout    time.Duration // kafka.missing_topic_timeout
	precheck   bool          // kafka.compression none: sizes are exact
	autoCreate bool          // kafka.auto_create_topics: the lookups ask the broker to create it
	lookup     func(topic string) (topicMeta, error)
	pass       func(m *Message) error                         // hands a held record to the engine
	fail       func(topic string, msgs []*Message, err error) // completes records refused here
	limit      func(topic string, maxBytes int)               // tells the engine the topic's limit; may be nil
	missing    func(n int)                                    // the topics known not to exist now; may be nil
	partitions func(topic string, old, n int)                 // a topic's partition count: first seen (old 0) or changed; may be nil
	rule       string                                         // what the engine does on a partition count change, for the log
	every      time.Duration                                  // how often open topics are looked up again (describeRefresh)
	log        zerolog.Logger
	now        func() time.Time

	mu      sync.Mutex
	topics  map[string]*gateTopic
	stopped chan struct{}
	stop    sync.Once
}

type gateState int

const (
	gateResolving gateState = iota // looked up; records are held
	gateOpen                       // exists: records pass
	gateMissing                    // missing for the timeout: records fail at once
)

type gateTopic struct {
	state     gateState
	held      []*Message
	since     time.Time // the first lookup that found it missing
	checked   time.Time // the last lookup or description
	maxBytes  int
	parts     int  // the partition count last seen (0: not known)
	busy      bool // a goroutine looks it up
	announced bool // its wait was logged
}

// How often a missing topic is looked up again, and an existing topic's
// max.message.bytes read again.
const (
	missingRecheck  = 10 * time.Second
	describeRefresh = 5 * time.Minute
)

func newTopicGate(timeout time.Duration, precheck bool, log zerolog.Logger) *topicGate {
	return &topicGate{timeout: timeout, precheck: precheck, log: log, now: time.Now, every: describeRefresh,
		topics: map[string]*gateTopic{}, stopped: make(chan struct{})}
}

// close ends the lookups; held records are abandoned (their events stay
// unconfirmed, as records in flight at a stop).
func (g *topicGate) close() { g.stop.Do(func() { close(g.stopped) }) }

// admit reports whether m may go to the engine now (the caller sends it);
// otherwise the gate holds it while its topic is looked up, or refuses it
// (its verdict comes through fail). It never blocks on the network.
func (g *topicGate) admit(m *Message) bool {
	g.mu.Lock()
	t, decided, err := g.lookLocked(m)
	if !decided {
		t.held = append(t.held, m)
		g.mu.Unlock()
		return false
	}
	g.mu.Unlock()
	if err != nil {
		go g.refuse(m.Topic, []*Message{m}, err)
		return false
	}
	return true
}

// lookLocked is the gate's word on m: decided, with m's verdict (nil: it
// may go; too large for its topic; its topic missing), when m's topic is
// open or known missing; otherwise the topic is being looked up (a lookup
// is running). A known missing topic is looked up again every
// missingRecheck. The path of nearly every record (open) reads no clock
// and allocates nothing. Under mu.
func (g *topicGate) lookLocked(m *Message) (t *gateTopic, decided bool, err error) {
	t = g.topics[m.Topic]
	if t == nil {
		t = &gateTopic{}
		g.topics[m.Topic] = t
	}
	switch t.state {
	case gateOpen:
		return t, true, g.tooLarge(t, m)
	case gateMissing:
		now := g.now()
		if !t.busy && now.Sub(t.checked) >= missingRecheck {
			t.busy = true
			go g.resolve(m.Topic, t)
		}
		return t, true, &MissingTopicError{Topic: m.Topic, Waited: now.Sub(t.since)}
	}
	if !t.busy {
		t.busy = true
		go g.resolve(m.Topic, t)
	}
	return t, false, nil
}

// refuse completes msgs, refused before any partition was chosen.
func (g *topicGate) refuse(topic string, msgs []*Message, err error) {
	for _, m := range msgs {
		m.Partition = -1
	}
	g.fail(topic, msgs, err)
}

// tooLarge refuses m before it is sent when its topic's max.message.bytes
// is known and the record alone would exceed it; under mu. With
// compression the broker compares the compressed batch, so only it knows.
func (g *topicGate) tooLarge(t *gateTopic, m *Message) error {
	if !g.precheck || t.maxBytes <= 0 {
		return nil
	}
	if n := soleBatchSize(m); n > t.maxBytes {
		return &SoleError{fmt.Errorf("record of %d bytes exceeds max.message.bytes of topic %s (%d): %w; raise the topic's max.message.bytes, or make the event smaller",
			n, m.Topic, t.maxBytes, sarama.ErrMessageSizeTooLarge)}
	}
	return nil
}

// resolve looks name up until it exists (the held records then pass, in
// order), is missing for the timeout (they fail), or the gate closes. A
// topic already known missing (a recheck) stays so on the first answer.
func (g *topicGate) resolve(name string, t *gateTopic) {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 2 * time.Second}}
	var lastErr error
	for {
		meta, err := g.lookup(name)
		now := g.now()
		g.mu.Lock()
		t.checked = now
		switch {
		case err == nil && meta.exists:
			t.maxBytes = meta.maxBytes
			old := t.parts
			if meta.partitions > 0 {
				t.parts = meta.partitions
			}
			if t.state == gateMissing || t.announced {
				g.log.Info().Str("topic", name).Msg("topic exists now: its events are published")
			}
			t.since, t.announced = time.Time{}, false
			g.reportLocked()
			g.mu.Unlock()
			if g.limit != nil {
				g.limit(name, meta.maxBytes)
			}
			g.partitionsSeen(name, old, meta.partitions)
			g.release(name, t)
			return
		case err == nil:
			if t.since.IsZero() {
				t.since = now
				g.reportLocked()
			}
			waited := now.Sub(t.since)
			if t.state == gateMissing || waited >= g.timeout {
				first := t.state != gateMissing
				t.state, t.busy = gateMissing, false
				held := t.held
				t.held = nil
				g.mu.Unlock()
				if first {
					g.log.Error().Str("topic", name).Dur("waited", waited).Int("events", len(held)).
						Msg("topic does not exist after kafka.missing_topic_timeout: its events are poison (reason unknown_topic) until it is created; create the topic or fix the rows, then replay the dead letters")
				}
				if len(held) > 0 {
					g.refuse(name, held, &MissingTopicError{Topic: name, Waited: waited})
				}
				return
			}
			switch {
			case t.announced:
			case g.autoCreate && waited < 2*time.Second:
				// Being created by the lookup itself: no news yet.
			case g.autoCreate:
				t.announced = true
				g.log.Warn().Str("topic", name).Dur("timeout", g.timeout).
					Msg("topic does not exist although the relay asked the broker to create it (kafka.auto_create_topics; is the broker's auto.create.topics.enable off?): its events wait for it, other topics go on; they are poison after kafka.missing_topic_timeout")
			default:
				t.announced = true
				g.log.Warn().Str("topic", name).Dur("timeout", g.timeout).
					Msg("topic does not exist (kafka.auto_create_topics is off): its events wait for it, other topics go on; create it before kafka.missing_topic_timeout or they are poison")
			}
		default:
			// Not an answer about the topic (the cluster unreachable, a
			// broker restarting): no timeout runs, the producer's
			// readiness says what is wrong.
			if lastErr == nil || lastErr.Error() != err.Error() {
				g.log.Warn().Err(err).Str("topic", name).Msg("looking up topic; its events wait")
			}
			lastErr = err
		}
		g.mu.Unlock()
		wait := b.Next()
		if left := g.timeout - now.Sub(t.since); err == nil && left > 0 && left < wait {
			wait = left
		}
		select {
		case <-g.stopped:
			return
		case <-time.After(wait):
		}
	}
}

// reportLocked counts the topics known not to exist (waiting for the
// timeout or past it); under mu.
func (g *topicGate) reportLocked() {
	if g.missing == nil {
		return
	}
	n := 0
	for _, t := range g.topics {
		if !t.since.IsZero() {
			n++
		}
	}
	g.missing(n)
}

// release passes t's held records to the engine in the order published,
// then opens t. Records published meanwhile are held behind them, so the
// order of one publisher holds.
func (g *topicGate) release(name string, t *gateTopic) {
	for {
		g.mu.Lock()
		held := t.held
		t.held = nil
		if len(held) == 0 {
			t.state, t.busy = gateOpen, false
			g.mu.Unlock()
			return
		}
		var refused []*Message
		var errs []error
		pass := held[:0:0]
		for _, m := range held {
			if err := g.tooLarge(t, m); err != nil {
				refused, errs = append(refused, m), append(errs, err)
				continue
			}
			pass = append(pass, m)
		}
		g.mu.Unlock()
		for i, m := range refused {
			g.refuse(name, []*Message{m}, errs[i])
		}
		for _, m := range pass {
			if err := g.pass(m); err != nil {
				// Closed: the records stay unconfirmed, as any in flight.
				g.mu.Lock()
				t.busy = false
				g.mu.Unlock()
				return
			}
		}
	}
}

// refresh reads the max.message.bytes and the partition count of every
// open topic again every g.every (describeRefresh), until the gate closes:
// an operator may change either; stop (nil: never) ends it too.
func (g *topicGate) refresh(stop <-chan struct{}) {
	tick := time.NewTicker(g.every)
	defer tick.Stop()
	for {
		select {
		case <-g.stopped:
			return
		case <-stop:
			return
		case <-tick.C:
		}
		g.mu.Lock()
		var open []string
		for name, t := range g.topics {
			if t.state == gateOpen {
				open = append(open, name)
			}
		}
		g.mu.Unlock()
		for _, name := range open {
			meta, err := g.lookup(name)
			if err != nil || !meta.exists {
				continue // a deleted topic: the produce requests say so
			}
			g.mu.Lock()
			t := g.topics[name]
			changed := t.maxBytes != meta.maxBytes
			t.maxBytes, t.checked = meta.maxBytes, g.now()
			old := t.parts
			if meta.partitions > 0 {
				t.parts = meta.partitions
			}
			g.mu.Unlock()
			if changed && g.limit != nil {
				g.limit(name, meta.maxBytes)
			}
			g.partitionsSeen(name, old, meta.partitions)
		}
	}
}

// partitionsSeen reports topic's partition count n (0: not in the answer)
// when first seen or changed from old; a change is logged.
func (g *topicGate) partitionsSeen(topic string, old, n int) {
	if n <= 0 || n == old {
		return
	}
	if old > 0 {
		g.log.Warn().Str("topic", topic).Int("old_partitions", old).Int("partitions", n).Str("rule", g.rule).
			Msg("topic's partition count changed: keys may move to another partition (murmur2 of the key modulo the partitions); consumers reading both partitions must not assume order across them")
	}
	if g.partitions != nil {
		g.partitions(topic, old, n)
	}
}

// soleBatchSize is the exact size of a record batch holding m alone, as
// the broker compares it with max.message.bytes (record batch v2,
// uncompressed; the encoding of appendRecords).
func soleBatchSize(m *Message) int {
	n := 1 + 1 + 1 + bytesLen(m.Key) + bytesLen(m.Value) + varintLen(int64(len(m.Headers)))
	for j := range m.Headers {
		n += bytesLen(m.Headers[j].Key) + bytesLen(m.Headers[j].Value)
	}
	return batchOverhead + varintLen(int64(n)) + n
}

// brokerLookup asks one broker of client about topic: a metadata request
// for it alone (creating it only when kafka.auto_create_topics allows) and
// its max.message.bytes. It never goes through the client's shared
// metadata refresh.
func brokerLookup(client sarama.Client, sc *sarama.Config, autoCreate bool) func(string) (topicMeta, error) {
	return func(topic string) (topicMeta, error) {
		b := client.LeastLoadedBroker()
		if b == nil {
			return topicMeta{}, sarama.ErrOutOfBrokers
		}
		req := sarama.NewMetadataRequest(sc.Version, []string{topic})
		req.AllowAutoTopicCreation = autoCreate
		resp, err := b.GetMetadata(req)
		if err != nil {
			_ = b.Close() // the next lookup dials again
			return topicMeta{}, fmt.Errorf("metadata of topic %s from broker %s: %w", topic, b.Addr(), err)
		}
		var found *sarama.TopicMetadata
		for _, tm := range resp.Topics {
			if tm.Name == topic {
				found = tm
			}
		}
		if found == nil {
			return topicMeta{}, fmt.Errorf("metadata of topic %s from broker %s: not in the answer", topic, b.Addr())
		}
		switch {
		case errors.Is(found.Err, sarama.ErrUnknownTopicOrPartition):
			return topicMeta{}, nil
		case found.Err == sarama.ErrNoError && len(found.Partitions) == 0:
			return topicMeta{}, nil // auto-created just now, or being deleted: not there yet
		}
		// Exists (LEADER_NOT_AVAILABLE while just created), or an answer
		// the produce request will give again (authorization, an invalid
		// name): the engine and on_poison handle it as before.
		meta := topicMeta{exists: true, partitions: len(found.Partitions)}
		if found.Err == sarama.ErrNoError {
			meta.maxBytes = describeMaxBytes(b, sc, topic)
		}
		return meta, nil
	}
}

// describeMaxBytes reads topic's max.message.bytes; 0 when it cannot (no
// DescribeConfigs right, an old broker): the broker's answer decides then.
func describeMaxBytes(b *sarama.Broker, sc *sarama.Config, topic string) int {
	req := &sarama.DescribeConfigsRequest{Resources: []*sarama.ConfigResource{{
		Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"max.message.bytes"}}}}
	if sc.Version.IsAtLeast(sarama.V1_1_0_0) {
		req.Version = 1
	}
	if sc.Version.IsAtLeast(sarama.V2_0_0_0) {
		req.Version = 2
	}
	resp, err := b.DescribeConfigs(req)
	if err != nil {
		return 0
	}
	for _, r := range resp.Resources {
		if r.ErrorCode != 0 || r.Name != topic {
			continue
		}
		for _, c := range r.Configs {
			if c.Name == "max.message.bytes" {
				if n, err := strconv.Atoi(c.Value); err == nil && n > 0 {
					return n
				}
			}
		}
	}
	return 0
}

// wait is the gate for a caller that may block (the exactly-once
// producer, whose Kafka transactions go in order anyway): it returns once
// m's topic exists, or the record's verdict: too large for the topic, or
// MissingTopicError after the timeout. ctx ending returns ctx.Err().
func (g *topicGate) wait(ctx context.Context, m *Message) error {
	for {
		g.mu.Lock()
		_, decided, err := g.lookLocked(m)
		g.mu.Unlock()
		if decided {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-g.stopped:
			return ErrClosed
		case <-time.After(50 * time.Millisecond): // a rare path: polling is simpler than a signal per topic
		}
	}
}
