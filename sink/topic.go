package sink

import (
	"fmt"
	"strings"
)

// Template renders a topic name from an event's routing fields.
type Template struct {
	parts []part
	fixed bool
}

type part struct {
	lit string
	ref int // 0 literal, 1 aggregate_type, 2 event_type
}

// ParseTemplate parses a topic template such as "outbox.event.{aggregate_type}".
func ParseTemplate(s string) (Template, error) {
	if s == "" {
		return Template{}, fmt.Errorf("is empty; use e.g. outbox.event.{aggregate_type}")
	}
	var t Template
	rest := s
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			t.parts = append(t.parts, part{lit: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, part{lit: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return Template{}, fmt.Errorf("%q has an unclosed '{'", s)
		}
		switch name := rest[i+1 : i+j]; name {
		case "aggregate_type":
			t.parts = append(t.parts, part{ref: 1})
		case "event_type":
			t.parts = append(t.parts, part{ref: 2})
		default:
			return Template{}, fmt.Errorf("%q uses unknown placeholder {%s}; known: {aggregate_type}, {event_type}", s, name)
		}
		rest = rest[i+j+1:]
	}
	t.fixed = true
	for _, p := range t.parts {
		t.fixed = t.fixed && p.ref == 0
	}
	// Render with harmless values so bad literal parts fail at start, not
	// at the first event.
	check := func() error { _, err := t.Render("x", "x"); return err }
	if t.fixed {
		check = func() error { return ValidTopic(s) }
	}
	if err := check(); err != nil {
		return Template{}, err
	}
	return t, nil
}

// Render returns the topic for one event, or an error naming the value that
// makes the name invalid for Kafka.
func (t Template) Render(aggregateType, eventType string) (string, error) {
	if t.fixed {
		return t.parts[0].lit, nil
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch p.ref {
		case 0:
			b.WriteString(p.lit)
		case 1:
			b.WriteString(aggregateType)
		case 2:
			b.WriteString(eventType)
		}
	}
	topic := b.String()
	if err := ValidTopic(topic); err != nil {
		return "", err
	}
	return topic, nil
}

// ValidTopic applies Kafka's topic name rules.
func ValidTopic(s string) error {
	if s == "" || s == "." || s == ".." {
		return fmt.Errorf("topic %q is not a valid Kafka topic name", s)
	}
	if len(s) > 249 {
		return fmt.Errorf("topic %q is longer than 249 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic %q has character %q; Kafka allows only [a-zA-Z0-9._-]", s, c)
		}
	}
	return nil
}
