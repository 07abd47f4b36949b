package sink

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// TxnProducer is a transactional sarama AsyncProducer (delivery:
// exactly_once): records go out inside a Kafka transaction that Commit
// makes visible to read_committed consumers all at once, or Abort drops.
// Open initialises it with InitProducerId, which fences every older
// producer with the same transactional id: their open transaction is
// aborted and nothing they send afterwards is accepted.
//
// It is used by one owner at a time (the relay's batcher, under its lock):
// Begin, Send..., Commit or Abort. Done of a sent Message is not called by
// the producer: the owner calls it once the transaction's outcome is known.
type TxnProducer struct {
	cfg     Config
	id      string
	sc      *sarama.Config
	log     zerolog.Logger
	metrics *metrics

	client    sarama.Client
	ap        sarama.AsyncProducer
	connected atomic.Bool
	drained   chan struct{} // closed when the current producer's Successes and Errors are closed

	mu       sync.Mutex
	sent     int
	returned int
	failed   map[*Message]error // per record errors of the current transaction
	changed  chan struct{}      // closed and replaced when returned reaches sent
	refused  error              // a record of the transaction the gate refused: Commit must not commit

	// gate looks up the topics records are sent to (topicGate.wait), with
	// the current producer's client (lookupClient).
	gate         *topicGate
	refreshStop  chan struct{} // ends the gate's refresh of this Open
	lookupClient atomic.Value  // sarama.Client
}

// NewTxn validates cfg and builds the transactional sarama configuration
// (kafka.* plus transactional.id id and transaction.timeout.ms timeout); it
// does not dial.
func NewTxn(cfg Config, id string, timeout time.Duration, log zerolog.Logger) (*TxnProducer, error) {
	if err := cfg.Validate("kafka."); err != nil {
		return nil, err
	}
	sc, _ := saramaConfig(cfg)
	// Records of a transaction become visible at its commit, never before:
	// a linger costs them no latency and makes fewer, larger requests (the
	// exactly-once drain was measured with 1 ms).
	sc.Producer.Flush.Frequency = max(sc.Producer.Flush.Frequency, time.Millisecond)
	sc.Producer.Idempotent = true
	sc.Net.MaxOpenRequests = 1
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Transaction.ID = id
	sc.Producer.Transaction.Timeout = timeout
	// Coordinator requests (AddPartitionsToTxn, EndTxn) are retried by
	// sarama for about 16 s, then the error comes back: the relay aborts and
	// rewinds, or builds a new producer, and tries again.
	sc.Producer.Transaction.Retry.Max = 50
	sc.Producer.Transaction.Retry.Backoff = 200 * time.Millisecond
	// Right after a commit the coordinator is still writing its markers and
	// answers the next transaction's AddPartitionsToTxn with
	// CONCURRENT_TRANSACTIONS for a few milliseconds (a drain measured 2 to
	// 30 ms, one to four retries per Kafka transaction), and the producer
	// sends nothing meanwhile: retry every millisecond at first, so the
	// wait ends within a millisecond of the markers, then back off.
	sc.Producer.Transaction.Retry.BackoffFunc = txnRetryBackoff
	// A record error ends the transaction (abort, rewind, a new
	// transaction), so sarama's own retries of a record are bounded, where
	// the at-least-once producer retries for kafka.retry_max; but they
	// outlast a leader's failover (a killed broker is fenced after
	// broker.session.timeout.ms, 9 s by default): with 5 retries (about
	// 3 s) a leader killed under load aborted a Kafka transaction and
	// published its records again (the three-node cluster scenario), with
	// these none did. About 26 s in all, within the transaction timeout.
	sc.Producer.Retry.Max = min(cfg.RetryMax, txnRecordRetries)
	sc.Producer.Retry.BackoffFunc = func(retries, _ int) time.Duration { return txnRecordRetry.Delay(retries) }
	// A transaction must not wait an hour for a metadata refresh: a failure
	// ends it (abort, rewind) and the next one waits for the cluster.
	sc.Metadata.Retry.Max = 10
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafka transactional producer config: %w", err)
	}
	p := &TxnProducer{cfg: cfg, id: id, sc: sc, log: log.With().Str("component", "sink").Str("transactional_id", id).Logger(),
		failed: map[*Message]error{}, changed: make(chan struct{})}
	// A topic's max.message.bytes and partition count are read when it is
	// first used and again every describeRefresh while the producer is open.
	p.gate = newTopicGate(cfg.MissingTopicTimeout, cfg.Compression == "none", p.log)
	p.gate.rule, p.gate.every = ruleFollow, cfg.TopicRefresh
	p.gate.autoCreate = cfg.AutoCreateTopics
	p.gate.lookup = func(topic string) (topicMeta, error) {
		c, _ := p.lookupClient.Load().(sarama.Client)
		if c == nil || c.Closed() {
			return topicMeta{}, sarama.ErrNotConnected
		}
		return brokerLookup(c, sc, cfg.AutoCreateTopics)(topic)
	}
	return p, nil
}

