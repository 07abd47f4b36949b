package sink

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// direct is the producer engine of kafka.producer: direct. It takes
// metadata and producer ids from sarama's client and sends produce
// requests on connections of its own (wire.go). What sarama's
// AsyncProducer spreads over a chain of goroutines per topic, partition and
// broker (each record crosses six channels there) it keeps in one lock:
// Publish queues the record on its partition, and the broker's sender
// builds one request from every partition that has records and nothing in
// flight, sends it and completes the records with the response. At a low
// rate that is two goroutine wake-ups per record instead of about eight; in
// a drain the batches are as large as what queued while the last request
// was in flight.
//
// The guarantees are sarama's idempotent producer's: acks=all, one request
// in flight per broker, so one batch per partition; sequence numbers are
// given when a batch is built and a failed batch is resent as it is, so the
// broker drops a duplicate and per-partition order holds. A transient error
// (leader moved, network, timeout) resends the batch after a backoff, up to
// kafka.retry_max times; when they run out, or the broker reports an
// idempotence error, the batch and every record queued behind it on the
// partition fail (the pipeline rewinds and publishes them again) and the
// producer takes a new producer id, because whether the broker wrote the
// batch is unknown. A batch the broker refuses (too large, invalid) did not
// take its sequence numbers, so the next batch reuses them: a refusal of its
// topic fails its records (Certain); a refusal of one record in a batch of
// several sends them again one per batch, so only the culprit fails, alone
// in its batch and so certainly (on_poison applies at once).
// DUPLICATE_SEQUENCE_NUMBER acks the batch: the broker has it.
//
// A topic's partition count changed (repartition, reported by the topic
// gate): new records of the topic are held until every record already
// placed on it is acked or failed, then placed with the new count, so a
// key that moves has all its earlier records acked in the old partition
// before its first one goes to the new. A broker's throttle time (KIP-219)
// holds that broker's next request, no other's. A sender idle for
// senderIdle that leads no partition in use, or was replaced by a new one
// for its node, ends and closes its connection.
type direct struct {
	client      sarama.Client
	sc          *sarama.Config // dialing the brokers: TLS, SASL, timeouts
	codec       sarama.CompressionCodec
	level       int
	wireVersion int16 // Produce version of the requests (wire)
	timeout     int32 // ms the broker waits for the replicas (acks=all)
	maxBatch    int   // bytes in one record batch: kafka.max_message_bytes
	maxReq      int   // bytes in one request
	retryMax    int
	retry       backoff.Policy
	// complete reports the verdict on records of one topic (Producer.complete):
	// metrics, then each Message.Done or, for an acked batch, the OnAcked
	// function; no records: a failed attempt that is retried, for the
	// metrics. Called without mu held.
	complete func(topic string, msgs []*Message, err error)

	mu      sync.Mutex
	pid     int64 // producer id and epoch for batches built from now on
	epoch   int16
	newPID  bool // a batch failed with an unknown outcome: take a new id
	topics  map[string]*dtopic
	limits  map[string]int        // setLimit's, for topics not published to yet
	nodes   map[int32]*dbroker    // the current sender of each broker id
	senders map[*dbroker]struct{} // every running sender (current or retiring)
	pending int                   // records published and not completed
	closing bool                  // close ran: idle closes when pending reaches 0
	idle    chan struct{}         // closed when closing and nothing is pending
	stopped chan struct{}         // closed by stop: goroutines end
	wake    chan struct{}         // the fixer: topics to resolve, a new id, local failures
	failed  []failure             // records refused before a batch: completed by the fixer

	catchingUp atomic.Bool        // Producer.CatchingUp: requests at most one per catchUpGap
	requests   prometheus.Counter // produce requests sent; nil in tests
	// throttled and throttleSecs count responses carrying a throttle time
	// and the time asked (outbox_relay_kafka_throttled_requests_total,
	// _throttle_seconds_total); nil in tests.
	throttled, throttleSecs prometheus.Counter
	senderIdle              time.Duration // senderIdle, shorter in tests
	log                     zerolog.Logger
}

type failure struct {
	m   *Message
	err error
}

