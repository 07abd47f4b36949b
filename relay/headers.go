package relay

import (
	"strconv"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Header keys the relay sets on every record. sarama only reads them, so
// one copy serves every event.
var (
	hdrEventID       = []byte(outboxschema.HeaderEventID)
	hdrEventType     = []byte(outboxschema.HeaderEventType)
	hdrAggregateType = []byte(outboxschema.HeaderAggregateType)
	hdrAggregateID   = []byte(outboxschema.HeaderAggregateID)
	hdrLSN           = []byte(outboxschema.HeaderLSN)
)

// ownHeaders is how many headers the relay sets before the row's own.
const ownHeaders = 5

// headers builds the Kafka headers of one event: the relay's own, then each
// top-level key of the row's headers column (the decoder refuses a row
// whose keys include one of the relay's, outboxschema.ReservedHeader). The values of all of them
// share one allocation; the key of the record is the aggregate_id header's
// value. commitLSN is the transaction's commit LSN, rendered once.
func headers(ev *decoder.Event, commitLSN string) (h []sarama.RecordHeader, key []byte) {
	n := 20 + len(ev.MessageID) + len(ev.IDText) + len(ev.EventType) + len(ev.AggregateType) + len(ev.AggregateID) + len(commitLSN)
	for _, x := range ev.Headers {
		n += len(x.Key)
	}
	buf := make([]byte, 0, n)
	add := func(s string) []byte {
		start := len(buf)
		buf = append(buf, s...)
		return buf[start:len(buf):len(buf)]
	}
	start := len(buf)
	if ev.Source == decoder.SourceMessage {
		buf = append(buf, ev.MessageID...) // the envelope's id
	} else if ev.IDText != "" {
		buf = append(buf, ev.IDText...) // a uuid or text id column
	} else {
		buf = strconv.AppendInt(buf, ev.ID, 10)
	}
	id := buf[start:len(buf):len(buf)]
	key = add(ev.AggregateID)
	h = make([]sarama.RecordHeader, ownHeaders, ownHeaders+len(ev.Headers))
	h[0] = sarama.RecordHeader{Key: hdrEventID, Value: id}
	h[1] = sarama.RecordHeader{Key: hdrEventType, Value: add(ev.EventType)}
	h[2] = sarama.RecordHeader{Key: hdrAggregateType, Value: add(ev.AggregateType)}
	h[3] = sarama.RecordHeader{Key: hdrAggregateID, Value: key}
	h[4] = sarama.RecordHeader{Key: hdrLSN, Value: add(commitLSN)}
	for _, x := range ev.Headers {
		h = append(h, sarama.RecordHeader{Key: add(x.Key), Value: x.Value})
	}
	return h, key
}