// txnRetryBackoff paces sarama's retries of a coordinator request (the
// retries made so far in this request): 1 ms for the first quickTxnRetries,
// then 2 ms doubling to 500 ms.
func txnRetryBackoff(retries, _ int) time.Duration {
	if retries < quickTxnRetries {
		return time.Millisecond
	}
	return txnRetry.Delay(retries - quickTxnRetries + 1)
}

const quickTxnRetries = 10

// txnRecordRetries and txnRecordRetry: sarama's retries of a record in a
// Kafka transaction, 100 ms doubling to 5 s (26 s over the ten).
const txnRecordRetries = 10

var txnRecordRetry = backoff.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: backoff.Exact}

var txnRetry = backoff.Policy{Initial: 2 * time.Millisecond, Max: 500 * time.Millisecond, Jitter: backoff.Exact}

// SetMetrics counts published records and errors in the same series as
// the at-least-once producer (outbox_relay_events_published_total, ...).
func (p *TxnProducer) SetMetrics(pr *Producer) {
	p.metrics = pr.metrics
	p.gate.missing = func(n int) { pr.metrics.missingTopics.Set(float64(n)) }
	p.gate.partitions = pr.metrics.partitionsFunc(func(topic string, old, _ int) {
		if c, _ := p.lookupClient.Load().(sarama.Client); old > 0 && c != nil && !c.Closed() {
			_ = c.RefreshMetadata(topic) // sarama's partitioner follows its metadata
		}
	})
}

// Open connects and initialises the producer (InitProducerId: fences older
// producers with the same transactional id), retrying until ctx ends.
// Authentication and certificate errors are returned at once.
func (p *TxnProducer) Open(ctx context.Context) error {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Jitter: backoff.Exact}}
	for {
		err := p.open()
		if err == nil {
			p.SetConnected(true)
			p.log.Info().Strs("brokers", p.cfg.Brokers).Msg("transactional producer initialised (older producers with this transactional id are fenced)")
			return nil
		}
		if IsAuthError(err) {
			return authError(p.cfg.SASL, err)
		}
		if errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed) || errors.Is(err, sarama.ErrClusterAuthorizationFailed) {
			return fmt.Errorf("init transactional producer %q: %w; grant the relay's Kafka user Write on TransactionalId %q (and IdempotentWrite on the cluster)", p.id, err, p.id)
		}
		wait := b.Next()
		p.log.Warn().Err(err).Dur("retry_in", wait).Msg("cannot initialise the transactional producer yet; retrying")
		select {
		case <-ctx.Done():
			return fmt.Errorf("init transactional producer %q: %w", p.id, ctx.Err())
		case <-time.After(wait):
		}
	}
}

func (p *TxnProducer) open() error {
	client, err := sarama.NewClient(p.cfg.Brokers, p.sc)
	if err != nil {
		return err
	}
	ap, err := sarama.NewAsyncProducerFromClient(client) // InitProducerId
	if err != nil {
		client.Close()
		return err
	}
	p.client, p.ap = client, ap
	p.lookupClient.Store(client)
	p.refreshStop = make(chan struct{})
	go p.gate.refresh(p.refreshStop)
	p.mu.Lock()
	p.sent, p.returned, p.refused = 0, 0, nil
	clear(p.failed)
	p.mu.Unlock()
	p.drained = make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for msg := range ap.Successes() {
			if m, ok := msg.Metadata.(*Message); ok {
				m.Partition = msg.Partition
				if p.metrics != nil && m.Done != nil { // not the checkpoint record
					p.metrics.published.WithLabelValues(msg.Topic).Inc()
				}
			}
			p.returnedOne(nil, nil)
		}
	}()
	go func() {
		defer wg.Done()
		for perr := range ap.Errors() {
			reason, _ := Classify(perr.Err)
			if p.metrics != nil {
				p.metrics.errors.WithLabelValues(reason).Inc()
			}
			m, _ := perr.Msg.Metadata.(*Message)
			if m != nil {
				m.Partition = perr.Msg.Partition
			}
			p.returnedOne(m, fmt.Errorf("publish to topic %s partition %d: %w", perr.Msg.Topic, perr.Msg.Partition, perr.Err))
		}
	}()
	drained := p.drained
	go func() { wg.Wait(); close(drained) }()
	return nil
}

