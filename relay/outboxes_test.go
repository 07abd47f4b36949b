package relay

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	pg "github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/record"
)

func TestOutboxes(t *testing.T) {
	tests := []struct {
		name  string
		cfg   func(*Config)
		check func(t *testing.T, obs []Outbox)
		err   []string
	}{
		{name: "default: the relay's own table", check: func(t *testing.T, obs []Outbox) {
			if len(obs) != 1 || !obs[0].Own || !reflect.DeepEqual(obs[0].Mapping, outboxschema.DefaultMapping(outboxschema.Table{Schema: "public", Name: "outbox"})) || Mappings(obs) != nil {
				t.Errorf("got %+v", obs)
			}
		}},
		{name: "compat: Debezium's columns, not own", cfg: func(c *Config) { c.Compat = record.FormatDebezium }, check: func(t *testing.T, obs []Outbox) {
			m := obs[0].Mapping
			if obs[0].Own || m.ID != "id" || m.Key != "aggregateid" || m.RouteBy != "aggregatetype" || m.Type != "type" || m.Headers != "" || !m.TombstoneOnNull || m.EventID != "" {
				t.Errorf("got %+v", obs[0])
			}
			if topic, _ := obs[0].Template.Render("order", "x"); topic != "outbox.event.order" {
				t.Errorf("topic %q, want outbox.event.order", topic)
			}
		}},
		{name: "compat with columns on top, none", cfg: func(c *Config) {
			c.Compat = record.FormatDebezium
			c.Columns = ColumnsConfig{Key: "tenant", Type: None, Additional: []string{"type:header:eventType"}}
		}, check: func(t *testing.T, obs []Outbox) {
			m := obs[0].Mapping
			if m.Key != "tenant" || m.Type != "" || len(m.Additional) != 1 || m.Additional[0].Header != "eventType" {
				t.Errorf("got %+v", m)
			}
		}},
		{name: "a column changed: not own", cfg: func(c *Config) { c.Columns.Key = "tenant" }, check: func(t *testing.T, obs []Outbox) {
			if obs[0].Own || Mappings(obs) == nil {
				t.Errorf("a mapped table is own: %+v", obs[0])
			}
			if m := obs[0].Mapping; m.EventID != "" || m.ReplayOf != "" {
				t.Errorf("a mapped table reads identity columns %q %q: its event_id must stay its id column", m.EventID, m.ReplayOf)
			}
		}},
		{name: "the own table in a tables list keeps its identity columns", cfg: func(c *Config) {
			c.Tables = []TableConfig{{Name: "a.outbox"}, {Name: "b.events", Columns: ColumnsConfig{ID: "ref"}}}
		}, check: func(t *testing.T, obs []Outbox) {
			if m := obs[0].Mapping; m.EventID != "event_id" || m.ReplayOf != "dlq_replay_of" {
				t.Errorf("own-shaped table: identity columns %q %q", m.EventID, m.ReplayOf)
			}
			if m := obs[1].Mapping; m.EventID != "" || m.ReplayOf != "" {
				t.Errorf("mapped table: identity columns %q %q", m.EventID, m.ReplayOf)
			}
		}},
		{name: "unknown compat", cfg: func(c *Config) { c.Compat = "maxwell" }, err: []string{`compat: "maxwell" is not debezium`}},
		{name: "placement forging id under compat", cfg: func(c *Config) { c.Compat = record.FormatDebezium; c.Columns.Additional = []string{"type:header:ID"} },
			err: []string{`columns.additional: header name "ID" (column type) is reserved`}},
		{name: "placement id is free without compat", cfg: func(c *Config) { c.Columns.Additional = []string{"aggregate_id:header:id"} }},
		{name: "tables with {schema} and {table}", cfg: func(c *Config) {
			c.Kafka.TopicTemplate = "{schema}.{table}.{aggregate_type}"
			c.Tables = []TableConfig{{Name: "billing.outbox"}, {Name: "orders.events", Columns: ColumnsConfig{ID: "ref"}, TopicTemplate: "o.{table}"}}
		}, check: func(t *testing.T, obs []Outbox) {
			if len(obs) != 2 || obs[0].Own || obs[1].Own || obs[1].Mapping.ID != "ref" {
				t.Fatalf("got %+v", obs)
			}
			if topic, _ := obs[0].Template.Render("inv", ""); topic != "billing.outbox.inv" {
				t.Errorf("table 0 topic %q", topic)
			}
			if topic, _ := obs[1].Template.Render("x", ""); topic != "o.events" {
				t.Errorf("table 1 topic %q", topic)
			}
		}},
		{name: "tables and columns", cfg: func(c *Config) { c.Tables = []TableConfig{{Name: "a.b"}}; c.Columns.Key = "k" },
			err: []string{"columns: is set together with tables"}},
		{name: "tables and postgres.table", cfg: func(c *Config) { c.Tables = []TableConfig{{Name: "a.b"}}; c.Postgres.Table = "x.y" },
			err: []string{`postgres.table: "x.y" is set together with tables`}},
		{name: "a table twice, a bad name, a bad item", cfg: func(c *Config) {
			c.Tables = []TableConfig{{Name: "a.b"}, {Name: "a.b"}, {Name: "a.b.c"}, {Name: "c.d", Columns: ColumnsConfig{Additional: []string{"x:envelope"}}, TopicTemplate: "bad topic"}}
		}, err: []string{"tables[1].name: table a.b is listed twice", `tables[2].name: "a.b.c": `, "tables[3].columns.additional: ", "tables[3].topic_template: "}},
		{name: "a schema name that makes no topic", cfg: func(c *Config) {
			c.Kafka.TopicTemplate = "{schema}.x"
			c.Tables = []TableConfig{{Name: "bil$ling.t"}}
		}, err: []string{"kafka.topic_template for table bil$ling.t: "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Postgres.URL = "postgres://u@h/db"
			c.Kafka.Brokers = []string{"k:9092"}
			if tt.cfg != nil {
				tt.cfg(&c)
			}
			obs, err := c.Outboxes()
			if len(tt.err) > 0 {
				if err == nil {
					t.Fatalf("no error, want %v", tt.err)
				}
				for _, w := range tt.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				if verr := c.Validate(); verr == nil {
					t.Error("Validate accepts it")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, obs)
			}
		})
	}
}

