package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/IBM/sarama"
	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/prometheus/client_golang/prometheus"
	gometrics "github.com/rcrowley/go-metrics"
	"github.com/rs/zerolog"
)

// sarama records go-metrics meters and histograms for every request, batch
// and record (request rate, size and latency, records per request, ... per
// broker and per topic: locked exponentially decaying samples, and meters
// ticked by a goroutine every 5 s). The relay never reads them (its own metrics
// are Prometheus'), and at low rates, one record per request, they cost a
// measurable share of each event's CPU. go-metrics has only a global switch;
// sarama is the only user of go-metrics in the relay.
func init() { gometrics.UseNilMetrics = true }

// Message is one record to publish. For each Publish that returned nil the
// producer reports the broker's verdict at most once, from one of its own
// goroutines: Done(err) when the record failed (the final error, after the
// engine's own retries); when the broker acked it (acks=all), Done(nil), or
// with the direct engine and an OnAcked function, the record's acked batch
// handed to that function instead, which then owns the record's completion.
// There is no verdict for a Publish that returned an error, nor for records
// still unacked when Run's ctx ends (the hard stop abandons them: their
// events stay unconfirmed), nor for records held while their topic is
// looked up when the producer stops (topicGate: abandoned the same way). Done must not block. TxnProducer never calls
// Done: its owner does, once the transaction's outcome is known.
type Message struct {
	Topic     string
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
	// Partition is set by the producer before the verdict: where the record
	// went (or was meant to go), -1 if it failed before a partition was
	// chosen.
	Partition int32
	// Acked is when the broker's ack came, set before Done(nil) by the
	// direct engine (one clock read per request, not per record); zero
	// with the sarama engine, and left unset when OnAcked takes the batch
	// (the function gets the time instead).
	Acked time.Time
	Done  func(err error)
	// Ref is the publisher's own (the relay's delivery): the producer
	// never reads it, and hands it back with the record to OnAcked.
	Ref any

	// rec is the sarama record the sarama engine hands over, allocated at
	// a Message's first Publish and kept, so that publishing it again
	// (after a failure) allocates nothing (the ProducerMessage, and the Key
	// and Value interface values, which point into it). A Message is
	// published again only after its Done ran, when sarama is done with
	// rec. A pointer, not a field: the direct engine never uses it, and a
	// Message is part of every event in flight (208 bytes less each).
	rec *saramaRecord
	// size bounds the record's bytes in a batch (recordSize), set by the
	// direct engine's publish so that building the batch need not count
	// again.
	size int
}

// Header is one header of a Message. It is sink's own type so that no
// package outside sink needs sarama's; its fields are sarama.RecordHeader's
// (the conversion below would not compile otherwise), so the sarama engines
// pass a Message's headers to sarama as they are (saramaHeaders) and the
// direct engine encodes them itself (wire.go): no copy per record.
type Header struct {
	Key, Value []byte
}

var _ = sarama.RecordHeader(Header{}) // the same fields: the same memory layout

// saramaHeaders is h as sarama's header type, over the same memory: sarama
// only reads a record's headers, and Header has RecordHeader's layout.
func saramaHeaders(h []Header) []sarama.RecordHeader {
	return unsafe.Slice((*sarama.RecordHeader)(unsafe.Pointer(unsafe.SliceData(h))), len(h))
}

// saramaRecord is what the sarama engine's Publish hands to sarama for a
// Message (Message.rec).
type saramaRecord struct {
	pm         sarama.ProducerMessage
	key, value sarama.ByteEncoder
}

// Producer publishes records with the engine kafka.producer names: direct
// (the default) or sarama's AsyncProducer. New allocates; Run connects
// (retrying until the cluster answers), then drains acks and errors until
// Close has flushed the producer or Run's ctx ends; Publish from any
// goroutine once Ready is closed; Close is idempotent.
type Producer struct {
	cfg     Config
	log     zerolog.Logger
	metrics *metrics

	sc        *sarama.Config
	client    sarama.Client
	health    sarama.Client        // fails fast: answers "is the cluster reachable?"
	ap        sarama.AsyncProducer // kafka.producer: sarama
	dp        *direct              // kafka.producer: direct
	gate      *topicGate           // before either engine: topics that do not exist, max.message.bytes
	published sync.Map             // topic -> prometheus.Counter, for direct
	connected atomic.Bool
	ready     chan struct{} // closed once connected: Publish may go
	closing   chan struct{} // closed by Close: flush and stop
	stopped   chan struct{} // closed when Run returns: Publish fails fast
	closeOnce sync.Once
	flushOnce sync.Once
	// dial connects the clients and the producer; tests swap in fakes.
	dial func(hc *sarama.Config) error
	// acked, if set (OnAcked), takes the direct engine's successful
	// batches whole instead of a Done(nil) per record.
	acked func(msgs []*Message, at time.Time)
	// Tests shorten the senders' idle time (0: senderIdle).
	senderIdle time.Duration

	// inputMu lets Publish run on several goroutines (the replication loop
	// and the retry queue) and never send on the input of a closed producer.
	inputMu sync.RWMutex
	closed  bool
}

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("kafka producer is closed")

