package relay

import (
	"errors"
	"fmt"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/record"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/sink"
)

// None is the value of an optional columns.* key that maps no column.
const None = "none"

// ColumnsConfig is the column mapping of one outbox table (keys columns.*;
// meanings follow Debezium's EventRouter options). An empty key takes the
// default of the record format: this relay's own table (id, aggregate_id,
// event_type, payload, aggregate_type, headers), or with compat: debezium,
// Debezium's (id, aggregateid, type, payload, aggregatetype, no headers).
// The optional keys type, route_by and headers take "none" for no column.
type ColumnsConfig struct {
	ID         string   `yaml:"id"`
	Key        string   `yaml:"key"`
	Type       string   `yaml:"type"`
	Payload    string   `yaml:"payload"`
	RouteBy    string   `yaml:"route_by"`
	Headers    string   `yaml:"headers"`
	Additional []string `yaml:"additional"`
}

// zero reports whether no key is set.
func (c ColumnsConfig) zero() bool {
	return c.ID == "" && c.Key == "" && c.Type == "" && c.Payload == "" && c.RouteBy == "" && c.Headers == "" && len(c.Additional) == 0
}

// TableConfig is one item of the tables list: several outbox tables in one
// slot and publication, each with its own mapping and topic template.
type TableConfig struct {
	Name          string        `yaml:"name"` // schema.table
	Columns       ColumnsConfig `yaml:"columns"`
	TopicTemplate string        `yaml:"topic_template"` // default kafka.topic_template
}

// Outbox is one outbox table as the relay reads it: resolved from
// postgres.table and columns, or from one item of tables, and compat.
type Outbox struct {
	Mapping outboxschema.Mapping
	// Template is the table's topic template, {schema} and {table} replaced.
	Template sink.Template
	// Own: the relay's own table read the relay's own way, alone
	// (postgres.table, default columns, no compat, no tables list). Only
	// then are dead-letter row marks, retention, the delivery horizon and
	// replay on: they need the bookkeeping columns, created_at,
	// published_at and a BIGINT id.
	Own bool
}

// Outboxes resolves the outbox tables of c (compat, postgres.table,
// columns, tables, kafka.topic_template). Every problem is named by its
// key. It does no I/O: the column types are checked against the table at
// start (pgsetup.Prepare).
func (c Config) Outboxes() ([]Outbox, error) {
	var errs []error
	switch c.Compat {
	case record.FormatOwn, record.FormatDebezium:
	default:
		return nil, fmt.Errorf("compat: %q is not debezium (read Debezium's outbox table, write what its EventRouter writes) or empty (this relay's own table and records)", c.Compat)
	}
	base, err := sink.ParseTemplate(c.Kafka.TopicTemplate)
	if err != nil {
		return nil, fmt.Errorf("kafka.topic_template: %w", err)
	}
	resolve := func(prefix string, t outboxschema.Table, cols ColumnsConfig, tmplText string) (Outbox, error) {
		m := outboxschema.DefaultMapping(t)
		if c.Compat == record.FormatDebezium {
			m = outboxschema.DebeziumMapping(t)
		}
		set := func(dst *string, v string, optional bool) {
			switch {
			case v == "":
			case optional && v == None:
				*dst = ""
			default:
				*dst = v
			}
		}
		set(&m.ID, cols.ID, false)
		set(&m.Key, cols.Key, false)
		set(&m.Type, cols.Type, true)
		set(&m.Payload, cols.Payload, false)
		set(&m.RouteBy, cols.RouteBy, true)
		set(&m.Headers, cols.Headers, true)
		var errs []error
		m.Additional, err = outboxschema.ParsePlacements(prefix+outboxschema.KeyColumnsAdditional, cols.Additional)
		errs = append(errs, err, m.Validate(prefix, record.Reserved(c.Compat)))
		if !m.Own() || c.Compat != record.FormatOwn {
			// A mapped table's event_id is its id column, as configured:
			// a column that happens to be named event_id is not read.
			m.EventID, m.ReplayOf = "", ""
		}
		o := Outbox{Mapping: m, Own: prefix == "" && m.Own() && c.Compat == record.FormatOwn}
		tmpl := base
		tmplKey := "kafka.topic_template"
		if tmplText != "" {
			tmplKey = prefix + "topic_template"
			if tmpl, err = sink.ParseTemplate(tmplText); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", tmplKey, err))
			}
		}
		if o.Template, err = tmpl.ForTable(t.Schema, t.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s for table %s: %w", tmplKey, t, err))
		}
		return o, errors.Join(errs...)
	}
	if len(c.Tables) == 0 {
		t, err := outboxschema.ParseTable(c.Postgres.Table)
		if err != nil {
			return nil, fmt.Errorf("postgres.table: %w", err)
		}
		o, err := resolve("", t, c.Columns, "")
		if err != nil {
			return nil, err
		}
		return []Outbox{o}, nil
	}
	if !c.Columns.zero() {
		errs = append(errs, errors.New("columns: is set together with tables: give each table its columns in its tables item, and remove the top-level columns block"))
	}
	if c.Postgres.Table != replication.DefaultConfig().Table {
		errs = append(errs, fmt.Errorf("postgres.table: %q is set together with tables: name every outbox table in tables, and remove postgres.table (OUTBOX_RELAY_TABLE)", c.Postgres.Table))
	}
	var out []Outbox
	seen := map[outboxschema.Table]bool{}
	for i, tc := range c.Tables {
		prefix := fmt.Sprintf("tables[%d].", i)
		t, err := outboxschema.ParseTable(tc.Name)
		if err != nil {
			var te *outboxschema.TableError
			if errors.As(err, &te) {
				err = fmt.Errorf("%q: %s", te.Input, te.Reason)
			}
			errs = append(errs, fmt.Errorf("%sname: %w", prefix, err))
			continue
		}
		if seen[t] {
			errs = append(errs, fmt.Errorf("%sname: table %s is listed twice", prefix, t))
			continue
		}
		seen[t] = true
		o, err := resolve(prefix, t, tc.Columns, tc.TopicTemplate)
		errs = append(errs, err)
		out = append(out, o)
	}
	if len(out) > maxTables {
		errs = append(errs, fmt.Errorf("tables: %d tables, at most %d are supported in one slot", len(out), maxTables))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// maxTables bounds the tables list, and so the table label of the per-table
// metrics.
const maxTables = 64

// Mappings returns the mappings of the outboxes, for replication.Config:
// nil when the relay reads only its own table its own way (the checks of
// that table include the row marks' columns and privileges).
func Mappings(obs []Outbox) []outboxschema.Mapping {
	if len(obs) == 1 && obs[0].Own {
		return nil
	}
	ms := make([]outboxschema.Mapping, len(obs))
	for i, o := range obs {
		ms[i] = o.Mapping
	}
	return ms
}
