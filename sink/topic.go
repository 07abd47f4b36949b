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
	ref int // 0 literal, 1 aggregate_type, 2 event_type, 3 schema, 4 table
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
		case "schema":
			t.parts = append(t.parts, part{ref: 3})
		case "table":
			t.parts = append(t.parts, part{ref: 4})
		default:
			return Template{}, fmt.Errorf("%q uses unknown placeholder {%s}; known: {aggregate_type}, {event_type}, {schema}, {table}", s, name)
		}
		rest = rest[i+j+1:]
	}
	return t.finish()
}

// finish merges adjacent literals, notes whether the template is fixed and
// checks that it can render a valid name.
func (t Template) finish() (Template, error) {
	var parts []part
	for _, p := range t.parts {
		if n := len(parts); p.ref == 0 && n > 0 && parts[n-1].ref == 0 {
			parts[n-1].lit += p.lit
			continue
		}
		parts = append(parts, p)
	}
	t.parts = parts
	t.fixed = true
	for _, p := range t.parts {
		t.fixed = t.fixed && p.ref == 0
	}
	// Render with harmless values so bad literal parts fail at start, not
	// at the first event.
	check := func() error { _, err := t.render("x", "x", "x", "x"); return err }
	if t.fixed {
		check = func() error {
			if len(t.parts) == 0 {
				return ValidTopic("")
			}
			return ValidTopic(t.parts[0].lit)
		}
	}
	if err := check(); err != nil {
		return Template{}, err
	}
	return t, nil
}

// ForTable returns the template with {schema} and {table} replaced by the
// outbox table's names, once at start: rendering an event then costs what
// it cost before. An error says which name makes the topic invalid.
func (t Template) ForTable(schema, table string) (Template, error) {
	out := Template{parts: make([]part, 0, len(t.parts))}
	for _, p := range t.parts {
		switch p.ref {
		case 3:
			p = part{lit: schema}
		case 4:
			p = part{lit: table}
		}
		out.parts = append(out.parts, p)
	}
	return out.finish()
}

// Uses reports which of an event's routing fields the template renders:
// when neither, every event (of its table, after ForTable) goes to one
// topic. Pure; safe from any goroutine.
func (t Template) Uses() (aggregateType, eventType bool) {
	for _, p := range t.parts {
		aggregateType = aggregateType || p.ref == 1
		eventType = eventType || p.ref == 2
	}
	return aggregateType, eventType
}

// Render returns the topic for one event, or an error naming the value that
// makes the name invalid for Kafka.
// {schema} and {table} not replaced by ForTable render as "".
func (t Template) Render(aggregateType, eventType string) (string, error) {
	return t.render(aggregateType, eventType, "", "")
}

// appendTo appends what Render would return for these fields to b, without
// checking it.
func (t Template) appendTo(b []byte, aggregateType, eventType string) []byte {
	for _, p := range t.parts {
		switch p.ref {
		case 0:
			b = append(b, p.lit...)
		case 1:
			b = append(b, aggregateType...)
		case 2:
			b = append(b, eventType...)
		}
	}
	return b
}

func (t Template) render(aggregateType, eventType, schema, table string) (string, error) {
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
		case 3:
			b.WriteString(schema)
		case 4:
			b.WriteString(table)
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
