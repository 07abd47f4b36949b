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
	sc := *p.sc // the producer's metadata settings, fewer retries to keep the test short
	sc.Metadata.Retry.Max = 2
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
	if got := counterValues(t, reg)["outbox_relay_kafka_metadata_retries_total"]; got != 2 {
		t.Errorf("outbox_relay_kafka_metadata_retries_total = %v, want 2", got)
	}
	out := logs.String()
	if n := strings.Count(out, `"level":"warn"`); n != 1 || !strings.Contains(out, topic) {
		t.Errorf("want one warning naming %s (rate-limited), got %d:\n%s", topic, n, out)
	}
}
