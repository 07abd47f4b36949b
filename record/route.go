package record

import (
	"errors"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/sink"
)

// routeReason maps a sink.Router error to its dead-letter reason, and the
// fix to append to the error when the router's own text does not say it.
func routeReason(err error) (reason, fix string) {
	switch {
	case errors.Is(err, sink.ErrTopicLimit):
		return deadletter.ReasonTopicLimit, ""
	case errors.Is(err, sink.ErrTopicNotAllowed):
		return deadletter.ReasonTopicNotAllowed, ""
	default:
		return deadletter.ReasonInvalidTopic, "; fix kafka.topic_template or the row"
	}
}