func (p *TxnProducer) returnedOne(m *Message, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.returned++
	if err != nil && m != nil {
		p.failed[m] = err
	}
	// Only settle and Sync wait, and only for every record back: a wake-up
	// (and a new channel) per record would cost more than the record.
	if p.returned >= p.sent {
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// Connected reports whether the last transaction (or Open) went through.
func (p *TxnProducer) Connected() bool { return p.connected.Load() }

// SetConnected records the outcome of the last transaction.
func (p *TxnProducer) SetConnected(ok bool) {
	p.connected.Store(ok)
	if p.metrics != nil {
		if ok {
			p.metrics.connected.Set(1)
		} else {
			p.metrics.connected.Set(0)
		}
	}
}

// ErrNotCompacted is wrapped by EnsureCheckpointTopic's refusal of a
// checkpoint topic that retention may delete.
var ErrNotCompacted = errors.New("checkpoint topic is not compacted")

// CheckTopic creates the compacted checkpoint topic, or checks that the
// one there is compacted (EnsureCheckpointTopic). It blocks on the network.
// A refusal of the relay's credentials comes back as one IsAuthError
// knows, naming the keys to check.
func (p *TxnProducer) CheckTopic(topic string) error {
	err := EnsureCheckpointTopic(p.cfg, topic)
	if err != nil && IsAuthError(err) {
		return authError(p.cfg.SASL, err)
	}
	return err
}

// Begin starts a transaction.
func (p *TxnProducer) Begin() error { return p.ap.BeginTxn() }

// Send hands m to the open transaction; it blocks while sarama's input is
// full, while m's topic is looked up (up to kafka.missing_topic_timeout:
// the Kafka transactions go in order, the later ones wait anyway), or until
// ctx ends. A record the gate refuses (its topic missing, too large for the
// topic) fails like one the broker refused, and the transaction is not
// committed (Commit).
func (p *TxnProducer) Send(ctx context.Context, m *Message) error {
	if p.gate != nil {
		if err := p.gate.wait(ctx, m); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p.mu.Lock()
			p.sent++
			if p.refused == nil {
				p.refused = err
			}
			p.mu.Unlock()
			p.returnedOne(m, fmt.Errorf("publish to topic %s: %w", m.Topic, err))
			return nil
		}
	}
	pm := &sarama.ProducerMessage{Topic: m.Topic, Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value),
		Headers: saramaHeaders(m.Headers), Timestamp: m.Timestamp, Partition: -1, Metadata: m}
	p.mu.Lock()
	p.sent++
	p.mu.Unlock()
	select {
	case p.ap.Input() <- pm:
		return nil
	case <-ctx.Done():
		p.returnedOne(nil, nil) // never handed over
		return ctx.Err()
	}
}

// Commit flushes the transaction's records and commits it. It returns the
// outcome and the records' own errors (nil when Commit succeeded). An error
// from Commit itself (EndTxn attempted) leaves the outcome unknown: build a
// new producer and read the checkpoint to learn it.
func (p *TxnProducer) Commit(ctx context.Context) (err error, records map[*Message]error) {
	p.mu.Lock()
	refused := p.refused
	p.mu.Unlock()
	if refused != nil {
		// Never commit the others without it: the owner aborts.
		return fmt.Errorf("not committed, a record was refused before it was sent: %w", refused), p.settle(ctx)
	}
	err = p.ap.CommitTxn() // waits until every record sent has returned
	return err, p.settle(ctx)
}

// Abort drops the open transaction.
func (p *TxnProducer) Abort(ctx context.Context) (err error, records map[*Message]error) {
	err = p.ap.AbortTxn()
	return err, p.settle(ctx)
}

