// Package replay republishes outbox rows from the table: `outbox-relay
// replay`. It reads a range of rows in id order, in pages (keyset, bounded
// memory), and publishes each through sink.Producer as the very record the
// relay builds for it (record.Own, record.Route: same key, headers incl.
// event_id, topic routing), dead-letters poison rows under the relay's own
// policy, waits for every ack, and then sets published_at on the acked rows.
// It needs no slot and may run beside the relay: consumers deduplicate on
// event_id.
package replay

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Options select the rows to replay and the pace.
type Options struct {
	// Since and Until bound created_at: Since <= created_at < Until; zero
	// means unbounded.
	Since, Until time.Time
	// FromID and ToID bound id: FromID <= id <= ToID; zero means unbounded.
	FromID, ToID int64
	// AggregateType and EventType, when not empty, select rows with that
	// aggregate_type / event_type only.
	AggregateType, EventType string
	// Rate is the most rows per second to publish; 0 is unlimited.
	Rate float64
	// IncludeDeadLetters also selects dead-lettered rows not yet resolved.
	// Resolved ones are never selected: dlq replay republished the event
	// under a new row, or dlq resolve closed it on purpose.
	IncludeDeadLetters bool
}

// Usage is the replay command line, for usage texts.
const Usage = "outbox-relay replay --since TIME|--from-id N [--until TIME|--to-id M] [--aggregate-type T] [--event-type E] [--rate N/s] [--include-dead-letters] [config flags]\n" +
	"  TIME is RFC 3339 (2026-01-02T15:04:05Z) or a date (2026-01-02, UTC midnight); --since and --from-id are inclusive,\n" +
	"  --until is exclusive, --to-id inclusive; dead-lettered rows are left out unless --include-dead-letters, resolved ones always"

// Bind registers the replay flags on fs. After fs.Parse, the returned func
// checks them and returns the Options; its errors name the flag.
func Bind(fs *flag.FlagSet) func() (Options, error) {
	var since, until, fromID, toID, aggType, evType, rate string
	var set = map[string]bool{}
	var dead bool
	str := func(name, usage string, p *string) {
		fs.Func(name, usage, func(v string) error { *p, set[name] = v, true; return nil })
	}
	str("since", "replay rows with created_at >= TIME (RFC 3339 or 2006-01-02, UTC)", &since)
	str("until", "replay rows with created_at < TIME (RFC 3339 or 2006-01-02, UTC)", &until)
	str("from-id", "replay rows with id >= N", &fromID)
	str("to-id", "replay rows with id <= M", &toID)
	str("aggregate-type", "replay only rows with this aggregate_type", &aggType)
	str("event-type", "replay only rows with this event_type", &evType)
	str("rate", "most rows per second, as N/s (default unlimited)", &rate)
	fs.BoolVar(&dead, "include-dead-letters", false, "also replay dead-lettered rows not yet resolved (resolved ones never: dlq replay republished them as new rows, dlq resolve closed them)")
	return func() (Options, error) {
		o := Options{IncludeDeadLetters: dead}
		var errs []error
		bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
		switch {
		case set["since"] && set["from-id"]:
			bad("--since and --from-id exclude each other: give one of them")
		case !set["since"] && !set["from-id"]:
			bad("one of --since TIME or --from-id N is required: the first row to replay (by created_at or by id)")
		}
		if set["until"] && set["to-id"] {
			bad("--until and --to-id exclude each other: give at most one of them")
		}
		var err error
		if set["since"] {
			if o.Since, err = ParseTime(since); err != nil {
				bad("--since: %w", err)
			}
		}
		if set["until"] {
			if o.Until, err = ParseTime(until); err != nil {
				bad("--until: %w", err)
			}
		}
		id := func(name, v string) int64 {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 1 {
				bad("--%s: %q is not an outbox id (an integer >= 1)", name, v)
				return 0
			}
			return n
		}
		if set["from-id"] {
			o.FromID = id("from-id", fromID)
		}
		if set["to-id"] {
			o.ToID = id("to-id", toID)
		}
		if !o.Since.IsZero() && !o.Until.IsZero() && !o.Since.Before(o.Until) {
			bad("--until %s is not after --since %s: the range is empty", o.Until.Format(time.RFC3339Nano), o.Since.Format(time.RFC3339Nano))
		}
		if o.FromID > 0 && o.ToID > 0 && o.ToID < o.FromID {
			bad("--to-id %d is below --from-id %d: the range is empty", o.ToID, o.FromID)
		}
		if set["aggregate-type"] {
			if o.AggregateType = aggType; aggType == "" {
				bad("--aggregate-type: is empty; give an aggregate_type or leave the flag out")
			}
		}
		if set["event-type"] {
			if o.EventType = evType; evType == "" {
				bad("--event-type: is empty; give an event_type or leave the flag out")
			}
		}
		if set["rate"] {
			if o.Rate, err = ParseRate(rate); err != nil {
				bad("--rate: %w", err)
			}
		}
		return o, errors.Join(errs...)
	}
}

// ParseTime parses a replay TIME: RFC 3339 (with a zone or Z), or a date
// 2006-01-02, meaning midnight UTC.
func ParseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither RFC 3339 (2006-01-02T15:04:05Z, or with an offset like +02:00) nor a date (2006-01-02, UTC)", s)
}

// ParseRate parses "N/s" (N > 0, a decimal number) into rows per second.
func ParseRate(s string) (float64, error) {
	n, ok := strings.CutSuffix(strings.TrimSpace(s), "/s")
	f, err := strconv.ParseFloat(n, 64)
	if !ok || err != nil || f <= 0 || f > 1e9 {
		return 0, fmt.Errorf("%q is not a rate N/s with N > 0, e.g. 500/s", s)
	}
	return f, nil
}

// Describe renders the selection for logs and the summary.
func (o Options) Describe() string {
	var b []string
	if !o.Since.IsZero() {
		b = append(b, "created_at >= "+o.Since.Format(time.RFC3339Nano))
	}
	if !o.Until.IsZero() {
		b = append(b, "created_at < "+o.Until.Format(time.RFC3339Nano))
	}
	if o.FromID > 0 {
		b = append(b, "id >= "+strconv.FormatInt(o.FromID, 10))
	}
	if o.ToID > 0 {
		b = append(b, "id <= "+strconv.FormatInt(o.ToID, 10))
	}
	if o.AggregateType != "" {
		b = append(b, "aggregate_type = "+strconv.Quote(o.AggregateType))
	}
	if o.EventType != "" {
		b = append(b, "event_type = "+strconv.Quote(o.EventType))
	}
	if o.IncludeDeadLetters {
		b = append(b, "dead letters not yet resolved included")
	} else {
		b = append(b, "not dead-lettered")
	}
	return strings.Join(b, " AND ")
}
