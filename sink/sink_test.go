package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/IBM/sarama/mocks"
	"github.com/prometheus/client_golang/prometheus"
	gometrics "github.com/rcrowley/go-metrics"
	"github.com/rs/zerolog"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Brokers = []string{"k1:9092", "k2:9092"}
	return c
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // keys named, in order; nil = valid
	}{
		{"defaults with brokers", func(*Config) {}, nil},
		{"IPv6 broker", func(c *Config) { c.Brokers = []string{"[::1]:9092"} }, nil},
		{"fixed topic", func(c *Config) { c.TopicTemplate = "outbox.events" }, nil},
		{"every compression", func(c *Config) { c.Compression = "lz4" }, nil},
		{"zero flush settings", func(c *Config) { c.FlushFrequency, c.FlushMessages, c.FlushBytes = 0, 0, 0 }, nil},
		{"oldest idempotent version", func(c *Config) { c.Version = "0.11.0.0" }, nil},
		{"retry bounds", func(c *Config) { c.RetryMax, c.RetryBackoffMax = 100000, 10*time.Millisecond }, nil},
		{"smallest max message", func(c *Config) { c.MaxMessageBytes = 1024 }, nil},
		{"topic bounds", func(c *Config) { c.MaxTopics, c.AutoCreateTopics = MaxMaxTopics, true }, nil},
		{"one topic", func(c *Config) { c.MaxTopics = 1 }, nil},
		{"allowlist", func(c *Config) { c.TopicAllowlist = []string{"outbox.event.*", "legacy"} }, nil},
		{"fixed topic in the allowlist", func(c *Config) { c.TopicTemplate, c.TopicAllowlist = "legacy", []string{"leg*"} }, nil},

		{"no brokers", func(c *Config) { c.Brokers = nil }, []string{"kafka.brokers"}},
		{"broker without port", func(c *Config) { c.Brokers = []string{"k1:9092", "k2"} }, []string{"kafka.brokers"}},
		{"broker without host", func(c *Config) { c.Brokers = []string{":9092"} }, []string{"kafka.brokers"}},
		{"broker with empty port", func(c *Config) { c.Brokers = []string{"k1:"} }, []string{"kafka.brokers"}},
		{"two bad brokers", func(c *Config) { c.Brokers = []string{"a", "b"} }, []string{"kafka.brokers", "kafka.brokers"}},
		{"empty client id", func(c *Config) { c.ClientID = "" }, []string{"kafka.client_id"}},
		{"empty topic template", func(c *Config) { c.TopicTemplate = "" }, []string{"kafka.topic_template"}},
		{"unknown placeholder", func(c *Config) { c.TopicTemplate = "x.{aggregate_id}" }, []string{"kafka.topic_template"}},
		{"unclosed placeholder", func(c *Config) { c.TopicTemplate = "x.{event_type" }, []string{"kafka.topic_template"}},
		{"bad fixed topic", func(c *Config) { c.TopicTemplate = "out box" }, []string{"kafka.topic_template"}},
		{"unknown compression", func(c *Config) { c.Compression = "brotli" }, []string{"kafka.compression"}},
		{"empty compression", func(c *Config) { c.Compression = "" }, []string{"kafka.compression"}},
		{"negative flush frequency", func(c *Config) { c.FlushFrequency = -1 }, []string{"kafka.flush_frequency"}},
		{"negative flush messages", func(c *Config) { c.FlushMessages = -1 }, []string{"kafka.flush_messages"}},
		{"negative flush bytes", func(c *Config) { c.FlushBytes = -1 }, []string{"kafka.flush_bytes"}},
		{"small max message", func(c *Config) { c.MaxMessageBytes = 1023 }, []string{"kafka.max_message_bytes"}},
		{"bad version", func(c *Config) { c.Version = "banana" }, []string{"kafka.version"}},
		{"empty version", func(c *Config) { c.Version = "" }, []string{"kafka.version"}},
		{"pre-idempotence version", func(c *Config) { c.Version = "0.10.2.0" }, []string{"kafka.version"}},
		{"short retry backoff", func(c *Config) { c.RetryBackoffMax = 9 * time.Millisecond }, []string{"kafka.retry_backoff_max"}},
		{"missing topic timeout too short", func(c *Config) { c.MissingTopicTimeout = 999 * time.Millisecond }, []string{"kafka.missing_topic_timeout"}},
		{"missing topic timeout too long", func(c *Config) { c.MissingTopicTimeout = 25 * time.Hour }, []string{"kafka.missing_topic_timeout"}},
		{"topic refresh too short", func(c *Config) { c.TopicRefresh = 500 * time.Millisecond }, []string{"kafka.topic_refresh"}},
		{"topic refresh too long", func(c *Config) { c.TopicRefresh = 25 * time.Hour }, []string{"kafka.topic_refresh"}},
		{"zero retries", func(c *Config) { c.RetryMax = 0 }, []string{"kafka.retry_max"}},
		{"too many retries", func(c *Config) { c.RetryMax = 100001 }, []string{"kafka.retry_max"}},
		{"no topic limit", func(c *Config) { c.MaxTopics = 0 }, []string{"kafka.max_topics"}},
		{"topic limit too high", func(c *Config) { c.MaxTopics = MaxMaxTopics + 1 }, []string{"kafka.max_topics"}},
		{"allowlist with bad entries", func(c *Config) { c.TopicAllowlist = []string{"", "a b", "x*y*"} }, []string{"kafka.topic_allowlist"}},
		{"fixed topic not in the allowlist", func(c *Config) { c.TopicTemplate, c.TopicAllowlist = "legacy", []string{"orders.*"} },
			[]string{"kafka.topic_allowlist"}},
		{"everything wrong", func(c *Config) { *c = Config{FlushFrequency: -1, FlushMessages: -1, FlushBytes: -1} }, []string{
			"kafka.brokers", "kafka.client_id", "kafka.topic_template", "kafka.max_topics", "kafka.compression", "kafka.flush_frequency",
			"kafka.flush_messages", "kafka.flush_bytes", "kafka.missing_topic_timeout", "kafka.topic_refresh", "kafka.max_message_bytes", "kafka.version",
			"kafka.retry_backoff_max", "kafka.retry_max",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate("kafka.")
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if _, err := saramaConfig(c); err != nil {
					t.Errorf("valid config rejected by saramaConfig: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %v", tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Errorf("%d problems reported, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, line := range lines {
				if i < len(tt.want) && !strings.HasPrefix(line, tt.want[i]+": ") {
					t.Errorf("line %d %q does not start with %q", i, line, tt.want[i]+": ")
				}
			}
		})
	}
}

func TestTemplate(t *testing.T) {
	long := strings.Repeat("a", 240)
	tests := []struct {
		name      string
		template  string
		aggregate string
		event     string
		want      string // rendered topic
		parseErr  string // substring of the ParseTemplate error
		renderErr string // substring of the Render error
	}{
		{name: "default", template: "outbox.event.{aggregate_type}", aggregate: "order", event: "created", want: "outbox.event.order"},
		{name: "both placeholders", template: "{aggregate_type}.{event_type}", aggregate: "order", event: "created", want: "order.created"},
		{name: "placeholder only", template: "{event_type}", aggregate: "order", event: "OrderCreated", want: "OrderCreated"},
		{name: "placeholder twice", template: "{aggregate_type}-{aggregate_type}", aggregate: "x", want: "x-x"},
		{name: "literals around", template: "pre_{aggregate_type}_mid_{event_type}_post", aggregate: "a", event: "b", want: "pre_a_mid_b_post"},
		{name: "fixed topic", template: "outbox.events", aggregate: "order", event: "created", want: "outbox.events"},
		{name: "fixed topic ignores bad row values", template: "outbox.events", aggregate: "bad value/!", event: "", want: "outbox.events"},
		{name: "all allowed characters", template: "aZ09._-{aggregate_type}", aggregate: "Zz9_.-", want: "aZ09._-Zz9_.-"},
		{name: "249 characters", template: "x.{aggregate_type}", aggregate: strings.Repeat("a", 247), want: "x." + strings.Repeat("a", 247)},

		{name: "empty", template: "", parseErr: "is empty"},
		{name: "unknown placeholder", template: "outbox.{aggregate_id}", parseErr: "unknown placeholder {aggregate_id}"},
		{name: "empty placeholder", template: "outbox.{}", parseErr: "unknown placeholder {}"},
		{name: "upper-case placeholder", template: "{AGGREGATE_TYPE}", parseErr: "unknown placeholder"},
		{name: "unclosed brace", template: "outbox.{aggregate_type", parseErr: "unclosed"},
		{name: "unclosed brace after placeholder", template: "{aggregate_type}.{", parseErr: "unclosed"},
		{name: "fixed topic with space", template: "outbox events", parseErr: "character ' '"},
		{name: "fixed topic with closing brace", template: "outbox}", parseErr: "character '}'"},
		{name: "fixed topic dot", template: ".", parseErr: "not a valid Kafka topic name"},
		{name: "fixed topic dot dot", template: "..", parseErr: "not a valid Kafka topic name"},
		{name: "fixed topic too long", template: strings.Repeat("t", 250), parseErr: "longer than 249"},
		{name: "fixed topic of 249", template: strings.Repeat("t", 249), want: strings.Repeat("t", 249)},

		{name: "slash in row value", template: "outbox.{aggregate_type}", aggregate: "order/eu", renderErr: "character '/'"},
		{name: "space in row value", template: "{aggregate_type}.{event_type}", aggregate: "order", event: "order created", renderErr: "character ' '"},
		{name: "non-ASCII row value", template: "outbox.{aggregate_type}", aggregate: "commande_été", renderErr: "Kafka allows only"},
		{name: "brace in row value", template: "outbox.{aggregate_type}", aggregate: "{event_type}", renderErr: "character '{'"},
		{name: "empty row value makes empty topic", template: "{aggregate_type}", aggregate: "", renderErr: "not a valid Kafka topic name"},
		{name: "row value dot", template: "{aggregate_type}", aggregate: ".", renderErr: "not a valid Kafka topic name"},
		{name: "row value dot dot", template: "{aggregate_type}", aggregate: "..", renderErr: "not a valid Kafka topic name"},
		{name: "250 characters", template: "x.{aggregate_type}", aggregate: strings.Repeat("a", 248), renderErr: "longer than 249"},
		{name: "long values together", template: "{aggregate_type}.{event_type}", aggregate: long, event: long, renderErr: "longer than 249"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := ParseTemplate(tt.template)
			if tt.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.parseErr) {
					t.Fatalf("ParseTemplate(%q) err = %v, want one containing %q", tt.template, err, tt.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseTemplate(%q): %v", tt.template, err)
			}
			got, err := tmpl.Render(tt.aggregate, tt.event)
			if tt.renderErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.renderErr) {
					t.Fatalf("Render(%q, %q) = %q, %v; want an error containing %q", tt.aggregate, tt.event, got, err, tt.renderErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Render(%q, %q): %v", tt.aggregate, tt.event, err)
			}
			if got != tt.want {
				t.Errorf("Render(%q, %q) = %q, want %q", tt.aggregate, tt.event, got, tt.want)
			}
			if err := ValidTopic(got); err != nil {
				t.Errorf("rendered topic %q is not valid: %v", got, err)
			}
		})
	}
}

