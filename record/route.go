package record

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Route returns the topic of ev, or why ev is poison: a bad row
// (decoder.Event.Err) or a topic the router refuses. Then reason is the
// dead-letter reason, err says what to fix, and topic is the refused name
// ("" when there is none). It uses router, so it is called from the
// router's goroutine only.
func Route(router *sink.Router, table string, ev *decoder.Event) (topic, reason string, err error) {
	return RouteWith(router, router.Template(), table, ev)
}

// RouteWith is Route with the topic template of ev's table.
func RouteWith(router *sink.Router, tmpl sink.Template, table string, ev *decoder.Event) (topic, reason string, err error) {
	if ev.Err != nil {
		switch {
		case ev.Err.ReservedHeader != "":
			return "", deadletter.ReasonReservedHeader, ev.Err
		case ev.Source == decoder.SourceMessage:
			return "", deadletter.ReasonBadMessage, ev.Err
		}
		return "", deadletter.ReasonBadRow, ev.Err
	}
	topic, err = router.RouteWith(tmpl, ev.AggregateType, ev.EventType)
	if err != nil {
		reason, fix := routeReason(err)
		what := fmt.Sprintf("outbox row %s id=%d", table, ev.ID)
		switch {
		case ev.Source == decoder.SourceMessage:
			what = fmt.Sprintf("outbox message id=%q", ev.MessageID)
			fix = strings.Replace(fix, "or the row", "or the message", 1)
		case ev.IDText != "":
			what = fmt.Sprintf("outbox row %s id=%s", table, strconv.Quote(ev.IDText))
		}
		return topic, reason, fmt.Errorf("route %s at LSN %s (aggregate_type %q, event_type %q): %w%s",
			what, ev.LSN, ev.AggregateType, ev.EventType, err, fix)
	}
	return topic, "", nil
}

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
