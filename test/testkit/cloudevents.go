package testkit

import (
	"context"
	"testing"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
)

// ReadCloudEvent reads a record as a CloudEvent with the official Go SDK
// (its Kafka binding, binary or structured mode as the record says) and
// validates it; any error, or a record that is no CloudEvent, fails the
// test. The SDK's reader adds the extensions kafkatopic, kafkapartition
// and kafkaoffset. Call it from the test's goroutine.
func ReadCloudEvent(t testing.TB, m *sarama.ConsumerMessage) event.Event {
	t.Helper()
	msg := kafka_sarama.NewMessageFromConsumerMessage(m)
	if msg.ReadEncoding() == binding.EncodingUnknown {
		t.Fatalf("record %s/%d@%d is not a CloudEvent: no ce_specversion header and no CloudEvents content-type", m.Topic, m.Partition, m.Offset)
	}
	e, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		t.Fatalf("read record %s/%d@%d as a CloudEvent: %v", m.Topic, m.Partition, m.Offset, err)
	}
	if err := e.Validate(); err != nil {
		t.Fatalf("record %s/%d@%d is an invalid CloudEvent: %v\n%s", m.Topic, m.Partition, m.Offset, err, e)
	}
	return *e
}
