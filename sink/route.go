package sink

import (
	"errors"
	"fmt"
	"strings"
)

// Routing errors, for errors.Is: the event can never be published as it is
// (a poison event).
var (
	ErrInvalidTopic    = errors.New("invalid topic")       // the template renders a name Kafka refuses
	ErrTopicNotAllowed = errors.New("topic not allowed")   // not in kafka.topic_allowlist
	ErrTopicLimit      = errors.New("topic limit reached") // one more than kafka.max_topics
)

// Bounds of kafka.max_topics. There is no "unlimited": a writer must not be
// able to make the relay (and the cluster) hold any number of topics.
const (
	DefaultMaxTopics = 100
	MaxMaxTopics     = 100000
)

// Allowlist is kafka.topic_allowlist: exact topic names, or prefixes ending
// in '*'. The empty Allowlist allows every topic.
type Allowlist struct {
	exact    map[string]bool
	prefixes []string
}

// ParseAllowlist parses the entries of kafka.topic_allowlist. Each entry is
// a valid topic name, or a non-empty prefix of one followed by a single '*'.
func ParseAllowlist(entries []string) (Allowlist, error) {
	var a Allowlist
	var errs []error
	for _, e := range entries {
		prefix, star := strings.CutSuffix(e, "*")
		switch {
		case e == "":
			errs = append(errs, errors.New("has an empty entry"))
		case star && prefix == "":
			errs = append(errs, errors.New(`"*" allows every topic: leave the allowlist empty instead`))
		case strings.Contains(prefix, "*"):
			errs = append(errs, fmt.Errorf("%q: '*' may only end an entry (a prefix such as orders.*)", e))
		case star:
			// A prefix must be the start of some valid name.
			if err := ValidTopic(prefix + "x"); err != nil {
				errs = append(errs, fmt.Errorf("%q: %w", e, err))
				continue
			}
			a.prefixes = append(a.prefixes, prefix)
		default:
			if err := ValidTopic(e); err != nil {
				errs = append(errs, err)
				continue
			}
			if a.exact == nil {
				a.exact = map[string]bool{}
			}
			a.exact[e] = true
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Allowlist{}, err
	}
	return a, nil
}

// Empty reports whether there is no allowlist (every topic is allowed).
func (a Allowlist) Empty() bool { return len(a.exact) == 0 && len(a.prefixes) == 0 }

// Allows reports whether topic may be published to.
func (a Allowlist) Allows(topic string) bool {
	if a.Empty() || a.exact[topic] {
		return true
	}
	for _, p := range a.prefixes {
		if strings.HasPrefix(topic, p) {
			return true
		}
	}
	return false
}

// Router decides each event's topic: the template renders it, the
// allowlist must allow it, and it must be one of the first maxTopics
// distinct topics routed to. It bounds what a writer of the outbox can make
// the relay hold: sarama keeps a goroutine and metadata per topic, and the
// published-events metric a series per topic, for the producer's lifetime.
// The dead-letter topic is published to anyway and never counted.
//
// The set of admitted topics is in memory and only grows: within one
// Router, a topic once admitted stays admitted and one refused at the
// limit stays refused, so a resent transaction is routed the same way.
//
// Not safe for concurrent use: each user has its own, used from one
// goroutine (the relay's pipeline: the replication loop; a replay: its
// reader).
type Router struct {
	tmpl       Template
	allow      Allowlist
	max        int
	deadLetter string
	admitted   map[string]string // topic -> the same string, handed out again
	scratch    []byte            // the topic being rendered, to look it up without allocating
}

// NewRouter returns a Router over tmpl. maxTopics must be in
// 1..MaxMaxTopics; deadLetter is the dead-letter topic.
func NewRouter(tmpl Template, maxTopics int, allow Allowlist, deadLetter string) (*Router, error) {
	if maxTopics < 1 || maxTopics > MaxMaxTopics {
		return nil, fmt.Errorf("kafka.max_topics: %d is out of range: use 1..%d", maxTopics, MaxMaxTopics)
	}
	return &Router{tmpl: tmpl, allow: allow, max: maxTopics, deadLetter: deadLetter,
		admitted: make(map[string]string, min(maxTopics, 1024))}, nil
}

// Route returns the topic of an event with these routing fields. On error
// the event must not be published: the error wraps ErrInvalidTopic (topic
// is "" then), ErrTopicNotAllowed or ErrTopicLimit (topic is the name it
// was refused, for the dead letter), and says which key to change.
func (r *Router) Route(aggregateType, eventType string) (topic string, err error) {
	return r.RouteWith(r.tmpl, aggregateType, eventType)
}

// Template returns the Router's own template.
func (r *Router) Template() Template { return r.tmpl }

// RouteWith is Route with another template (the event's table's), under
// the same allowlist and topic limit.
func (r *Router) RouteWith(tmpl Template, aggregateType, eventType string) (topic string, err error) {
	// The common case: a topic admitted before (so valid and allowed),
	// found without building a string.
	r.scratch = tmpl.appendTo(r.scratch[:0], aggregateType, eventType)
	if t, ok := r.admitted[string(r.scratch)]; ok {
		return t, nil
	}
	topic, err = tmpl.Render(aggregateType, eventType)
	if err != nil {
		return "", &routeError{kind: ErrInvalidTopic, msg: err.Error()}
	}
	if !r.allow.Allows(topic) {
		return topic, &routeError{kind: ErrTopicNotAllowed,
			msg: fmt.Sprintf("topic %q is not in kafka.topic_allowlist; add it (or a prefix such as %s*) to kafka.topic_allowlist", topic, routePrefix(topic))}
	}
	if topic == r.deadLetter {
		return topic, nil
	}
	if t, ok := r.admitted[topic]; ok {
		return t, nil
	}
	if len(r.admitted) >= r.max {
		return topic, &routeError{kind: ErrTopicLimit,
			msg: fmt.Sprintf("topic %q would be one more than the kafka.max_topics limit of %d distinct topics; raise kafka.max_topics (OUTBOX_RELAY_KAFKA_MAX_TOPICS) if the topic is wanted, and restart", topic, r.max)}
	}
	r.admitted[topic] = topic
	return topic, nil
}

// Topics returns how many distinct topics were admitted (the dead-letter
// topic not counted).
func (r *Router) Topics() int { return len(r.admitted) }

// routePrefix suggests an allowlist prefix: topic up to its last '.'.
func routePrefix(topic string) string {
	if i := strings.LastIndexByte(topic, '.'); i > 0 {
		return topic[:i+1]
	}
	return topic
}

type routeError struct {
	kind error
	msg  string
}

func (e *routeError) Error() string { return e.msg }
func (e *routeError) Unwrap() error { return e.kind }