type dtopic struct {
	name   string
	limit  int        // the topic's max.message.bytes when below maxBatch (setLimit), else 0
	parts  []*dpart   // by partition index (sorted ids), nil until resolved
	early  []*Message // published before the partitions were known
	fixing bool       // a goroutine resolves the topic or its broken partitions
	hold   bool       // the partition count changed: new records wait in early (regroup)
	rr     int32      // round robin for records without a key
}

type dpart struct {
	topic  *dtopic
	id     int32
	leader *dbroker // nil while unknown (first use, after an error)
	queue  []*Message
	batch  *dbatch // in flight (sent), or failed and waiting for its resend
	sent   bool
	ready  bool  // on its leader's ready list
	pid    int64 // the producer id seq counts for
	epoch  int16
	seq    int32     // next sequence number
	due    time.Time // a failed batch is resent from then on
	single int       // records at the queue's head that go one per batch: a refused batch's
}

type dbatch struct {
	part     *dpart
	msgs     []*Message
	first    int64 // timestamp of the first record, ms since the epoch
	pid      int64
	epoch    int16
	seq      int32 // the first record's sequence number
	size     int
	attempts int
	got      bool  // the last response answered for the batch
	err      error // and this was its answer
}

type dbroker struct {
	b     *sarama.Broker // the leader as sarama's metadata knows it: its address
	id    int32
	addr  string
	until time.Time // throttled (KIP-219): the next request waits until then; the sender's own
	w     *wire     // the sender's connection, nil until dialed or after an error
	wake  chan struct{}
	ready []*dpart // partitions with queued records or a resend due
	spare []*dpart // build's other list, so it never writes the one it reads
	busy  bool     // a request is in flight
}

// Record size bounds as sarama counts them, so a batch never exceeds
// kafka.max_message_bytes on the wire.
const (
	batchOverhead  = 61 // v2 record batch header
	recordOverhead = 5*5 + 10 + 1
	headerOverhead = 2 * 5
	maxRequest     = 16 << 20
)

func newDirect(client sarama.Client, sc *sarama.Config, cfg Config, complete func(string, []*Message, error)) *direct {
	d := &direct{client: client, sc: sc, codec: sc.Producer.Compression, level: sc.Producer.CompressionLevel,
		wireVersion: wireVersion(sc.Version), timeout: int32(sc.Producer.Timeout / time.Millisecond),
		maxBatch: cfg.MaxMessageBytes, maxReq: max(maxRequest, 2*cfg.MaxMessageBytes),
		retryMax: cfg.RetryMax, retry: backoff.Policy{Initial: 100 * time.Millisecond, Max: cfg.RetryBackoffMax},
		complete: complete, pid: -1, epoch: -1, newPID: true,
		topics: map[string]*dtopic{}, nodes: map[int32]*dbroker{}, senders: map[*dbroker]struct{}{},
		senderIdle: senderIdle,
		idle:       make(chan struct{}), stopped: make(chan struct{}), wake: make(chan struct{}, 1)}
	return d
}

// produceVersion is the ProduceRequest version sarama's producer would send.
func produceVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V3_7_0_0):
		return 10
	case v.IsAtLeast(sarama.V2_8_0_0):
		return 9
	case v.IsAtLeast(sarama.V2_4_0_0):
		return 8
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 7
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 6
	case v.IsAtLeast(sarama.V1_0_0_0):
		return 5
	}
	return 3
}

// start takes the first producer id and starts the fixer.
func (d *direct) start() error {
	if err := d.renewPID(); err != nil {
		return err
	}
	go d.fixer()
	return nil
}

func (d *direct) renewPID() error {
	r, err := d.client.InitProducerID()
	if err == nil && !errors.Is(r.Err, sarama.ErrNoError) {
		err = r.Err
	}
	if err != nil {
		return fmt.Errorf("init producer id: %w", err)
	}
	d.mu.Lock()
	d.pid, d.epoch, d.newPID = r.ProducerID, r.ProducerEpoch, false
	d.mu.Unlock()
	return nil
}

