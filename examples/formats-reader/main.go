// Command formats-reader prints the records of a topic as a consumer of
// another stack would read them: CloudEvents attributes (binary or
// structured mode, through package inbox's reader), and a value in the
// Schema Registry wire format decoded through the registry (package
// serialize) back to JSON. One JSON line per record; it stops after -idle
// without a new record.
//
//	go run ./examples/formats-reader -brokers localhost:9092 -topic outbox.event.order [-registry http://registry:8081]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/serialize"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap servers, comma-separated")
	topic := flag.String("topic", "outbox.event.order", "topic to read from its start")
	registry := flag.String("registry", "", "Schema Registry URL, to decode wire-format values (empty: print them as they are)")
	idle := flag.Duration("idle", 3*time.Second, "stop after this long without a new record")
	flag.Parse()
	if err := run(*brokers, *topic, *registry, *idle); err != nil {
		fmt.Fprintln(os.Stderr, "formats-reader:", err)
		os.Exit(1)
	}
}

func run(brokers, topic, registry string, idle time.Duration) error {
	var ser *serialize.Serializer
	if registry != "" {
		var err error
		if ser, err = serialize.New(serialize.JSON, nil, serialize.RegistryConfig{URL: registry}, zerolog.Nop(), nil); err != nil {
			return err
		}
		defer ser.Close()
	}
	cfg := sarama.NewConfig()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	c, err := sarama.NewConsumer(strings.Split(brokers, ","), cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	parts, err := c.Partitions(topic)
	if err != nil {
		return fmt.Errorf("topic %s: %w", topic, err)
	}
	recs := make(chan *sarama.ConsumerMessage)
	for _, p := range parts {
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("topic %s partition %d: %w", topic, p, err)
		}
		defer pc.Close()
		go func() {
			for r := range pc.Messages() {
				recs <- r
			}
		}()
	}
	out := json.NewEncoder(os.Stdout)
	for {
		select {
		case r := <-recs:
			if err := out.Encode(describe(ser, r)); err != nil {
				return err
			}
		case <-time.After(idle):
			return nil
		}
	}
}

// describe is what a consumer knows of r.
func describe(ser *serialize.Serializer, r *sarama.ConsumerMessage) map[string]any {
	d := map[string]any{"partition": r.Partition, "offset": r.Offset, "key": string(r.Key)}
	m, err := inbox.ParseMessage(r)
	if err != nil {
		d["error"] = err.Error()
		return d
	}
	d["event_id"], d["event_type"] = m.EventID, m.EventType
	if ce := m.CloudEvent; ce != nil {
		d["cloudevent"] = map[string]any{"mode": ce.Mode, "id": ce.ID, "source": ce.Source, "type": ce.Type,
			"subject": ce.Subject, "time": ce.Time, "datacontenttype": ce.DataContentType, "dataschema": ce.DataSchema}
	}
	payload := m.Payload
	if id, ok := inbox.WireSchemaID(payload); ok {
		d["schema_id"] = id
		if ser != nil {
			if payload, _, err = ser.Decode(context.Background(), r.Topic, payload); err != nil {
				d["error"] = err.Error()
				return d
			}
		}
	}
	if json.Valid(payload) {
		d["payload"] = json.RawMessage(payload)
	} else {
		d["payload_bytes"] = payload
	}
	return d
}
