package preflight

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/sink"
)

func ptr(s string) *string { return &s }

// val is a routing value: nil for NULL.
func val(agg, evt *string, rows int64) RouteValue {
	return RouteValue{AggregateType: agg, EventType: evt, Rows: rows}
}

func route(t *testing.T, table, tmpl, routeBy, typ string, own bool) Route {
	t.Helper()
	tb, err := outboxschema.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := sink.ParseTemplate(tmpl)
	if err == nil {
		tp, err = tp.ForTable(tb.Schema, tb.Name)
	}
	if err != nil {
		t.Fatal(err)
	}
	return Route{Table: tb, Template: tp, RouteBy: routeBy, Type: typ, Own: own}
}

// topicSummary renders a plan's topics for comparison: name, values,
// rows, tables, every.
func topicSummary(p routePlan) []string {
	var out []string
	for _, u := range p.Topics {
		s := fmt.Sprintf("%s values=%d rows=%d", u.Topic, u.Values, u.Rows)
		if len(u.Tables) > 0 {
			s += " tables=" + strings.Join(u.Tables, ",")
		}
		if len(u.Every) > 0 {
			s += " every=" + strings.Join(u.Every, ",")
		}
		if u.DeadLetter {
			s += " dlq"
		}
		out = append(out, s)
	}
	return out
}

func badSummary(p routePlan) []string {
	var out []string
	for _, b := range p.Bad {
		out = append(out, fmt.Sprintf("%s: %s rows=%d %s", b.Source, b.Value, b.Rows, b.Reason))
	}
	return out
}