type metrics struct {
	published *prometheus.CounterVec
	errors    *prometheus.CounterVec
	connected prometheus.Gauge
	requests  prometheus.Counter // produce requests of the direct engine
	// metadataRetries counts sarama's metadata retries (metadataWatch).
	metadataRetries prometheus.Counter
	missingTopics   prometheus.Gauge // topicGate
	// Partition counts the topic gate reads (partitionsFunc).
	partitionChanges *prometheus.CounterVec
	topicPartitions  *prometheus.GaugeVec
	// Throttle times in produce responses (direct engine).
	throttled, throttleSecs prometheus.Counter
}

// partitionsFunc is the topic gate's partitions callback: the metrics,
// then follow (the engine's response), on a change and when first seen
// (old 0).
func (m *metrics) partitionsFunc(follow func(topic string, old, n int)) func(topic string, old, n int) {
	return func(topic string, old, n int) {
		m.topicPartitions.WithLabelValues(topic).Set(float64(n))
		if old > 0 {
			m.partitionChanges.WithLabelValues(topic).Inc()
		}
		follow(topic, old, n)
	}
}

// Engine rules on a partition count change, for the gate's log.
const (
	ruleDrain  = "new events of the topic wait until every event already placed on it is acked or failed, then go to murmur2(key) modulo the new count"
	ruleFollow = "sarama's partitioner follows the new count at once, without waiting for the events in flight: a key that moves may have its next event written before its earlier ones"
)

// New validates cfg and builds the sarama configuration; it does not dial.
func New(cfg Config, log zerolog.Logger, reg prometheus.Registerer) (*Producer, error) {
	if err := cfg.Validate("kafka."); err != nil {
		return nil, err
	}
	sc, _ := saramaConfig(cfg) // Validate built it once already

	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_events_published_total",
			Help: "Events acked by Kafka (acks=all), by topic."}, []string{"topic"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_publish_errors_total",
			Help: "Failed produce attempts, by reason: sarama's internal retries and the errors it returns. Transient ones are retried for ever."},
			[]string{"reason"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_kafka_connected",
			Help: "1 while the producer can reach the Kafka cluster."}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_kafka_produce_requests_total",
			Help: "Produce requests sent (kafka.producer: direct); events published per request is the batching."}),
		metadataRetries: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_kafka_metadata_retries_total",
			Help: "Metadata requests sarama retried: a partition without a leader; publishing to it waits meanwhile."}),
		missingTopics: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_kafka_missing_topics",
			Help: "Topics events were routed to that do not exist: their events wait up to kafka.missing_topic_timeout, then are poison (unknown_topic). The log names them; so does outbox-relay check."}),
		partitionChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_kafka_partition_changes_total",
			Help: "Changes of a topic's partition count the relay saw (looked up every 5 min): keys may have moved to another partition. The log says what the relay did."}, []string{"topic"}),
		topicPartitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_relay_kafka_topic_partitions",
			Help: "Partitions of each topic the relay publishes to, as last looked up."}, []string{"topic"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_kafka_throttled_requests_total",
			Help: "Produce responses with a throttle time (a broker quota; kafka.producer: direct): that broker's next request waits it out."}),
		throttleSecs: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_kafka_throttle_seconds_total",
			Help: "Throttle time brokers asked for in produce responses, in seconds (kafka.producer: direct)."}),
	}
	for _, r := range Reasons {
		m.errors.WithLabelValues(r) // export zeros, so rate() and alerts work from the start
	}
	if reg != nil {
		reg.MustRegister(m.published, m.errors, m.connected, m.requests, m.metadataRetries, m.missingTopics,
			m.partitionChanges, m.topicPartitions, m.throttled, m.throttleSecs)
	}
	meta := &metadataWatch{retries: m.metadataRetries, log: log.With().Str("component", "sink").Logger()}
	base := sc.Metadata.Retry.BackoffFunc
	sc.Metadata.Retry.BackoffFunc = func(retries, maxRetries int) time.Duration {
		meta.retry()
		return base(retries, maxRetries)
	}
	routeSaramaLog(log, m.errors, meta)
	p := &Producer{cfg: cfg, sc: sc, metrics: m,
		ready: make(chan struct{}), closing: make(chan struct{}), stopped: make(chan struct{}),
		log: log.With().Str("component", "sink").Logger()}
	p.dial = p.dialCluster
	if cfg.Producer != ProducerSarama && (cfg.FlushFrequency > 0 || cfg.FlushMessages > 0 || cfg.FlushBytes > 0) {
		p.log.Warn().Dur("flush_frequency", cfg.FlushFrequency).Int("flush_messages", cfg.FlushMessages).Int("flush_bytes", cfg.FlushBytes).
			Msg("kafka.flush_* do not apply to kafka.producer: direct, which sends at once and batches while a request is in flight; they apply to kafka.producer: sarama and to the exactly-once producer")
	}
	return p, nil
}