func (d *direct) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// publish queues m; it never blocks (the pipeline bounds what is in flight).
func (d *direct) publish(m *Message) error {
	m.size = recordSize(m)
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		return ErrClosed
	}
	d.pending++
	if m.size+batchOverhead > d.maxBatch {
		// Poison, message_too_large (Classify), and certain at once
		// (Certain): the broker would refuse it, on every attempt.
		d.failed = append(d.failed, failure{m, &SoleError{fmt.Errorf("record of %d bytes exceeds kafka.max_message_bytes (%d): %w",
			m.size+batchOverhead, d.maxBatch, sarama.ErrMessageSizeTooLarge)}})
		d.mu.Unlock()
		d.signal(d.wake)
		return nil
	}
	t := d.topics[m.Topic]
	if t == nil {
		t = &dtopic{name: m.Topic, limit: d.limits[m.Topic]}
		d.topics[m.Topic] = t
	}
	if t.parts == nil || t.hold {
		t.early = append(t.early, m)
		start := !t.fixing && !t.hold
		t.fixing = t.fixing || start
		d.mu.Unlock()
		if start {
			go d.fix(t)
		}
		return nil
	}
	p, wake := d.place(t, m)
	fix := false
	if p.leader == nil && !t.fixing {
		t.fixing, fix = true, true // no leader known: the fix finds it
	}
	d.mu.Unlock()
	if wake != nil {
		d.signal(wake.wake)
	}
	if fix {
		go d.fix(t)
	}
	return nil
}

// place puts m on its partition's queue and returns the partition and the
// broker to wake, if any. Under mu; t is resolved.
func (d *direct) place(t *dtopic, m *Message) (*dpart, *dbroker) {
	var i int32
	n := int32(len(t.parts))
	if m.Key == nil {
		i = t.rr % n
		t.rr++
	} else {
		i = int32(murmur2(m.Key)&0x7fffffff) % n // the Java client's partition for the key
	}
	p := t.parts[i]
	m.Partition = p.id
	p.queue = append(p.queue, m)
	return p, d.markReady(p)
}

// markReady lists p with its leader if it has something to send; under mu.
func (d *direct) markReady(p *dpart) *dbroker {
	if p.ready || p.leader == nil || (p.batch == nil && len(p.queue) == 0) {
		return nil
	}
	if p.batch != nil && (p.sent || p.due.After(time.Now())) {
		return nil // the response, or the fix when the backoff ends, lists it
	}
	p.ready = true
	p.leader.ready = append(p.leader.ready, p)
	if p.leader.busy {
		return nil // the response wakes it
	}
	return p.leader
}

// fix resolves t's partitions and leaders, retrying until done, and lists
// the partitions whose resend is due. One goroutine per topic at a time: a
// topic without a leader (or not yet created) holds up only itself.
func (d *direct) fix(t *dtopic) {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}}
	for {
		wait, err := d.fixOnce(t)
		if err == nil && wait == 0 {
			return
		}
		if err != nil {
			wait = b.Next()
		}
		select {
		case <-d.stopped:
			return
		case <-time.After(wait):
		}
	}
}