// The routing values read are rendered with the relay's router and grouped
// by topic; those that can never be published are poison, named by value.
func TestPlanRoutes(t *testing.T) {
	own := "outbox.event.{aggregate_type}"
	tests := []struct {
		name   string
		change func(o *Options)
		reads  []RouteRead
		topics []string
		bad    []string
		events int
	}{
		{"own table: one topic exists, one misspelt", nil,
			[]RouteRead{{Table: "public.outbox", Values: []RouteValue{val(ptr("order"), nil, 5), val(ptr("ordr"), nil, 2)}}},
			[]string{"outbox.dlq values=0 rows=0 dlq", "outbox.event.order values=1 rows=5 tables=public.outbox", "outbox.event.ordr values=1 rows=2 tables=public.outbox"},
			nil, 2},
		{"event_type in the template: one topic per pair", func(o *Options) {
			o.Routes = []Route{route(t, "public.outbox", "{aggregate_type}.{event_type}", "aggregate_type", "event_type", true)}
		}, []RouteRead{{Table: "public.outbox", Values: []RouteValue{val(ptr("order"), ptr("created"), 3), val(ptr("order"), ptr("paid"), 1)}}},
			[]string{"order.created values=1 rows=3 tables=public.outbox", "order.paid values=1 rows=1 tables=public.outbox", "outbox.dlq values=0 rows=0 dlq"},
			nil, 2},
		{"a bad name, a NULL and an empty value", nil,
			[]RouteRead{{Table: "public.outbox", Values: []RouteValue{val(ptr("bad topic"), nil, 4), val(nil, nil, 1), val(ptr(""), nil, 1)}}},
			[]string{"outbox.dlq values=0 rows=0 dlq", "outbox.event. values=1 rows=1 tables=public.outbox"},
			[]string{`public.outbox: aggregate_type "bad topic" rows=4 invalid_topic`, "public.outbox: aggregate_type NULL rows=1 bad_row"}, 1},
		{"the allowlist refuses a topic", func(o *Options) { o.Kafka.TopicAllowlist = []string{"outbox.event.order"} },
			[]RouteRead{{Table: "public.outbox", Values: []RouteValue{val(ptr("order"), nil, 5), val(ptr("audit"), nil, 2)}}},
			[]string{"outbox.dlq values=0 rows=0 dlq", "outbox.event.order values=1 rows=5 tables=public.outbox"},
			[]string{`public.outbox: aggregate_type "audit" rows=2 topic_not_allowed`}, 1},
		{"on_poison halt: no dead-letter topic", func(o *Options) { o.PoisonHalts = true },
			[]RouteRead{{Table: "public.outbox", Values: []RouteValue{val(ptr("order"), nil, 5)}}},
			[]string{"outbox.event.order values=1 rows=5 tables=public.outbox"}, nil, 1},
		{"empty table: the dead-letter topic only", nil, []RouteRead{{Table: "public.outbox"}},
			[]string{"outbox.dlq values=0 rows=0 dlq"}, nil, 0},
		{"fixed template: every event, nothing read", func(o *Options) {
			o.Kafka.TopicTemplate = "events"
			o.Routes = []Route{route(t, "public.outbox", "events", "aggregate_type", "event_type", true)}
		}, []RouteRead{{Table: "public.outbox", Fixed: true}},
			[]string{"events values=0 rows=0 every=public.outbox", "outbox.dlq values=0 rows=0 dlq"}, nil, 1},
		{"two mapped tables: {table}, route_by none, a shared topic", func(o *Options) {
			o.Routes = []Route{
				route(t, "billing.events", "{schema}.{aggregate_type}", "stream", "kind", false),
				route(t, "orders.outbox", "{schema}.{table}", "aggregate_type", "event_type", false),
				route(t, "shop.outbox", "billing.{aggregate_type}", "kind", "", false),
			}
		}, []RouteRead{
			{Table: "billing.events", Values: []RouteValue{val(ptr("invoice"), nil, 7)}},
			{Table: "orders.outbox", Fixed: true},
			{Table: "shop.outbox", Values: []RouteValue{val(ptr("invoice"), nil, 2), val(ptr("refund"), nil, 1)}},
		},
			[]string{"billing.invoice values=2 rows=9 tables=billing.events,shop.outbox", "billing.refund values=1 rows=1 tables=shop.outbox",
				"orders.outbox values=0 rows=0 every=orders.outbox", "outbox.dlq values=0 rows=0 dlq"}, nil, 3},
		{"the dead-letter topic as an event topic is not counted", func(o *Options) {
			o.Routes = []Route{route(t, "public.outbox", "outbox.{aggregate_type}", "aggregate_type", "event_type", true)}
		}, []RouteRead{{Table: "public.outbox", Values: []RouteValue{val(ptr("order"), nil, 5), val(ptr("dlq"), nil, 1)}}},
			[]string{"outbox.dlq values=1 rows=1 tables=public.outbox dlq", "outbox.order values=1 rows=5 tables=public.outbox"}, nil, 1},
		{"messages with a template of no row field", func(o *Options) {
			o.MessagesPrefix = "orders-outbox"
			o.Kafka.TopicTemplate = "all.{schema}events"
			o.Routes = []Route{route(t, "public.outbox", "all.{schema}events", "aggregate_type", "event_type", true)}
		}, []RouteRead{{Table: "public.outbox", Fixed: true}},
			[]string{"all.events values=0 rows=0 every=" + messageSource, "all.publicevents values=0 rows=0 every=public.outbox", "outbox.dlq values=0 rows=0 dlq"}, nil, 2},
		{"PostgreSQL unreachable: the fixed topic still", func(o *Options) {
			o.Routes = []Route{route(t, "public.outbox", "{schema}.events", "aggregate_type", "event_type", true)}
		}, nil, []string{"outbox.dlq values=0 rows=0 dlq", "public.events values=0 rows=0 every=public.outbox"}, nil, 1},
		{"messages with fields: not checked", func(o *Options) { o.MessagesPrefix = "orders-outbox" },
			[]RouteRead{{Table: "public.outbox"}}, []string{"outbox.dlq values=0 rows=0 dlq"}, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			o.Routes = []Route{route(t, "public.outbox", own, "aggregate_type", "event_type", true)}
			if tt.change != nil {
				tt.change(&o)
			}
			p := planRoutes(o, tt.reads)
			if got := topicSummary(p); !slices.Equal(got, tt.topics) {
				t.Errorf("topics\n  got  %q\n  want %q", got, tt.topics)
			}
			if got := badSummary(p); !slices.Equal(got, tt.bad) {
				t.Errorf("bad routes\n  got  %q\n  want %q", got, tt.bad)
			}
			if p.EventTopics != tt.events {
				t.Errorf("EventTopics = %d, want %d", p.EventTopics, tt.events)
			}
			if o.MessagesPrefix != "" && strings.Contains(o.Kafka.TopicTemplate, "{aggregate_type}") != p.MessagesUnchecked {
				t.Errorf("MessagesUnchecked = %v", p.MessagesUnchecked)
			}
		})
	}
}