func saramaConfig(cfg Config) (*sarama.Config, error) {
	sc := sarama.NewConfig()
	v, err := sarama.ParseKafkaVersion(cfg.Version)
	if err != nil {
		return nil, fmt.Errorf("kafka.version: %w", err)
	}
	sc.Version = v
	sc.ClientID = cfg.ClientID
	// Idempotence keeps per-partition order and drops broker-side duplicates
	// across retries; it requires acks=all and one request in flight.
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	// sarama retries a batch up to Retry.Max times (it sizes a per-partition
	// array by it, so "forever" is not an option). When they run out it
	// returns the error; the pipeline requeues a transient one, for ever,
	// so the relay never stops on it and nothing is dropped.
	sc.Producer.Retry.Max = cfg.RetryMax
	retry := backoff.Policy{Initial: 100 * time.Millisecond, Max: cfg.RetryBackoffMax}
	sc.Producer.Retry.BackoffFunc = func(retries, _ int) time.Duration {
		return retry.Delay(retries + 1)
	}
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner // same partition as the Java client for a key
	sc.Producer.Compression = compressions[cfg.Compression]
	sc.Producer.Flush.Frequency = cfg.FlushFrequency
	sc.Producer.Flush.Messages = cfg.FlushMessages
	sc.Producer.Flush.Bytes = cfg.FlushBytes
	sc.Producer.MaxMessageBytes = cfg.MaxMessageBytes
	sc.Metadata.Full = false
	// sarama fails a batch at once (and bumps the idempotent epoch, which can
	// reorder later records) when a metadata refresh fails after a broker
	// connection error. Retrying metadata for up to an hour instead keeps
	// the batch, its sequence numbers and the partition order intact while
	// the cluster is unreachable.
	// The wait starts short, so a topic the broker is creating (or a new
	// leader) costs a round trip or two, not seconds, and grows to 2 s, so
	// the 1800 retries still cover about an hour of outage.
	sc.Metadata.Retry.Max = 1800
	sc.Metadata.Retry.BackoffFunc = func(retries, _ int) time.Duration {
		return metadataBackoff.Delay(retries + 1) // sarama passes the retries made so far
	}
	// A missing topic is created by a metadata request only when the
	// operator opts in: otherwise any writer of the outbox could create
	// topics on the cluster.
	sc.Metadata.AllowAutoTopicCreation = cfg.AutoCreateTopics
	sc.Net.DialTimeout = 5 * time.Second
	sc.Net.ReadTimeout = 30 * time.Second
	sc.Net.WriteTimeout = 10 * time.Second
	if err := applySecurity(cfg, sc); err != nil {
		return nil, err
	}
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafka producer config: %w", err)
	}
	return sc, nil
}

// metadataBackoff paces sarama's metadata retries: 20 ms doubling to 2 s,
// without jitter (one client, one schedule).
var metadataBackoff = backoff.Policy{Initial: 20 * time.Millisecond, Max: 2 * time.Second, Jitter: backoff.Exact}