// A table other than the relay's own has no bookkeeping columns: its poison
// rows are dead-lettered (or halt) without a row mark, and the slot passes
// a dead letter once Kafka acked it.
func TestPoisonOfMappedTableHasNoRowMark(t *testing.T) {
	bad := pg.Row("43", "order", "o-2", "order.paid", `{}`, pg.Null)
	bad[2] = pg.Null // the key column IS NULL
	for _, halt := range []bool{false, true} {
		t.Run(map[bool]string{false: "dlq", true: "halt"}[halt], func(t *testing.T) {
			policy := fastPolicy
			policy.Halt = halt
			marker := &fakeMarker{marked: make(chan string, 10)}
			h := newHarnessWith(t, policy, func(string, int) error { return nil }, marker, func(c *PipelineConfig) {
				tbl := outboxschema.Table{Schema: "public", Name: "outbox"}
				c.Format = record.FormatDebezium
				c.Outboxes = []Outbox{{Mapping: outboxschema.DefaultMapping(tbl), Template: c.Template}}
			})
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- h.txnCtx(ctx, 100, 110, bad, order("44", "o-3")) }()
			if halt {
				waitUntil(t, func() bool { return h.p.Halted() != nil })
				cancel()
				<-errc
			} else {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				h.waitFlushed(110)
				sent, tries := h.pub.snapshot()
				if tries[testDLQ] != 1 || len(sent) != 2 {
					t.Fatalf("sent %v, want the dead letter and the event", tries)
				}
				for _, m := range sent {
					if m.Topic != testDLQ && (len(m.Headers) != 2 || string(m.Headers[0].Key) != "id" || string(m.Headers[0].Value) != "44" || string(m.Headers[1].Key) != "trace") {
						t.Errorf("event record headers %v, want id=44 then the row's trace (compat)", m.Headers)
					}
				}
			}
			select {
			case m := <-marker.marked:
				t.Errorf("row mark %q on a table without bookkeeping columns", m)
			case <-time.After(100 * time.Millisecond):
			}
		})
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