// Certain: a Poison answer that cannot change on retry for this record.
func TestCertain(t *testing.T) {
	local := sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2000 > 1024")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"sarama's local size check", local, true},
		{"local size check, wrapped", fmt.Errorf("publish to topic t partition -1: %w", local), true},
		{"too large alone", &SoleError{Err: sarama.ErrMessageSizeTooLarge}, true},
		{"too large alone, wrapped with text", fmt.Errorf("publish: %w", &SoleError{Err: fmt.Errorf("%w: limit 1000", sarama.ErrMessageSizeTooLarge)}), true},
		{"record list too large alone", &SoleError{Err: sarama.ErrMessageSetSizeTooLarge}, true},
		{"invalid record alone", &SoleError{Err: sarama.ErrInvalidRecord}, true},
		{"too large in a batch", sarama.ErrMessageSizeTooLarge, false},
		{"invalid record in a batch", sarama.ErrInvalidRecord, false},
		{"exactly-once record sent alone", &AbortError{Cause: sarama.ErrMessageSizeTooLarge, Own: true}, true},
		{"exactly-once, aborted for another", &AbortError{Cause: sarama.ErrMessageSizeTooLarge}, false},
		{"topic authorization, any batch", fmt.Errorf("x: %w", sarama.ErrTopicAuthorizationFailed), true},
		{"invalid topic, any batch", sarama.ErrInvalidTopic, true},
		{"unknown refusal alone: attempts", &SoleError{Err: sarama.ErrPolicyViolation}, false},
		{"invalid timestamp alone", &SoleError{Err: sarama.ErrInvalidTimestamp}, true},
		{"invalid timestamp in a batch", sarama.ErrInvalidTimestamp, false},
		{"topic missing for the timeout", fmt.Errorf("publish: %w", &MissingTopicError{Topic: "ordr", Waited: time.Minute}), true},
		{"corrupt message: retried", &SoleError{Err: sarama.ErrInvalidMessage}, false},
		{"cluster authorization halts, not poison", &SoleError{Err: sarama.ErrClusterAuthorizationFailed}, false},
		{"transient", &SoleError{Err: sarama.ErrNotEnoughReplicas}, false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Certain(tt.err); got != tt.want {
				t.Errorf("Certain(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		reason string
		kind   Kind
	}{
		{"message too large", sarama.ErrMessageSizeTooLarge, "message_too_large", Poison},
		{"wrapped message too large", fmt.Errorf("produce: %w", sarama.ErrMessageSizeTooLarge), "message_too_large", Poison},
		{"local size check", sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2000 > 1024"), "message_too_large", Poison},
		{"record list too large", sarama.ErrMessageSetSizeTooLarge, "message_too_large", Poison},
		{"invalid topic", sarama.ErrInvalidTopic, "invalid_topic", Poison},
		{"invalid record", sarama.ErrInvalidRecord, "invalid_record", Poison},
		{"invalid timestamp", sarama.ErrInvalidTimestamp, "invalid_record", Poison},
		{"policy violation", sarama.ErrPolicyViolation, "broker_rejected", Poison},
		{"unknown server error", sarama.ErrUnknown, "broker_rejected", Poison},
		{"replica not available", sarama.ErrReplicaNotAvailable, "leader_not_available", Transient},
		{"coordinator loading", sarama.ErrOffsetsLoadInProgress, "coordinator", Transient},
		{"not coordinator", fmt.Errorf("commit kafka transaction: %w", sarama.ErrNotCoordinatorForConsumer), "coordinator", Transient},
		{"concurrent transactions", sarama.ErrConcurrentTransactions, "coordinator", Transient},
		{"a code not listed is retried, never dead-lettered", sarama.ErrThrottlingQuotaExceeded, "other", Transient},
		{"a code newer than the client", sarama.KError(200), "other", Transient},
		{"topic missing for the timeout", &MissingTopicError{Topic: "ordr", Waited: time.Minute}, "unknown_topic", Poison},
		{"topic authorization", sarama.ErrTopicAuthorizationFailed, "authorization", Poison},
		{"wrapped topic authorization", fmt.Errorf("x: %w", sarama.ErrTopicAuthorizationFailed), "authorization", Poison},
		{"cluster authorization", sarama.ErrClusterAuthorizationFailed, "authorization", Refused},
		{"transactional id authorization", sarama.ErrTransactionalIDAuthorizationFailed, "authorization", Refused},
		{"sole refusal", &SoleError{Err: sarama.ErrInvalidRecord}, "invalid_record", Poison},
		{"SASL failed", sarama.ErrSASLAuthenticationFailed, "authorization", Refused},
		{"out of brokers", sarama.ErrOutOfBrokers, "network", Transient},
		{"not connected", sarama.ErrNotConnected, "network", Transient},
		{"wrapped out of brokers", fmt.Errorf("metadata: %w", sarama.ErrOutOfBrokers), "network", Transient},
		{"connection refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, "network", Transient},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), "network", Transient},
		{"EOF", io.EOF, "network", Transient},
		{"broker not available", sarama.ErrBrokerNotAvailable, "network", Transient},
		{"shutting down", sarama.ErrShuttingDown, "network", Transient},
		{"leader not available", sarama.ErrLeaderNotAvailable, "leader_not_available", Transient},
		{"not leader", sarama.ErrNotLeaderForPartition, "leader_not_available", Transient},
		{"not enough replicas", sarama.ErrNotEnoughReplicas, "not_enough_replicas", Transient},
		{"not enough replicas after append", sarama.ErrNotEnoughReplicasAfterAppend, "not_enough_replicas", Transient},
		{"request timed out", sarama.ErrRequestTimedOut, "request_timed_out", Transient},
		{"unknown topic", sarama.ErrUnknownTopicOrPartition, "unknown_topic", Transient},
		{"out of order sequence", sarama.ErrOutOfOrderSequenceNumber, "producer_state", Transient},
		{"plain error", errors.New("boom"), "other", Transient},
		{"nil", nil, "other", Transient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason, kind := Classify(tt.err)
			if reason != tt.reason || kind != tt.kind {
				t.Errorf("Classify(%v) = %q, %d; want %q, %d", tt.err, reason, kind, tt.reason, tt.kind)
			}
			if !slices.Contains(Reasons, reason) {
				t.Errorf("reason %q is not in Reasons, so it is not exported at zero", reason)
			}
		})
	}
}

// sarama retries transient errors internally and only logs them; the log
// hook counts them by reason, and ignores every other log line.
func TestSaramaLogCountsInternalRetries(t *testing.T) {
	reg := prometheus.NewRegistry()
	p, err := New(validConfig(), zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	_ = p
	sarama.Logger.Printf("producer/broker/%d state change to [retrying] on %s/%d because %v\n", int32(1), "t", int32(0), sarama.ErrNotEnoughReplicas)
	sarama.Logger.Printf("producer/broker/%d state change to [closing] because %s\n", int32(1), &net.OpError{Op: "write", Err: syscall.EPIPE})
	sarama.Logger.Printf("producer/broker/%d state change to [closing] because %s\n", int32(1), io.EOF)
	sarama.Logger.Printf("producer/leader/%s/%d selected broker %d\n", "t", int32(0), int32(1))
	sarama.Logger.Printf("Failed refreshing metadata because of %v\n", sarama.ErrOutOfBrokers)
	got := counterValues(t, reg)
	want := map[string]float64{
		"outbox_relay_publish_errors_total{reason=not_enough_replicas}": 1,
		"outbox_relay_publish_errors_total{reason=network}":             2,
		"outbox_relay_publish_errors_total{reason=other}":               0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// javaMurmur2 is org.apache.kafka.common.utils.Utils.murmur2 transcribed
// line by line with Java's int semantics (wrapping int32, >>> as an
// unsigned shift); it shares no code with sarama.
func javaMurmur2(data []byte) int32 {
	ushr := func(x int32, n uint) int32 { return int32(uint32(x) >> n) }
	length := int32(len(data))
	seedBits := uint32(0x9747b28c)
	seed := int32(seedBits)
	const m int32 = 0x5bd1e995
	const r = 24

	h := seed ^ length
	length4 := length / 4
	for i := int32(0); i < length4; i++ {
		i4 := i * 4
		k := int32(data[i4+0]&0xff) + int32(data[i4+1]&0xff)<<8 + int32(data[i4+2]&0xff)<<16 + int32(data[i4+3]&0xff)<<24
		k *= m
		k ^= ushr(k, r)
		k *= m
		h *= m
		h ^= k
	}
	switch length % 4 {
	case 3:
		h ^= int32(data[(length&^3)+2]&0xff) << 16
		fallthrough
	case 2:
		h ^= int32(data[(length&^3)+1]&0xff) << 8
		fallthrough
	case 1:
		h ^= int32(data[length&^3] & 0xff)
		h *= m
	}
	h ^= ushr(h, 13)
	h *= m
	h ^= ushr(h, 15)
	return h
}

// javaPartition is the Java client's keyed partition choice:
// Utils.toPositive(Utils.murmur2(key)) % numPartitions.
func javaPartition(key []byte, numPartitions int32) int32 {
	return (javaMurmur2(key) & 0x7fffffff) % numPartitions
}

// Reference murmur2 values, as Java ints.
var murmur2Vectors = []struct {
	key    string
	hash   int32
	source string
}{
	// Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java,
	// testMurmur2 (apache/kafka commit f55581dc73953c3509a4702433aeeeddc2970779).
	{"21", -973932308, "kafka UtilsTest"},
	{"foobar", -790332482, "kafka UtilsTest"},
	{"a-little-bit-long-string", -985981536, "kafka UtilsTest"},
	{"a-little-bit-longer-string", -1486304829, "kafka UtilsTest"},
	{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, "kafka UtilsTest"},
	{"abc", 479470107, "kafka UtilsTest"},
	// IBM/sarama v1.61.1 partitioner_test.go, TestMurmur2 (uint32 there,
	// "verified against ... Utils.murmur2()"); here as the same bits in int32.
	{"foo", int32FromBits(597841616), "sarama TestMurmur2"},
	{"bar", int32FromBits(988958145), "sarama TestMurmur2"},
	{"baz", int32FromBits(1973573280), "sarama TestMurmur2"},
	{"", int32FromBits(275646681), "sarama TestMurmur2"},
	{"kafka", int32FromBits(3496464228), "sarama TestMurmur2"},
	{"sarama", int32FromBits(770765511), "sarama TestMurmur2"},
}

func int32FromBits(u uint32) int32 { return int32(u) }

// The producer's partitioner, built the way the producer builds it.
func producerPartitioner(t *testing.T) sarama.Partitioner {
	t.Helper()
	sc, err := saramaConfig(validConfig())
	if err != nil {
		t.Fatal(err)
	}
	return sc.Producer.Partitioner("outbox.event.order")
}

func partitionOf(t *testing.T, p sarama.Partitioner, key []byte, n int32) int32 {
	t.Helper()
	got, err := p.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(key)}, n)
	if err != nil {
		t.Fatalf("Partition(%q, %d): %v", key, n, err)
	}
	return got
}

func TestJavaMurmur2ReferenceVectors(t *testing.T) {
	for _, v := range murmur2Vectors {
		t.Run(v.source+"/"+v.key, func(t *testing.T) {
			if got := javaMurmur2([]byte(v.key)); got != v.hash {
				t.Errorf("javaMurmur2(%q) = %d, want %d", v.key, got, v.hash)
			}
		})
	}
}

func TestPartitionerMatchesJavaReferenceVectors(t *testing.T) {
	p := producerPartitioner(t)
	for _, v := range murmur2Vectors {
		t.Run(v.source+"/"+v.key, func(t *testing.T) {
			positive := v.hash & 0x7fffffff
			// With MaxInt32 partitions the partition is toPositive(hash)
			// itself (unless it is exactly MaxInt32): this checks sarama's
			// hash bits, not only its residues.
			if got, want := partitionOf(t, p, []byte(v.key), math.MaxInt32), positive%math.MaxInt32; got != want {
				t.Errorf("partition(%q, MaxInt32) = %d, want %d", v.key, got, want)
			}
			for n := int32(1); n <= 64; n++ {
				if got, want := partitionOf(t, p, []byte(v.key), n), positive%n; got != want {
					t.Errorf("partition(%q, %d) = %d, want %d", v.key, n, got, want)
				}
			}
		})
	}
	// IBM/sarama v1.61.1 partitioner_test.go, "known Java-compatible
	// partition assignments" with 100 partitions.
	for key, want := range map[string]int32{"foo": 16, "bar": 45, "baz": 80, "kafka": 80, "sarama": 11} {
		if got := partitionOf(t, p, []byte(key), 100); got != want {
			t.Errorf("partition(%q, 100) = %d, want %d", key, got, want)
		}
		if got := javaPartition([]byte(key), 100); got != want {
			t.Errorf("javaPartition(%q, 100) = %d, want %d", key, got, want)
		}
	}
}

func TestPartitionerMatchesJavaRandomKeys(t *testing.T) {
	p := producerPartitioner(t)
	rng := rand.New(rand.NewPCG(0x5eed, 0x0b0c))
	keys := [][]byte{nil, {}, {0}, {0xff}, {0xff, 0xff, 0xff}, {0x80, 0, 0, 0}, []byte("7c9e6679-7425-40de-944b-e07fc1f90ae7")}
	for range 3000 {
		k := make([]byte, rng.IntN(70))
		for i := range k {
			k[i] = byte(rng.UintN(256))
		}
		keys = append(keys, k)
	}
	for i := range 500 { // aggregate ids as they usually look
		keys = append(keys, fmt.Appendf(nil, "order-%d", i))
	}
	mismatches := 0
	for _, k := range keys {
		if k == nil {
			k = []byte{} // the producer never sends a nil key (ByteEncoder of an aggregate id)
		}
		for n := int32(1); n <= 64; n++ {
			if got, want := partitionOf(t, p, k, n), javaPartition(k, n); got != want {
				mismatches++
				if mismatches <= 10 {
					t.Errorf("key %x, %d partitions: sarama %d, Java %d", k, n, got, want)
				}
			}
		}
		if got, want := partitionOf(t, p, k, math.MaxInt32), javaPartition(k, math.MaxInt32); got != want {
			t.Errorf("key %x, MaxInt32 partitions: sarama %d, Java %d", k, got, want)
		}
	}
	if mismatches > 0 {
		t.Errorf("%d of %d (key, partitions) pairs differ from the Java client", mismatches, len(keys)*64)
	}
	dc, ok := p.(sarama.DynamicConsistencyPartitioner)
	if !ok || !p.RequiresConsistency() || !dc.MessageRequiresConsistency(&sarama.ProducerMessage{Key: sarama.ByteEncoder("k")}) {
		t.Error("keyed messages must always go to the hashed partition (RequiresConsistency)")
	}
}

func TestSaramaConfig(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		check  func(t *testing.T, sc *sarama.Config)
	}{
		{"defaults", func(*Config) {}, func(t *testing.T, sc *sarama.Config) {
			if sc.Producer.Compression != sarama.CompressionNone {
				t.Errorf("Compression = %v", sc.Producer.Compression)
			}
			if sc.Version != sarama.V3_6_0_0 {
				t.Errorf("Version = %v, want 3.6.0", sc.Version)
			}
			if sc.ClientID != "outbox-relay" {
				t.Errorf("ClientID = %q", sc.ClientID)
			}
			if sc.Producer.Retry.Max != 1000 {
				t.Errorf("Retry.Max = %d", sc.Producer.Retry.Max)
			}
			if sc.Producer.MaxMessageBytes != 1000000 {
				t.Errorf("MaxMessageBytes = %d", sc.Producer.MaxMessageBytes)
			}
		}},
		{"gzip", func(c *Config) { c.Compression = "gzip" }, func(t *testing.T, sc *sarama.Config) {
			if sc.Producer.Compression != sarama.CompressionGZIP {
				t.Errorf("Compression = %v", sc.Producer.Compression)
			}
		}},
		{"snappy", func(c *Config) { c.Compression = "snappy" }, func(t *testing.T, sc *sarama.Config) {
			if sc.Producer.Compression != sarama.CompressionSnappy {
				t.Errorf("Compression = %v", sc.Producer.Compression)
			}
		}},
		{"lz4", func(c *Config) { c.Compression = "lz4" }, func(t *testing.T, sc *sarama.Config) {
			if sc.Producer.Compression != sarama.CompressionLZ4 {
				t.Errorf("Compression = %v", sc.Producer.Compression)
			}
		}},
		{"zstd", func(c *Config) { c.Compression = "zstd" }, func(t *testing.T, sc *sarama.Config) {
			if sc.Producer.Compression != sarama.CompressionZSTD {
				t.Errorf("Compression = %v", sc.Producer.Compression)
			}
		}},
		{"batching and retries", func(c *Config) {
			c.FlushFrequency, c.FlushMessages, c.FlushBytes = 5*time.Millisecond, 100, 65536
			c.RetryMax, c.MaxMessageBytes, c.ClientID, c.Version = 7, 2048, "relay-1", "2.8.0"
		}, func(t *testing.T, sc *sarama.Config) {
			f := sc.Producer.Flush
			if f.Frequency != 5*time.Millisecond || f.Messages != 100 || f.Bytes != 65536 {
				t.Errorf("Flush = %+v", f)
			}
			if sc.Producer.Retry.Max != 7 || sc.Producer.MaxMessageBytes != 2048 || sc.ClientID != "relay-1" {
				t.Errorf("Retry.Max %d, MaxMessageBytes %d, ClientID %q", sc.Producer.Retry.Max, sc.Producer.MaxMessageBytes, sc.ClientID)
			}
			if sc.Version != sarama.V2_8_0_0 {
				t.Errorf("Version = %v", sc.Version)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			if err := c.Validate("kafka."); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			sc, err := saramaConfig(c)
			if err != nil {
				t.Fatalf("saramaConfig: %v", err)
			}
			// The delivery guarantees, whatever the tuning.
			if !sc.Producer.Idempotent {
				t.Error("Producer.Idempotent is false")
			}
			if sc.Producer.RequiredAcks != sarama.WaitForAll {
				t.Errorf("RequiredAcks = %v, want WaitForAll", sc.Producer.RequiredAcks)
			}
			if sc.Net.MaxOpenRequests != 1 {
				t.Errorf("Net.MaxOpenRequests = %d, want 1", sc.Net.MaxOpenRequests)
			}
			if !sc.Producer.Return.Successes || !sc.Producer.Return.Errors {
				t.Errorf("Return.Successes %v, Return.Errors %v; both must be true", sc.Producer.Return.Successes, sc.Producer.Return.Errors)
			}
			if sc.Producer.Partitioner == nil {
				t.Fatal("no partitioner")
			}
			// Retries back off with jitter in [d/2, d], d doubling from
			// 100ms and capped by retry_backoff_max.
			for retries := range 20 {
				d := min(100*time.Millisecond<<min(retries, 10), c.RetryBackoffMax)
				for range 20 {
					got := sc.Producer.Retry.BackoffFunc(retries, sc.Producer.Retry.Max)
					if got < d/2 || got > d {
						t.Fatalf("backoff after %d retries = %s, want within [%s, %s]", retries, got, d/2, d)
					}
				}
			}
			tt.check(t, sc)
		})
	}
}

// fakeClient stands in for the sarama.Client the producer closes and probes.
type fakeClient struct {
	sarama.Client
	mu     sync.Mutex
	closed int
}

func (f *fakeClient) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	return nil
}

func (f *fakeClient) RefreshMetadata(...string) error { return nil }

// counterValues gathers reg into "name{label=value}" -> value.
func counterValues(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestProducerRunCallsDoneOnce drives Run with sarama's mock AsyncProducer:
// every published message's Done is called exactly once, with nil on an ack
// and the broker's error (wrapped, with topic) on a failure.
func TestProducerRunCallsDoneOnce(t *testing.T) {
	type outcome struct {
		topic string
		key   string
		err   error // what the mock broker answers
	}
	outcomes := []outcome{
		{"t.ok", "order-1", nil},
		{"t.fail", "order-2", sarama.ErrOutOfBrokers},
		{"t.ok", "order-3", nil},
		{"t.big", "order-4", sarama.ErrMessageSizeTooLarge},
		{"t.ok", "order-5", nil},
		{"t.auth", "order-6", sarama.ErrTopicAuthorizationFailed},
	}
	reg := prometheus.NewRegistry()
	p, err := New(validConfig(), zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	mp := mocks.NewAsyncProducer(t, p.sc) // 32 partitions per topic
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, o := range outcomes {
		check := func(m *sarama.ProducerMessage) error {
			k, _ := m.Key.Encode()
			if m.Topic != o.topic || string(k) != o.key || !m.Timestamp.Equal(ts) || len(m.Headers) != 1 {
				return fmt.Errorf("got topic %s key %s ts %s headers %v", m.Topic, k, m.Timestamp, m.Headers)
			}
			if want := javaPartition([]byte(o.key), 32); m.Partition != want {
				return fmt.Errorf("key %s went to partition %d, Java client picks %d", o.key, m.Partition, want)
			}
			return nil
		}
		if o.err == nil {
			mp.ExpectInputWithMessageCheckerFunctionAndSucceed(check)
		} else {
			mp.ExpectInputWithMessageCheckerFunctionAndFail(check, o.err)
		}
	}
	health, client := &fakeClient{}, &fakeClient{}
	p.dial = func(*sarama.Config) error {
		p.ap, p.health, p.client = mp, health, client
		return nil
	}

	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(context.Background()) }()
	<-p.Ready()

	var mu sync.Mutex
	calls := make([][]error, len(outcomes))
	for i, o := range outcomes {
		m := &Message{
			Topic: o.topic, Key: []byte(o.key), Value: []byte(`{"n":1}`), Timestamp: ts,
			Headers: []Header{{Key: []byte("id"), Value: []byte("1")}},
			Done: func(err error) {
				mu.Lock()
				defer mu.Unlock()
				calls[i] = append(calls[i], err)
			},
		}
		if err := p.Publish(context.Background(), m); err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
	}
	p.Close()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	p.Close() // idempotent

	mu.Lock()
	defer mu.Unlock()
	for i, o := range outcomes {
		if len(calls[i]) != 1 {
			t.Errorf("message %d: Done called %d times, want once", i, len(calls[i]))
			continue
		}
		got := calls[i][0]
		switch {
		case o.err == nil && got != nil:
			t.Errorf("message %d: Done(%v), want Done(nil)", i, got)
		case o.err != nil && !errors.Is(got, o.err):
			t.Errorf("message %d: Done(%v), want an error wrapping %v", i, got, o.err)
		case o.err != nil && !strings.Contains(got.Error(), "topic "+o.topic):
			t.Errorf("message %d: Done(%v) does not name topic %s", i, got, o.topic)
		}
	}
	want := map[string]float64{
		"outbox_relay_events_published_total{topic=t.ok}":             3,
		"outbox_relay_publish_errors_total{reason=network}":           1,
		"outbox_relay_publish_errors_total{reason=message_too_large}": 1,
		"outbox_relay_publish_errors_total{reason=authorization}":     1,
		"outbox_relay_kafka_connected":                                0, // after Close
	}
	got := counterValues(t, reg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if p.Connected() {
		t.Error("Connected() after Close")
	}
	if health.closed != 1 || client.closed != 1 {
		t.Errorf("clients closed %d and %d times, want once each", health.closed, client.closed)
	}
}

// blockedProducer is an AsyncProducer whose input nobody reads.
type blockedProducer struct {
	sarama.AsyncProducer
	in chan *sarama.ProducerMessage
}

func (b blockedProducer) Input() chan<- *sarama.ProducerMessage { return b.in }

func TestProducerLifecycleErrors(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, p *Producer)
	}{
		{"Run stops connecting at Close", func(t *testing.T, p *Producer) {
			p.dial = func(*sarama.Config) error { return errors.New("connection refused") }
			p.Close()
			p.Close()
			if err := p.Run(context.Background()); err != nil {
				t.Errorf("Run after Close = %v, want nil", err)
			}
			if err := p.Publish(context.Background(), &Message{Topic: "t", Done: func(error) {}}); !errors.Is(err, ErrClosed) {
				t.Errorf("Publish after Close = %v, want ErrClosed", err)
			}
		}},
		{"Run returns an authentication failure", func(t *testing.T, p *Producer) {
			p.dial = func(*sarama.Config) error { return sarama.ErrSASLAuthenticationFailed }
			if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "credentials") {
				t.Errorf("Run = %v, want the credentials error", err)
			}
		}},
		{"Publish blocked until ctx ends", func(t *testing.T, p *Producer) {
			p.ap = blockedProducer{in: make(chan *sarama.ProducerMessage)}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := p.Publish(ctx, &Message{Topic: "t", Done: func(error) {}}); !errors.Is(err, context.Canceled) {
				t.Errorf("Publish = %v, want context.Canceled", err)
			}
		}},
		{"New rejects an invalid config", func(t *testing.T, _ *Producer) {
			c := validConfig()
			c.Compression = "brotli"
			if _, err := New(c, zerolog.Nop(), nil); err == nil || !strings.Contains(err.Error(), "kafka.compression") {
				t.Errorf("New = %v, want a kafka.compression error", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(validConfig(), zerolog.Nop(), nil)
			if err != nil {
				t.Fatal(err)
			}
			tt.run(t, p)
		})
	}
}

// sarama's retries of a batch wait 100ms doubling up to
// kafka.retry_backoff_max, jittered over the upper half of each step.
func TestSaramaRetryBackoff(t *testing.T) {
	c := validConfig()
	c.RetryBackoffMax = 2 * time.Second
	sc, err := saramaConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	for retries := 0; retries < 100; retries++ {
		hi := min(100*time.Millisecond<<min(retries, 20), c.RetryBackoffMax)
		d := sc.Producer.Retry.BackoffFunc(retries, c.RetryMax)
		if d < hi/2 || d > hi {
			t.Fatalf("retry %d: %s outside [%s, %s]", retries, d, hi/2, hi)
		}
	}
}

// Metadata retries start short (a topic being created, a new leader: tens
// of milliseconds) and grow to 2 s, so the 1800 of them still cover about an
// hour. sarama passes the retries made so far; the old schedule read that
// backwards and waited 2 s from the first retry.
func TestMetadataBackoff(t *testing.T) {
	sc, err := saramaConfig(validConfig())
	if err != nil {
		t.Fatal(err)
	}
	f := sc.Metadata.Retry.BackoffFunc
	for _, tt := range []struct {
		retries int
		want    time.Duration
	}{{0, 20 * time.Millisecond}, {1, 40 * time.Millisecond}, {2, 80 * time.Millisecond}, {6, 1280 * time.Millisecond}, {7, 2 * time.Second}, {1799, 2 * time.Second}} {
		if got := f(tt.retries, sc.Metadata.Retry.Max); got != tt.want {
			t.Errorf("backoff after %d retries = %s, want %s", tt.retries, got, tt.want)
		}
	}
	var total time.Duration
	for r := 0; r < sc.Metadata.Retry.Max; r++ {
		total += f(r, sc.Metadata.Retry.Max)
	}
	if total < 55*time.Minute {
		t.Errorf("metadata retries cover %s of outage, want about an hour", total)
	}
}

// sarama's go-metrics are off: the producer's registry hands out stubs, no
// meter or histogram records anything per request (low-rate CPU).
func TestSaramaMetricsOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Brokers = []string{"localhost:9092"}
	sc, err := saramaConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]any{
		"meter":     gometrics.GetOrRegisterMeter("record-send-rate", sc.MetricRegistry),
		"histogram": gometrics.GetOrRegisterHistogram("request-latency-in-ms", sc.MetricRegistry, gometrics.NewExpDecaySample(1028, 0.015)),
	} {
		switch m.(type) {
		case gometrics.NilMeter, gometrics.NilHistogram:
		default:
			t.Errorf("sarama %s is a %T, want a go-metrics Nil stub (metrics.UseNilMetrics)", name, m)
		}
	}
}