// connect dials the cluster, retrying with capped backoff until it succeeds,
// ctx ends or Close is called (errClosing). Each failure is logged; the
// relay stays not ready meanwhile.
func (p *Producer) connect(ctx context.Context) error {
	// One dialer, alone in its loop: a steady schedule reads better in logs.
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 10 * time.Second, Jitter: backoff.Exact}}
	hc := *p.sc
	hc.Metadata.Retry.Max = 1
	hc.Metadata.Retry.BackoffFunc = nil
	hc.Metadata.Retry.Backoff = 100 * time.Millisecond
	// The readiness probe must notice a silent (blackholed) broker within
	// seconds, not after the producer's 30 s read timeout.
	hc.Net.ReadTimeout = 5 * time.Second
	hc.Net.WriteTimeout = 5 * time.Second
	for {
		err := p.dial(&hc)
		if err == nil {
			p.setConnected(true)
			p.log.Info().Strs("brokers", p.cfg.Brokers).Str("producer", p.cfg.Producer).Msg("connected to kafka")
			return nil
		}
		var certErr *tls.CertificateVerificationError
		if errors.As(err, &certErr) {
			return fmt.Errorf("kafka broker certificate not trusted: %w; set kafka.tls.ca_file to the CA that signed it (kafka.tls.server_name if the name differs)", err)
		}
		if pv := (*ProduceVersionError)(nil); errors.As(err, &pv) {
			return err // a setting: retrying cannot help, the message names the fix
		}
		if IsAuthError(err) {
			return authError(p.cfg.SASL, err)
		}
		wait := b.Next()
		p.log.Warn().Err(err).Strs("brokers", p.cfg.Brokers).Dur("retry_in", wait).Msg("kafka not reachable; retrying")
		select {
		case <-ctx.Done():
			return fmt.Errorf("connect to kafka %v: %w", p.cfg.Brokers, ctx.Err())
		case <-p.closing:
			return errClosing
		case <-time.After(wait):
		}
	}
}

func (p *Producer) dialCluster(hc *sarama.Config) error {
	health, err := sarama.NewClient(p.cfg.Brokers, hc)
	if err != nil {
		return err
	}
	if err := health.RefreshMetadata(); err != nil {
		health.Close()
		return err
	}
	client, err := sarama.NewClient(p.cfg.Brokers, p.sc)
	if err != nil {
		health.Close()
		return err
	}
	g := newTopicGate(p.cfg.MissingTopicTimeout, p.cfg.Compression == "none", p.log)
	g.lookup, g.autoCreate = brokerLookup(client, p.sc, p.cfg.AutoCreateTopics), p.cfg.AutoCreateTopics
	g.fail, g.pass = p.complete, p.release
	g.missing = func(n int) { p.metrics.missingTopics.Set(float64(n)) }
	g.every = p.cfg.TopicRefresh
	if p.cfg.Producer != ProducerSarama {
		// health knows every broker (its metadata was just refreshed); client does not yet
		if err := checkProduceVersion(health, wireVersion(p.sc.Version), p.cfg.Version); err != nil {
			client.Close()
			health.Close()
			return err
		}
		d := newDirect(client, p.sc, p.cfg, p.complete)
		d.requests, d.throttled, d.throttleSecs = p.metrics.requests, p.metrics.throttled, p.metrics.throttleSecs
		d.log = p.log
		if p.senderIdle > 0 {
			d.senderIdle = p.senderIdle
		}
		if err := d.start(); err != nil {
			client.Close()
			health.Close()
			return err
		}
		g.limit = d.setLimit
		// First seen too: the engine may have resolved the topic from
		// sarama's older metadata (repartition does nothing if it agrees).
		g.partitions = p.metrics.partitionsFunc(func(topic string, _, n int) { d.repartition(topic, n) })
		g.rule = ruleDrain
		p.health, p.client, p.dp, p.gate = health, client, d, g
		go g.refresh(nil)
		return nil
	}
	ap, err := sarama.NewAsyncProducerFromClient(client)
	if err != nil {
		client.Close()
		health.Close()
		return err
	}
	// sarama's partitioner reads its own metadata: refreshed now, it
	// follows the new count at once.
	g.partitions = p.metrics.partitionsFunc(func(topic string, old, _ int) {
		if old > 0 {
			_ = client.RefreshMetadata(topic)
		}
	})
	g.rule = ruleFollow
	p.health, p.client, p.ap, p.gate = health, client, ap, g
	go g.refresh(nil)
	return nil
}

// OnAcked makes the direct engine hand each acked record batch (records
// of one partition, in the order published) to f in one call, with the
// time the broker's answer came, instead of calling each record's Done(nil):
// the acks of a batch can then be counted together. f owns every record's
// completion (it calls Done for those it does not handle itself). Failures
// still go to each Done. f is called from the broker's sender goroutine and
// must not block. Call it before Run; the sarama engine ignores it.
func (p *Producer) OnAcked(f func(msgs []*Message, at time.Time)) { p.acked = f }