// fixOnce does one pass of fix. It returns 0, nil when t needs nothing more
// (and has cleared t.fixing), or how long to wait for the next pass.
func (d *direct) fixOnce(t *dtopic) (time.Duration, error) {
	d.mu.Lock()
	resolved := t.parts != nil
	if !resolved && len(t.early) == 0 {
		t.fixing = false // failEarly completed them; a new record starts a new fix
		d.mu.Unlock()
		return 0, nil
	}
	d.mu.Unlock()
	if !resolved {
		ids, err := d.client.Partitions(t.name) // sarama retries metadata (metadataWatch counts it)
		if err == nil && len(ids) == 0 {
			err = sarama.ErrUnknownTopicOrPartition
		}
		if err != nil {
			d.failEarly(t, err)
			return 0, err
		}
		d.mu.Lock()
		t.parts = make([]*dpart, len(ids))
		for i, id := range ids {
			t.parts[i] = &dpart{topic: t, id: id, pid: -1}
		}
		early := t.early
		t.early = nil
		for _, m := range early {
			d.place(t, m) // no leader yet: listed below
		}
		d.mu.Unlock()
	}
	// Leaders: every partition without one (from the cached metadata, so
	// a record for another partition finds its leader known).
	d.mu.Lock()
	var need []*dpart
	stale := false
	for _, p := range t.parts {
		if p.leader == nil {
			need = append(need, p)
			stale = stale || p.batch != nil || len(p.queue) > 0
		}
	}
	d.mu.Unlock()
	if stale && resolved {
		_ = d.client.RefreshMetadata(t.name) // after an error: the leader may have moved
	}
	leaders := make(map[*dpart]*sarama.Broker, len(need))
	var lerr error
	for _, p := range need {
		b, err := d.client.Leader(t.name, p.id)
		if err != nil {
			if p.batch != nil || len(p.queue) > 0 {
				lerr = fmt.Errorf("leader of topic %s partition %d: %w", t.name, p.id, err)
			}
			continue
		}
		leaders[p] = b
	}
	now := time.Now()
	var next time.Duration
	var wake []*dbroker
	d.mu.Lock()
	for p, b := range leaders {
		p.leader = d.brokerFor(b)
	}
	broken := false
	for _, p := range t.parts {
		if p.batch == nil && len(p.queue) == 0 {
			continue
		}
		if p.leader == nil {
			broken = true
			continue
		}
		if p.batch != nil && p.due.After(now) && !p.ready {
			broken = true
			if w := p.due.Sub(now); next == 0 || w < next {
				next = w
			}
			continue
		}
		if w := d.markReady(p); w != nil {
			wake = append(wake, w)
		}
	}
	if !broken {
		t.fixing = false
	}
	d.mu.Unlock()
	for _, w := range wake {
		d.signal(w.wake)
	}
	if broken && next == 0 {
		if lerr == nil {
			lerr = errors.New("no leader yet")
		}
		return 0, lerr
	}
	return next, nil
}

// failEarly fails the records published to t before its partitions were
// known, when the metadata lookup gave up (sarama retried it for up to an
// hour): the pipeline rewinds and publishes them again.
func (d *direct) failEarly(t *dtopic, err error) {
	d.mu.Lock()
	early := t.early
	t.early = nil
	d.mu.Unlock()
	for _, m := range early {
		m.Partition = -1
	}
	d.finish(t.name, early, fmt.Errorf("partitions of topic %s: %w", t.name, err))
}

