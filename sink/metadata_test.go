package sink

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// syncBuffer is a log sink sarama's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A topic the cluster does not have (auto-creation off or not allowed) is
// retried inside sarama's metadata refresh, for about an hour with the
// producer's settings, and never reaches the Errors channel. Each retry is
// counted, and a rate-limited warning names the topic.
func TestMetadataRetriesCountedAndTopicNamed(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs syncBuffer
	// New first: it installs sarama's logger, which the mock broker reads.
	p, err := New(validConfig(), zerolog.New(&logs).Level(zerolog.InfoLevel), reg)
	if err != nil {
		t.Fatal(err)
	}
	broker := sarama.NewMockBroker(t, 1)
	defer broker.Close()
	broker.SetHandlerByMap(map[string]sarama.MockResponse{
		// No topics: a request for one is answered UNKNOWN_TOPIC_OR_PARTITION.
		"MetadataRequest": sarama.NewMockMetadataResponse(t).SetBroker(broker.Addr(), broker.BrokerID()),
	})
	sc := *p.sc                                      // the producer's metadata settings, fewer retries to keep the test short
	sc.Metadata.Retry.Max = metadataQuietRetries + 1 // past the quiet ones
	sc.ApiVersionsRequest = false
	client, err := sarama.NewClient([]string{broker.Addr()}, &sc)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const topic = "outbox.event.missing"
	if err := client.RefreshMetadata(topic); !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		t.Fatalf("refresh metadata of a missing topic: %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
	if got := counterValues(t, reg)["outbox_relay_kafka_metadata_retries_total"]; got != metadataQuietRetries+1 {
		t.Errorf("outbox_relay_kafka_metadata_retries_total = %v, want %d", got, metadataQuietRetries+1)
	}
	out := logs.String()
	if n := strings.Count(out, `"level":"warn"`); n != 1 || !strings.Contains(out, topic) {
		t.Errorf("want one warning naming %s (rate-limited), got %d:\n%s", topic, n, out)
	}
}

// A topic the broker is creating answers after a retry or two: no warning
// then (a healthy start with kafka.auto_create_topics logs none). Retries
// that go on warn, and every retry is counted.
func TestMetadataWarnAfterQuietRetries(t *testing.T) {
	var buf bytes.Buffer
	w := &metadataWatch{retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"}), log: zerolog.New(&buf)}
	w.requested([]string{"new.topic"})
	for i := 1; i < metadataQuietRetries; i++ {
		w.retry()
	}
	if buf.Len() != 0 {
		t.Fatalf("warned after %d retries: %s", metadataQuietRetries-1, buf.String())
	}
	w.retry()
	if !strings.Contains(buf.String(), `"level":"warn"`) || !strings.Contains(buf.String(), "new.topic") {
		t.Fatalf("no warning after %d retries: %q", metadataQuietRetries, buf.String())
	}
}