// settle waits until every record sent in the transaction has come back
// from sarama's channels, then returns their errors and starts over.
func (p *TxnProducer) settle(ctx context.Context) map[*Message]error {
	take := func() map[*Message]error { // caller holds mu
		failed := p.failed
		p.failed = map[*Message]error{}
		p.sent, p.returned, p.refused = 0, 0, nil
		return failed
	}
	for {
		p.mu.Lock()
		if p.returned >= p.sent || ctx.Err() != nil {
			defer p.mu.Unlock()
			return take()
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

// Sync waits until every record sent so far has come back and returns
// m's own error, if it failed. Sending one record at a time with Sync is
// the only way to tell which record of a transaction the broker refused:
// once one failed, sarama fails the later ones with the same error.
func (p *TxnProducer) Sync(ctx context.Context, m *Message) error {
	for {
		p.mu.Lock()
		if p.returned >= p.sent {
			err := p.failed[m]
			p.mu.Unlock()
			return err
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Status is sarama's transaction state (for logs and the fatal check).
func (p *TxnProducer) Status() sarama.ProducerTxnStatusFlag { return p.ap.TxnStatus() }

// Fatal reports whether the producer can run no more transactions: it was
// fenced (another producer with the same transactional id initialised, or
// transaction.timeout.ms passed and the coordinator bumped the epoch) or
// hit another fatal error. Close it and Open a new one.
func (p *TxnProducer) Fatal() bool { return p.ap.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0 }

// IsFenced reports whether err says another producer took the
// transactional id over (or the epoch was bumped after a timeout).
func IsFenced(err error) bool {
	return errors.Is(err, sarama.ErrProducerFenced) || errors.Is(err, sarama.ErrInvalidProducerEpoch) ||
		errors.Is(err, sarama.ErrInvalidProducerIDMapping)
}

// Close closes the producer and its client. Records of an open transaction
// are not committed (the coordinator aborts it after its timeout, or the
// next producer's Open does at once). Bounded by closeTimeout.
func (p *TxnProducer) Close() {
	if p.ap == nil {
		return
	}
	p.connected.Store(false)
	close(p.refreshStop)
	ap, client, drained := p.ap, p.client, p.drained
	p.ap, p.client = nil, nil
	done := make(chan struct{})
	go func() {
		defer close(done)
		ap.AsyncClose()
		<-drained
		_ = client.Close()
	}()
	select {
	case <-done:
	case <-time.After(5 * closeTimeout):
		p.log.Warn().Msg("transactional producer not closed in time; leaving it to finish on its own")
	}
}

// Opened reports whether the producer is open.
func (p *TxnProducer) Opened() bool { return p.ap != nil }

// EnsureCheckpointTopic creates topic (1 partition, cleanup.policy=compact,
// replication factor min(3, brokers)) when it is missing, and refuses an
// existing topic that is not compacted: a deleted checkpoint would make the
// relay publish again what it already committed.
func EnsureCheckpointTopic(cfg Config, topic string) error {
	sc, err := saramaConfig(cfg)
	if err != nil {
		return err
	}
	sc.Metadata.Retry.Max = 3
	sc.Metadata.Retry.BackoffFunc = nil
	sc.Metadata.Full = true // the admin client refreshes all topics
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("exactly_once.checkpoint_topic %s: kafka admin: %w", topic, err)
	}
	defer admin.Close()
	metas, err := admin.DescribeTopics([]string{topic})
	if err != nil {
		return fmt.Errorf("exactly_once.checkpoint_topic %s: describe: %w", topic, err)
	}
	if len(metas) == 1 && errors.Is(metas[0].Err, sarama.ErrUnknownTopicOrPartition) {
		brokers, _, err := admin.DescribeCluster()
		if err != nil {
			return fmt.Errorf("exactly_once.checkpoint_topic %s: describe cluster: %w", topic, err)
		}
		compact := "compact"
		err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: int16(min(3, max(1, len(brokers)))),
			ConfigEntries: map[string]*string{"cleanup.policy": &compact}}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("exactly_once.checkpoint_topic %s: create: %w; create it yourself with 1 partition and cleanup.policy=compact, or grant the relay's Kafka user Create", topic, err)
		}
		if err == nil {
			return nil
		}
	} else if len(metas) == 1 && metas[0].Err != sarama.ErrNoError {
		return fmt.Errorf("exactly_once.checkpoint_topic %s: describe: %w", topic, metas[0].Err)
	}
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"cleanup.policy"}})
	if err != nil {
		return fmt.Errorf("exactly_once.checkpoint_topic %s: describe config: %w", topic, err)
	}
	for _, e := range entries {
		if e.Name == "cleanup.policy" && !slices.Contains(strings.Split(e.Value, ","), "compact") {
			return fmt.Errorf("exactly_once.checkpoint_topic %s has cleanup.policy=%s: %w, and a checkpoint deleted by retention would make the relay publish again what it already committed; "+
				"set cleanup.policy=compact on it (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact) or choose another exactly_once.checkpoint_topic",
				topic, e.Value, ErrNotCompacted, topic)
		}
	}
	return nil
}