// setLimit keeps the batches of topic within its max.message.bytes, when
// that is below kafka.max_message_bytes (0: not known). A record larger
// than the limit still goes alone in its batch: with compression only the
// broker can tell whether it fits.
func (d *direct) setLimit(topic string, maxBytes int) {
	if maxBytes >= d.maxBatch {
		maxBytes = 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.limits == nil {
		d.limits = map[string]int{}
	}
	d.limits[topic] = maxBytes
	if t := d.topics[topic]; t != nil {
		t.limit = maxBytes
	}
}

// brokerFor returns the sender of b's broker id, starting one on first
// use or when the broker's address changed; under mu. Keyed by id, not by
// *sarama.Broker: sarama hands out a new Broker for the same node after a
// connection error and a metadata refresh.
func (d *direct) brokerFor(b *sarama.Broker) *dbroker {
	id, addr := b.ID(), b.Addr()
	db := d.nodes[id]
	if db == nil || db.addr != addr {
		// A replaced sender finishes what it has and retires when idle.
		db = &dbroker{b: b, id: id, addr: addr, wake: make(chan struct{}, 1)}
		d.nodes[id] = db
		d.senders[db] = struct{}{}
		go d.send(db)
	}
	return db
}

// senderIdle is how long a broker's sender waits with nothing to send
// before it checks whether it is still needed (retire).
const senderIdle = time.Minute

// retire ends db if nothing is queued on it or in flight and it leads no
// partition in use, or another sender replaced it (partitions it still
// leads go to that one: the same broker id). Under mu; true: db's sender
// returns.
func (d *direct) retire(db *dbroker) bool {
	if db.busy || len(db.ready) > 0 {
		return false
	}
	cur := d.nodes[db.id]
	for _, t := range d.topics {
		for _, p := range t.parts {
			if p.leader != db {
				continue
			}
			if cur == db || cur == nil || p.batch != nil || len(p.queue) > 0 {
				return false // leads a partition in use
			}
			p.leader = cur
		}
	}
	if cur == db {
		delete(d.nodes, db.id)
	}
	delete(d.senders, db)
	if db.w != nil {
		db.w.close()
		db.w = nil
	}
	return true
}

// catchUpGap is the least time between two produce requests to a broker
// while the replication stream catches up (Producer.CatchingUp). One
// request in flight batches whatever arrives during a round trip, but a
// broker on the same host answers in a few hundred microseconds: a backlog
// of one-row transactions went out in about three times as many requests
// (806 against 265 for 200k events), each one broker CPU. Live traffic is not held: an event
// goes out as soon as no request is in flight.
const catchUpGap = 5 * time.Millisecond

// send is a broker's sender: one request in flight at a time, at most one
// per catchUpGap while catching up.
func (d *direct) send(db *dbroker) {
	pace := time.NewTimer(time.Hour)
	pace.Stop()
	idle := time.NewTicker(d.senderIdle)
	defer idle.Stop()
	var last time.Time // when the last request left
	for {
		select {
		case <-d.stopped:
			return
		case <-db.wake:
		case now := <-idle.C:
			if now.Sub(last) < d.senderIdle {
				continue
			}
			d.mu.Lock()
			done := d.retire(db)
			d.mu.Unlock()
			if done {
				return
			}
			continue
		}
		if !db.until.IsZero() { // throttled: this broker's next request waits, no other's
			if wait := time.Until(db.until); wait > 0 {
				pace.Reset(wait)
				select {
				case <-d.stopped:
					return
				case <-pace.C:
				}
			}
			db.until = time.Time{}
		}
		if d.catchingUp.Load() { // live traffic reads no clock and waits for nothing
			if gap := catchUpGap - time.Since(last); gap > 0 {
				pace.Reset(gap) // records queued meanwhile go in the same request
				select {
				case <-d.stopped:
					return
				case <-pace.C:
				}
			}
		}
		d.mu.Lock()
		if db.busy || len(db.ready) == 0 {
			d.mu.Unlock()
			continue
		}
		batches := d.build(db)
		if len(batches) == 0 {
			d.mu.Unlock()
			continue
		}
		db.busy = true
		w := db.w
		d.mu.Unlock()
		last = time.Now()
		var err error
		if w != nil && w.expired(last) {
			w.close() // idle for long, or its SASL session ends soon
			w = nil
		}
		if w == nil {
			w, err = dialWire(db.b.Addr(), d.sc)
			d.mu.Lock()
			db.w = w
			if w != nil && d.isStopped() {
				w.close() // stop closed the connections it knew
			}
			d.mu.Unlock()
		}
		if err == nil {
			if d.requests != nil {
				d.requests.Inc()
			}
			var throttle time.Duration
			throttle, err = w.produce(d, batches)
			if throttle > 0 {
				d.throttle(db, throttle)
			}
			if err != nil {
				w.close() // the stream is out of step: the next request dials again
				d.mu.Lock()
				db.w = nil
				d.mu.Unlock()
			}
		}
		if err != nil && d.isStopped() {
			return // stop closed the connection: what is in flight stays unconfirmed
		}
		d.answer(db, batches, err)
	}
}

// throttle counts a response's throttle time and, for the versions the
// broker answers at once and then mutes the connection (KIP-219: Produce
// v6 and later), holds db's next request until it has passed. Before v6
// the broker delayed the response itself. On db's sender.
func (d *direct) throttle(db *dbroker, t time.Duration) {
	if d.throttled != nil {
		d.throttled.Inc()
		d.throttleSecs.Add(t.Seconds())
	}
	if d.wireVersion >= 6 {
		db.until = time.Now().Add(t)
	}
}

// isStopped reports whether stop ran.
func (d *direct) isStopped() bool {
	select {
	case <-d.stopped:
		return true
	default:
		return false
	}
}

// build turns the ready partitions of db into batches, within the request
// size; under mu. A partition whose failed batch is due sends that batch
// again, unchanged.
func (d *direct) build(db *dbroker) []*dbatch {
	var out []*dbatch
	total := 0
	ready := db.ready
	db.ready = db.spare[:0]
	defer func() { db.spare = ready[:0] }()
	now := time.Now()
	for i, p := range ready {
		if total >= d.maxReq {
			db.ready = append(db.ready, ready[i:]...)
			break
		}
		p.ready = false
		if p.leader != db {
			// Moved: list it with its new leader (or its fix will).
			if w := d.markReady(p); w != nil {
				d.signal(w.wake) // never blocks
			}
			continue
		}
		if p.batch == nil && d.newPID {
			continue // the fixer lists it once the new producer id is in
		}
		if p.batch != nil {
			if p.sent || p.due.After(now) {
				continue
			}
			p.sent = true
			out = append(out, p.batch)
			total += p.batch.size
			continue
		}
		if len(p.queue) == 0 {
			continue
		}
		b := d.newBatch(p)
		out = append(out, b)
		total += b.size
		if len(p.queue) > 0 {
			p.ready = true
			db.ready = append(db.ready, p)
		}
	}
	return out
}

// newBatch moves what fits of p's queue into a record batch with the next
// sequence numbers; under mu.
func (d *direct) newBatch(p *dpart) *dbatch {
	if p.pid != d.pid {
		p.pid, p.epoch, p.seq = d.pid, d.epoch, 0 // a new producer id counts from 0
	}
	limit := d.maxBatch
	if l := p.topic.limit; l > 0 {
		limit = l
	}
	size := batchOverhead
	n := 0
	for _, m := range p.queue {
		if n > 0 && (size+m.size > limit || p.single > 0) {
			break
		}
		size += m.size
		n++
	}
	if p.single > 0 {
		p.single--
	}
	b := &dbatch{part: p, msgs: p.queue[:n:n], size: size, pid: p.pid, epoch: p.epoch, seq: p.seq}
	p.queue = p.queue[n:]
	if len(p.queue) == 0 {
		p.queue = nil // let the backing array go with the batch
	}
	b.first = b.msgs[0].Timestamp.UnixMilli()
	if b.msgs[0].Timestamp.IsZero() {
		b.first = time.Now().UnixMilli() // kept: a resend encodes the same batch
	}
	p.seq = int32((int64(p.seq) + int64(n)) % (1 << 31)) // wraps to 0 after MaxInt32, as the broker expects
	p.batch, p.sent = b, true
	return b
}

// answer handles the broker's response to batches (or the error that
// stands for it). It runs on the broker's sender, which must not wait for
// metadata: a leader lookup goes to a fix goroutine.
func (d *direct) answer(db *dbroker, batches []*dbatch, reqErr error) {
	type verdict struct {
		topic string
		msgs  []*Message
		err   error
	}
	var done []verdict
	fixes := map[*dtopic]bool{}
	wakes := map[*dbroker]bool{}
	now := time.Now()
	d.mu.Lock()
	db.busy = false
	for _, b := range batches {
		p := b.part
		p.sent = false
		err := reqErr
		if err == nil {
			switch {
			case !b.got:
				err = sarama.ErrIncompleteResponse
			case b.err != nil && !errors.Is(b.err, sarama.ErrDuplicateSequenceNumber):
				// DUPLICATE_SEQUENCE_NUMBER: the broker has the batch
				// already (a resend of one it wrote), so it is acked, as
				// sarama and franz-go take it.
				err = b.err
			}
		}
		if err == nil {
			p.batch = nil
			done = append(done, verdict{p.topic.name, b.msgs, nil})
			if w := d.markReady(p); w != nil {
				wakes[w] = true
			}
			continue
		}
		reason, kind := Classify(err)
		b.attempts++
		switch {
		case kind == Transient && reason != "producer_state" && b.attempts <= d.retryMax:
			// Resend as it is: same producer id and sequence numbers, so a
			// batch the broker did write is dropped as a duplicate.
			p.due = now.Add(d.retry.Delay(b.attempts))
			p.leader = nil // the leader may have moved: look it up again
			unready(db, p)
			fixes[p.topic] = true
			done = append(done, verdict{p.topic.name, nil, err}) // counted, nothing completed
		case reqErr == nil && kind != Transient && len(b.msgs) > 1 && !Certain(err):
			// The broker refused a batch of several records for one of
			// them (too large, invalid): which one, only a batch of one
			// tells. Its sequence numbers were not taken: its records go
			// again from the queue's head, one per batch, no attempt
			// counted against any of them.
			p.batch = nil
			p.seq = b.seq
			p.queue = append(b.msgs[:len(b.msgs):len(b.msgs)], p.queue...)
			p.single = len(b.msgs)
			done = append(done, verdict{p.topic.name, nil, err}) // counted, nothing completed
			if w := d.markReady(p); w != nil {
				wakes[w] = true
			}
		case reqErr == nil && kind != Transient:
			// The broker refused the batch: its sequence numbers were not
			// taken, the next batch starts with them. A record alone in
			// its batch was refused for itself (Certain); a refusal of the
			// topic (authorization, an invalid name) holds for each record.
			p.batch = nil
			p.seq = b.seq
			if len(b.msgs) == 1 {
				err = &SoleError{err}
			}
			done = append(done, verdict{p.topic.name, b.msgs, err})
			if w := d.markReady(p); w != nil {
				wakes[w] = true
			}
		default:
			// Retries exhausted or the producer's state is off: whether
			// the broker wrote the batch is unknown, so the records queued
			// behind it fail too and the next batch goes out under a new
			// producer id.
			p.batch = nil
			msgs := append(b.msgs, p.queue...)
			p.queue, p.single = nil, 0
			done = append(done, verdict{p.topic.name, msgs, err})
			d.newPID = true
		}
	}
	if len(db.ready) > 0 {
		wakes[db] = true
	}
	var start []*dtopic
	for t := range fixes {
		if !t.fixing {
			t.fixing = true
			start = append(start, t)
		}
	}
	renew := d.newPID
	d.mu.Unlock()
	for w := range wakes {
		d.signal(w.wake)
	}
	for _, t := range start {
		go d.fix(t)
	}
	if renew {
		d.signal(d.wake)
	}
	for _, v := range done {
		d.finish(v.topic, v.msgs, v.err)
	}
}

// unready takes p off db's ready list; under mu.
func unready(db *dbroker, p *dpart) {
	if !p.ready {
		return
	}
	p.ready = false
	for i, q := range db.ready {
		if q == p {
			db.ready = append(db.ready[:i], db.ready[i+1:]...)
			return
		}
	}
}

// finish completes msgs (none: a failed attempt that is retried) and closes
// idle when the last record of a closing producer is done.
func (d *direct) finish(topic string, msgs []*Message, err error) {
	d.complete(topic, msgs, err)
	if len(msgs) == 0 {
		return
	}
	d.mu.Lock()
	d.pending -= len(msgs)
	last := d.closing && d.pending == 0
	d.mu.Unlock()
	if last {
		close(d.idle)
	}
}

// fixer takes a new producer id when a batch failed with an unknown
// outcome, and completes the records refused before a batch. New batches
// wait for the new id: a sequence under the old one could be a duplicate of
// the failed batch.
func (d *direct) fixer() {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}}
	for {
		select {
		case <-d.stopped:
			return
		case <-d.wake:
		}
		d.mu.Lock()
		failed := d.failed
		d.failed = nil
		renew := d.newPID
		d.mu.Unlock()
		for _, f := range failed {
			f.m.Partition = -1
			d.finish(f.m.Topic, []*Message{f.m}, f.err)
		}
		if !renew {
			continue
		}
		if err := d.renewPID(); err != nil {
			d.complete("", nil, err)
			select {
			case <-d.stopped:
				return
			case <-time.After(b.Next()):
			}
			d.signal(d.wake)
			continue
		}
		b.Reset()
		// Partitions that queued meanwhile go out under the new id.
		d.mu.Lock()
		var wakes []*dbroker
		for _, t := range d.topics {
			for _, p := range t.parts {
				if w := d.markReady(p); w != nil {
					wakes = append(wakes, w)
				}
			}
		}
		d.mu.Unlock()
		for _, w := range wakes {
			d.signal(w.wake)
		}
	}
}