// complete is the direct engine's verdict on msgs, all of topic: the
// metrics, then each record's Done. No msgs: an attempt that failed and is
// retried, counted only.
func (p *Producer) complete(topic string, msgs []*Message, err error) {
	if err == nil {
		p.setConnected(true)
		c, ok := p.published.Load(topic)
		if !ok {
			c, _ = p.published.LoadOrStore(topic, p.metrics.published.WithLabelValues(topic))
		}
		c.(prometheus.Counter).Add(float64(len(msgs)))
		now := time.Now()
		if p.acked != nil {
			p.acked(msgs, now)
			return
		}
		for _, m := range msgs {
			m.Acked = now
			m.Done(nil)
		}
		return
	}
	reason, _ := Classify(err)
	p.metrics.errors.WithLabelValues(reason).Add(float64(max(len(msgs), 1)))
	if reason == "network" {
		p.setConnected(false)
	}
	for _, m := range msgs {
		m.Done(fmt.Errorf("publish to topic %s partition %d: %w", topic, m.Partition, err))
	}
}

// Connected reports whether the cluster was reachable at the last check.
func (p *Producer) Connected() bool { return p.connected.Load() }

func (p *Producer) setConnected(ok bool) {
	if p.connected.Load() == ok || p.connected.Swap(ok) == ok {
		return // unchanged: the common case, once per ack
	}
	if ok {
		p.metrics.connected.Set(1)
	} else {
		p.metrics.connected.Set(0)
	}
}

// Ready is closed once Run has connected to the cluster.
func (p *Producer) Ready() <-chan struct{} { return p.ready }

// errClosing ends a connect that Close cut short.
var errClosing = errors.New("kafka producer closed before it connected")

// Run connects, then drains acks and errors and probes the cluster every
// few seconds for readiness, until Close has flushed every buffered record
// or ctx ends. ctx ending is the hard stop: records still unacked are
// abandoned (their events stay unconfirmed; the slot keeps them). Run
// returns nil on a stop, or why it could not connect (bad credentials, an
// untrusted certificate).
func (p *Producer) Run(ctx context.Context) error {
	defer close(p.stopped)
	if err := p.connect(ctx); err != nil {
		if errors.Is(err, errClosing) || ctx.Err() != nil {
			return nil
		}
		return err
	}
	close(p.ready)
	select {
	case <-p.closing: // Close ran while we connected and may not have seen ready
		p.flush()
	default:
	}
	var drained <-chan struct{}
	if p.dp != nil {
		drained = p.dp.idle
	} else {
		drained = p.drain()
	}
	// The readiness probe runs on its own: a metadata request to a silent
	// broker takes seconds, and Run must see its ctx end at once.
	stopProbe, probed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(probed)
		t := time.NewTicker(3 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProbe:
				return
			case <-t.C:
			}
			p.setConnected(p.health.RefreshMetadata() == nil)
		}
	}()
	defer p.closeClients(stopProbe, probed)
	select {
	case <-drained: // after Close: every buffered record was acked or failed
	case <-ctx.Done():
		p.log.Warn().Msg("kafka producer not drained by the shutdown deadline; unacked events will be resent after restart")
	}
	return nil
}

// drain hands sarama's acks and errors to each record's Done; the channel
// closes once both are drained (after Close).
func (p *Producer) drain() <-chan struct{} {
	drained := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		// The counter of each topic, looked up once: the topics are few
		// (kafka.max_topics bounds them) and WithLabelValues per ack cost a
		// hash and a lock per event.
		published := map[string]prometheus.Counter{}
		for msg := range p.ap.Successes() {
			p.setConnected(true)
			c := published[msg.Topic]
			if c == nil {
				c = p.metrics.published.WithLabelValues(msg.Topic)
				published[msg.Topic] = c
			}
			c.Inc()
			if m, ok := msg.Metadata.(*Message); ok {
				m.Partition = msg.Partition
				m.Done(nil)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for perr := range p.ap.Errors() {
			reason, _ := Classify(perr.Err)
			p.metrics.errors.WithLabelValues(reason).Inc()
			if reason == "network" {
				p.setConnected(false)
			}
			if m, ok := perr.Msg.Metadata.(*Message); ok {
				m.Partition = perr.Msg.Partition
				m.Done(fmt.Errorf("publish to topic %s partition %d: %w", perr.Msg.Topic, perr.Msg.Partition, perr.Err))
			}
		}
	}()
	go func() {
		wg.Wait()
		close(drained)
	}()
	return drained
}

// closeClients stops the probe and closes both clients. Closing a sarama
// broker waits for its response reader, which a silent broker holds for the
// read timeout: after closeTimeout the rest is left to finish on its own, so
// a stop stays within the shutdown deadline.
func (p *Producer) closeClients(stopProbe chan struct{}, probed <-chan struct{}) {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		close(stopProbe)
		if p.gate != nil {
			p.gate.close()
		}
		_ = p.health.Close() // cuts a metadata request in flight
		<-probed
		if p.dp != nil {
			p.dp.stop()
		}
		_ = p.client.Close()
	}()
	select {
	case <-closed:
	case <-time.After(closeTimeout):
		p.log.Warn().Dur("timeout", closeTimeout).Msg("kafka connections not closed in time; leaving them to the exit")
	}
	p.setConnected(false)
}