// One kafka.topic line per missing topic: the topic, what routes to it
// (value, rows), why it matters and the fix; a fail with
// kafka.auto_create_topics off, a note (ok) with both auto-creations on.
func TestMissingTopicLines(t *testing.T) {
	f := healthy()
	f.Options.Kafka.AutoCreateTopics = false
	f.PG.Routes = []RouteRead{{Table: "public.outbox", Values: []RouteValue{
		val(ptr("order"), nil, 5), val(ptr("ordr"), nil, 2), val(ptr("bad topic"), nil, 1)}}}
	f.Kafka.Topics = []TopicFact{{Name: "outbox.dlq", DeadLetter: true, Exists: true, Partitions: 1},
		{Name: "outbox.event.order", Exists: true, Partitions: 3}, {Name: "outbox.event.ordr"}}
	r := Evaluate(f)
	if r.ExitCode != report.ExitBad {
		t.Errorf("exit %d, want %d", r.ExitCode, report.ExitBad)
	}
	var lines []report.Check
	for _, c := range r.Checks {
		if c.Name == "kafka.topic" || c.Name == "kafka.route" {
			lines = append(lines, c)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("want one kafka.topic and one kafka.route line, got %+v", lines)
	}
	c := lines[0]
	for _, w := range []string{"outbox.event.ordr does not exist", `aggregate_type "ordr"`, "2 rows", "public.outbox", "kafka.auto_create_topics is false"} {
		if !strings.Contains(c.Value, w) {
			t.Errorf("kafka.topic value %q lacks %q", c.Value, w)
		}
	}
	for _, w := range []string{"create topic outbox.event.ordr", "kafka-topics.sh --bootstrap-server k1:9092 --create --topic outbox.event.ordr",
		"kafka.auto_create_topics: true", "fix the rows' aggregate_type"} {
		if !strings.Contains(c.Fix, w) {
			t.Errorf("kafka.topic fix %q lacks %q", c.Fix, w)
		}
	}
	if c.Verdict != Fail {
		t.Errorf("kafka.topic = %s, want fail", c.Verdict)
	}
	b := lines[1]
	if b.Verdict != Warn || !strings.Contains(b.Value, `aggregate_type "bad topic"`) || !strings.Contains(b.Value, "invalid_topic") ||
		!strings.Contains(b.Fix, "fix the rows' aggregate_type") {
		t.Errorf("kafka.route: %+v", b)
	}
	sum := find(t, r, "kafka.topics")
	if sum.Verdict != OK || !strings.Contains(sum.Value, "1 of 3 topics missing") || !strings.Contains(sum.Value, "3 routing values (aggregate_type) in 8 rows") {
		t.Errorf("kafka.topics: %+v", sum)
	}

	// Both auto-creations on: the same line is a note.
	f.Options.Kafka.AutoCreateTopics = true
	if c := find(t, Evaluate(f), "kafka.topic"); c.Verdict != OK || !strings.Contains(c.Value, "created at the first event") {
		t.Errorf("auto-create on: %+v", c)
	}
	// on_poison halt: the bad value halts the relay.
	f.Options.PoisonHalts = true
	if c := find(t, Evaluate(f), "kafka.route"); c.Verdict != Fail || !strings.Contains(c.Value, "halts") {
		t.Errorf("halt: %+v", c)
	}
}

// Many missing topics: maxLines lines, then one naming the rest; more
// topics than kafka.max_topics warns.
func TestManyMissingTopics(t *testing.T) {
	f := healthy()
	f.Options.Kafka.AutoCreateTopics = false
	f.Options.Kafka.MaxTopics = 10
	var vs []RouteValue
	f.Kafka.Topics = nil
	for i := range 30 {
		vs = append(vs, val(ptr(fmt.Sprintf("t%02d", i)), nil, 1))
		f.Kafka.Topics = append(f.Kafka.Topics, TopicFact{Name: fmt.Sprintf("outbox.event.t%02d", i)})
	}
	f.PG.Routes = []RouteRead{{Table: "public.outbox", Values: vs, Capped: true}}
	r := Evaluate(f)
	n := 0
	var last report.Check
	for _, c := range r.Checks {
		if c.Name == "kafka.topic" {
			n++
			last = c
		}
	}
	if n != maxLines+1 || !strings.HasPrefix(last.Value, "and 10 more topics do not exist: outbox.event.t20") {
		t.Errorf("%d kafka.topic lines, the last %+v", n, last)
	}
	if c := find(t, r, "kafka.max_topics"); c.Verdict != Warn || !strings.Contains(c.Fix, "at least 30") {
		t.Errorf("kafka.max_topics: %+v", c)
	}
	if c := find(t, r, "kafka.topics"); !strings.Contains(c.Value, "more than 10000 distinct values, only the 10000 commonest checked") {
		t.Errorf("bound not said: %+v", c)
	}
}

// The query quotes the mapped columns and the table (ONLY for a plain
// table), reads only the
// columns the template renders, skips the own table's dead-lettered rows,
// and asks one value more than the bound to see it hit.
func TestRouteSQL(t *testing.T) {
	tests := []struct {
		r           Route
		partitioned bool
		skip        bool
		want        string
	}{
		{route(t, "public.outbox", "outbox.event.{aggregate_type}", "aggregate_type", "event_type", true), false, true,
			`SELECT left("aggregate_type"::text, 256), '', count(*) FROM ONLY "public"."outbox" WHERE "dead_lettered_at" IS NULL GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT 10001`},
		{route(t, `Billing.Events`, "{event_type}.{aggregate_type}", `Stream "x"`, "kind", false), true, false,
			`SELECT left("Stream ""x"""::text, 256), left("kind"::text, 256), count(*) FROM "Billing"."Events" GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT 10001`},
		{route(t, "public.outbox", "e.{event_type}", "aggregate_type", "", false), false, false,
			`SELECT '', '', count(*) FROM ONLY "public"."outbox" GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT 10001`},
	}
	for _, tt := range tests {
		if got := routeSQL(tt.r, pgsetup.FromItem(tt.r.Table, tt.partitioned), tt.skip); got != tt.want {
			t.Errorf("routeSQL\n  got  %s\n  want %s", got, tt.want)
		}
	}
}