// close stops accepting records; idle closes once every published record
// is completed.
func (d *direct) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return
	}
	d.closing = true
	if d.pending == 0 {
		close(d.idle)
	}
}

// stop ends the goroutines; records in flight are abandoned (their events
// stay unconfirmed).
func (d *direct) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.isStopped() {
		close(d.stopped)
	}
	for db := range d.senders {
		if db.w != nil {
			db.w.close() // a sender waiting for a response returns
		}
	}
}

// repartition starts holding topic's new records when its partition count
// changed to n (the topic gate saw it): regroup places them with the new
// count once the records already placed are done. A topic not resolved
// yet resolves with the count sarama's metadata has then.
func (d *direct) repartition(topic string, n int) {
	d.mu.Lock()
	t := d.topics[topic]
	if t == nil || t.parts == nil || t.hold || len(t.parts) == n {
		d.mu.Unlock()
		return
	}
	t.hold = true
	d.mu.Unlock()
	go d.regroup(t, n)
}

// regroupPoll is how often regroup checks whether a held topic's placed
// records are all done: a rare event, polling is simpler than a signal
// from every answer.
const regroupPoll = 20 * time.Millisecond

// regroup waits until no record of t is queued or in flight, reads its
// partitions again and places the held records with the new count. A
// partition that stays (more partitions) keeps its producer state; fewer
// partitions mean the topic was recreated: every partition starts afresh.
func (d *direct) regroup(t *dtopic, n int) {
	for {
		select {
		case <-d.stopped:
			return
		case <-time.After(regroupPoll):
		}
		d.mu.Lock()
		busy := false
		var gone []*Message
		for _, p := range t.parts {
			if int(p.id) >= n && (p.batch == nil || !p.sent) {
				// Fewer partitions: this one is gone, its records would
				// retry for kafka.retry_max. Never written (not in flight):
				// they fail and are published again with the new count.
				if p.batch != nil {
					gone = append(gone, p.batch.msgs...)
					p.batch = nil
				}
				gone = append(gone, p.queue...)
				p.queue, p.single = nil, 0
			}
			busy = busy || p.batch != nil || len(p.queue) > 0
		}
		d.mu.Unlock()
		if len(gone) > 0 {
			d.finish(t.name, gone, fmt.Errorf("topic %s has %d partitions now, the record's partition is gone: %w",
				t.name, n, sarama.ErrUnknownTopicOrPartition))
		}
		if !busy {
			break
		}
	}
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}}
	var ids []int32
	for try := 0; ; try++ {
		_ = d.client.RefreshMetadata(t.name)
		got, err := d.client.Partitions(t.name)
		if err == nil && len(got) > 0 {
			ids = got
			if len(ids) == n || try >= 10 {
				break // sarama's answer decides after a few tries: it leads the sends
			}
		}
		select {
		case <-d.stopped:
			return
		case <-time.After(b.Next()):
		}
	}
	d.mu.Lock()
	old := len(t.parts)
	if len(ids) != old {
		kept := map[int32]*dpart{}
		if len(ids) > old {
			for _, p := range t.parts {
				kept[p.id] = p
			}
		}
		parts := make([]*dpart, len(ids))
		for i, id := range ids {
			if parts[i] = kept[id]; parts[i] == nil {
				parts[i] = &dpart{topic: t, id: id, pid: -1}
			}
		}
		t.parts = parts
	}
	t.hold = false
	early := t.early
	t.early = nil
	var wakes []*dbroker
	fix := false
	for _, m := range early {
		p, w := d.place(t, m)
		if w != nil {
			wakes = append(wakes, w)
		}
		fix = fix || p.leader == nil
	}
	if fix && !t.fixing {
		t.fixing = true
	} else {
		fix = false
	}
	d.mu.Unlock()
	d.log.Warn().Str("topic", t.name).Int("old_partitions", old).Int("partitions", len(ids)).Int("held_events", len(early)).
		Msg("topic re-partitioned: every event placed before the change was acked or failed first; keys may have moved to another partition, so consumers reading both must not assume order across partitions")
	for _, w := range wakes {
		d.signal(w.wake)
	}
	if fix {
		go d.fix(t)
	}
}

// recordSize bounds m's size in a record batch, as sarama counts it.
func recordSize(m *Message) int {
	s := recordOverhead + len(m.Key) + len(m.Value)
	for i := range m.Headers {
		s += headerOverhead + len(m.Headers[i].Key) + len(m.Headers[i].Value)
	}
	return s
}

// murmur2 is Kafka's hash of a record key (the Java client's
// Utils.murmur2): the default partitioner takes it modulo the partitions.
func murmur2(data []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for ; len(data) >= 4; data = data[4:] {
		k := uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16 | uint32(data[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(data) {
	case 3:
		h ^= uint32(data[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
