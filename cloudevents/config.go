package cloudevents

import (
	"errors"
	"fmt"
	"strings"
)

// Config is the relay's cloudevents: block (envelope: cloudevents turns it
// on). Start from DefaultConfig.
type Config struct {
	// Mode is binary (attributes as ce_* headers, the payload as the value;
	// the default) or structured (the event as one JSON value).
	Mode string `yaml:"mode"`
	// Source is the template of ce_source; placeholders {schema} {table}
	// {aggregate_type} {event_type} {topic}, their values percent-encoded
	// as one path segment each. It must render to a non-empty
	// URI-reference.
	Source string `yaml:"source"`
	// Type is the template of ce_type, the same placeholders, values as
	// they are.
	Type string `yaml:"type"`
}

// Defaults of Config.
const (
	DefaultSource = "/outbox-relay/{schema}/{table}"
	DefaultType   = "{event_type}"
)

// DefaultConfig returns the defaults: binary mode, DefaultSource,
// DefaultType.
func DefaultConfig() Config {
	return Config{Mode: Binary, Source: DefaultSource, Type: DefaultType}
}

// Validate reports every problem, each naming its key under prefix (e.g.
// "cloudevents" gives "cloudevents.mode: ...").
func (c Config) Validate(prefix string) error {
	key := func(k string) string {
		if prefix == "" {
			return k
		}
		return prefix + "." + k
	}
	var errs []error
	if c.Mode != Binary && c.Mode != Structured {
		errs = append(errs, fmt.Errorf("%s: %q is not a content mode: binary (the default) or structured", key("mode"), c.Mode))
	}
	if _, err := CompileSource(c.Source); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", key("source"), err))
	}
	if _, err := CompileType(c.Type); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", key("type"), err))
	}
	return errors.Join(errs...)
}

// Templates are a Config's compiled templates.
type Templates struct {
	Source, Type Template
}

// Compile compiles c's templates (Validate's checks included); the relay
// calls it once at start and Render per event.
func (c Config) Compile() (Templates, error) {
	if err := c.Validate("cloudevents"); err != nil {
		return Templates{}, err
	}
	s, _ := CompileSource(c.Source)
	t, _ := CompileType(c.Type)
	return Templates{Source: s, Type: t}, nil
}

// Placeholder indexes in Template.
const (
	phSchema = iota
	phTable
	phAggregateType
	phEventType
	phTopic
	phLiteral
)

var placeholders = [...]string{"{schema}", "{table}", "{aggregate_type}", "{event_type}", "{topic}"}

// Template is a compiled source or type template. The zero Template
// renders "". Render is safe from any goroutine.
type Template struct {
	parts  []part
	escape bool // values percent-encoded (source)
}

type part struct {
	ph  int    // phLiteral or a placeholder
	lit string // when ph == phLiteral
}

func compile(s string) (Template, error) {
	var t Template
	for len(s) > 0 {
		i := strings.IndexAny(s, "{}")
		if i < 0 {
			t.parts = append(t.parts, part{ph: phLiteral, lit: s})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, part{ph: phLiteral, lit: s[:i]})
			s = s[i:]
		}
		if s[0] == '}' {
			return Template{}, errors.New("a '}' without its '{'")
		}
		end := strings.IndexByte(s, '}')
		if end < 0 {
			return Template{}, errors.New("a '{' without its '}'")
		}
		name, found := s[:end+1], -1
		for j, p := range placeholders {
			if p == name {
				found = j
			}
		}
		if found < 0 {
			return Template{}, fmt.Errorf("unknown placeholder %s: use %s", name, strings.Join(placeholders[:], " "))
		}
		t.parts = append(t.parts, part{ph: found})
		s = s[end+1:]
	}
	if len(t.parts) == 0 {
		return Template{}, errors.New("empty")
	}
	return t, nil
}

// CompileSource compiles a source template: placeholder values are
// percent-encoded (all but unreserved characters, sub-delims and '@'), so
// that any value renders a URI-reference; the literal text must be one.
func CompileSource(s string) (Template, error) {
	t, err := compile(s)
	if err != nil {
		return t, err
	}
	t.escape = true
	// A value cannot hold ':' (it is encoded), but one before the first
	// literal ':' would be part of the scheme: refused, or a value like
	// "1x" would make the source no URI-reference.
scheme:
	for i, p := range t.parts {
		if p.ph != phLiteral {
			continue
		}
		j := strings.IndexAny(p.lit, ":/?#")
		if j < 0 {
			continue
		}
		if p.lit[j] == ':' {
			for _, q := range t.parts[:i] {
				if q.ph != phLiteral {
					return Template{}, fmt.Errorf("%q has a placeholder in the URI scheme (before the first ':')", s)
				}
			}
		}
		break scheme
	}
	r := t.Render("s", "t", "a", "e", "topic")
	if err := checkURIRef(r); err != nil {
		return Template{}, fmt.Errorf("%q does not render a URI-reference: %s", s, err)
	}
	if err := checkString("source", r, true, ""); err != nil {
		return Template{}, err
	}
	return t, nil
}

// CompileType compiles a type template: values as they are.
func CompileType(s string) (Template, error) {
	t, err := compile(s)
	if err != nil {
		return t, err
	}
	for _, p := range t.parts {
		if p.ph == phLiteral {
			if err := checkString("type", p.lit, false, ""); err != nil {
				return Template{}, err
			}
		}
	}
	return t, nil
}

// Render fills the template. No fmt, no regexp: one allocation.
func (t Template) Render(schema, table, aggregateType, eventType, topic string) string {
	vals := [...]string{schema, table, aggregateType, eventType, topic}
	if len(t.parts) == 1 && (t.parts[0].ph == phLiteral || !t.escape) {
		if t.parts[0].ph == phLiteral {
			return t.parts[0].lit
		}
		return vals[t.parts[0].ph]
	}
	n := 0
	for _, p := range t.parts {
		if p.ph == phLiteral {
			n += len(p.lit)
		} else if t.escape {
			n += escapedLen(vals[p.ph])
		} else {
			n += len(vals[p.ph])
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range t.parts {
		switch {
		case p.ph == phLiteral:
			b.WriteString(p.lit)
		case t.escape:
			writeEscaped(&b, vals[p.ph])
		default:
			b.WriteString(vals[p.ph])
		}
	}
	return b.String()
}

// keep marks the bytes a source value keeps as they are: unreserved,
// sub-delims and '@' (not ':', which could look like a scheme, nor '/').
var keep = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = uriChars[c]
	}
	for _, c := range ":/?#" {
		t[c] = false
	}
	return t
}()

func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !keep[s[i]] {
			n += 2
		}
	}
	return n
}

func writeEscaped(b *strings.Builder, s string) {
	const upperHex = "0123456789ABCDEF"
	start := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; !keep[c] {
			b.WriteString(s[start:i])
			b.WriteByte('%')
			b.WriteByte(upperHex[c>>4])
			b.WriteByte(upperHex[c&0xf])
			start = i + 1
		}
	}
	b.WriteString(s[start:])
}