// ReadCheckpoint reads partition 0 of topic to its end as a read_committed
// consumer and returns the value of the last committed record with key
// (nil when there is none). The end is the high watermark when the read
// starts, read once the last stable offset reached it: a producer fenced
// before the call can have nothing committed after the returned record.
// It gives up when ctx ends.
func (p *TxnProducer) ReadCheckpoint(ctx context.Context, topic string, key []byte) ([]byte, error) {
	client := p.client
	if err := client.RefreshMetadata(topic); err != nil {
		return nil, fmt.Errorf("checkpoint topic %s: metadata: %w", topic, err)
	}
	end, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		return nil, fmt.Errorf("checkpoint topic %s: end offset: %w", topic, err)
	}
	offset, err := client.GetOffset(topic, 0, sarama.OffsetOldest)
	if err != nil {
		return nil, fmt.Errorf("checkpoint topic %s: start offset: %w", topic, err)
	}
	var last []byte
	for offset < end {
		broker, err := client.Leader(topic, 0)
		if err != nil {
			return nil, fmt.Errorf("checkpoint topic %s: leader: %w", topic, err)
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 200, MinBytes: 1, MaxBytes: 16 << 20,
			Isolation: sarama.ReadCommitted, SessionEpoch: -1}
		req.AddBlock(topic, 0, offset, 4<<20, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			return nil, fmt.Errorf("checkpoint topic %s: fetch at offset %d: %w", topic, offset, err)
		}
		block := resp.GetBlock(topic, 0)
		if block == nil {
			return nil, fmt.Errorf("checkpoint topic %s: fetch at offset %d: no answer for partition 0", topic, offset)
		}
		if block.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("checkpoint topic %s: fetch at offset %d: %w", topic, offset, block.Err)
		}
		next, rec := readBatches(block, offset, key)
		if rec != nil {
			last = rec
		}
		if next == offset {
			// Nothing stable past offset yet: an open transaction (another
			// slot's, or one being aborted by our fencing) holds the last
			// stable offset back.
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("checkpoint topic %s: read to offset %d (stopped at %d, last stable offset %d): %w", topic, end, offset, block.LastStableOffset, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
		offset = next
	}
	return last, nil
}

// readBatches walks a read_committed fetch answer from offset: it skips
// control batches and the batches of aborted transactions, and returns
// the next offset to fetch and the value of the last record with key.
func readBatches(block *sarama.FetchResponseBlock, offset int64, key []byte) (int64, []byte) {
	// The aborted transactions in offset order, taken as the batches pass
	// them, as the Java consumer does: a producer id keeps its id across
	// restarts (only the epoch moves), so one id may have many.
	aborted := slices.Clone(block.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b *sarama.AbortedTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	abortedOpen := map[int64]bool{}
	var last []byte
	next := offset
	for _, rs := range block.RecordsSet {
		b := rs.RecordBatch
		if b == nil {
			continue
		}
		if b.PartialTrailingRecord {
			break // cut off at the fetch's size limit: fetched again from next
		}
		end := b.FirstOffset + int64(b.LastOffsetDelta) + 1
		for len(aborted) > 0 && aborted[0].FirstOffset < end {
			abortedOpen[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		if end <= next {
			continue
		}
		switch {
		case b.Control:
			// key: version int16, type int16 (0 abort, 1 commit)
			if len(b.Records) > 0 && len(b.Records[0].Key) >= 4 && binary.BigEndian.Uint16(b.Records[0].Key[2:4]) == 0 {
				delete(abortedOpen, b.ProducerID)
			}
		case b.IsTransactional && abortedOpen[b.ProducerID]:
		default:
			for _, r := range b.Records {
				if b.FirstOffset+r.OffsetDelta >= offset && string(r.Key) == string(key) {
					last = r.Value
				}
			}
		}
		next = end
	}
	return next, last
}