// closeTimeout bounds closing the clients at the end of Run.
const closeTimeout = time.Second

// CatchingUp tells the producer whether its input is a backlog (the
// replication stream far behind the server's WAL end). While it is, the
// direct engine sends at most one request per broker every few
// milliseconds, so records go in large batches; live events are never held.
// Safe from any goroutine; the sarama engine batches by its own settings.
func (p *Producer) CatchingUp(on bool) {
	p.inputMu.RLock()
	defer p.inputMu.RUnlock()
	if p.dp != nil {
		p.dp.catchingUp.Store(on)
	}
}

// Publish hands m to the producer; its verdict comes later (Message). The
// direct engine never blocks (the caller bounds what is in flight); the
// sarama engine blocks while sarama's input is full (backpressure), until
// ctx ends, or until Run has returned. It returns ErrClosed after Close.
// Safe for concurrent use; records published from one goroutine keep their
// order. m is the producer's until its verdict: publish it again only after.
func (p *Producer) Publish(ctx context.Context, m *Message) error {
	p.inputMu.RLock()
	defer p.inputMu.RUnlock()
	if p.closed || (p.ap == nil && p.dp == nil) {
		return ErrClosed
	}
	if p.gate != nil && !p.gate.admit(m) {
		return nil // held until its topic exists, or refused: the verdict comes later
	}
	return p.send(ctx, m)
}

// release hands a record the topic gate held to the engine, once its topic
// exists; ErrClosed after Close.
func (p *Producer) release(m *Message) error {
	p.inputMu.RLock()
	defer p.inputMu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	return p.send(context.Background(), m) // the sarama engine's wait ends with Run (stopped)
}

// send hands m to the engine; under inputMu (read).
func (p *Producer) send(ctx context.Context, m *Message) error {
	if p.dp != nil {
		return p.dp.publish(m) // never blocks: the pipeline bounds what is in flight
	}
	if m.rec == nil {
		m.rec = new(saramaRecord)
	}
	r := m.rec
	r.key, r.value = m.Key, m.Value
	r.pm = sarama.ProducerMessage{ // every field, also sarama's own (retries), starts afresh
		Topic:     m.Topic,
		Headers:   saramaHeaders(m.Headers),
		Timestamp: m.Timestamp,
		Partition: -1, // the partitioner sets it; a record refused before that keeps -1
		Metadata:  m,
	}
	if m.Key != nil {
		r.pm.Key = &r.key
	}
	if m.Value != nil {
		r.pm.Value = &r.value
	}
	pm := &r.pm
	select {
	case p.ap.Input() <- pm:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.stopped:
		return ErrClosed
	}
}

// Close asks the producer to stop: no Publish is accepted from now on and
// the records already buffered are flushed; Run returns once they are acked
// (or its ctx ends). Idempotent; does not block beyond a Publish in progress.
func (p *Producer) Close() {
	p.closeOnce.Do(func() {
		close(p.closing)
		p.inputMu.Lock() // waits for a Publish blocked on a full input (it ends with Run)
		p.closed = true
		p.inputMu.Unlock()
		select {
		case <-p.ready:
			p.flush()
		default: // not connected: Run returns from connect (or flushes itself)
		}
	})
}

// flush starts the engine's graceful close once: buffered records go out,
// then the direct engine's idle, or sarama's Successes and Errors, close.
func (p *Producer) flush() {
	p.flushOnce.Do(func() {
		if p.dp != nil {
			p.dp.close()
			return
		}
		p.ap.AsyncClose()
	})
}
