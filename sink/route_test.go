package sink

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// route is one event through a Router and what must come out.
type route struct {
	agg, ev string
	topic   string // want; also for refused events (the dead letter names it)
	err     error  // want: nil, ErrInvalidTopic, ErrTopicNotAllowed or ErrTopicLimit
}

func TestRouter(t *testing.T) {
	tests := []struct {
		name   string
		tmpl   string
		max    int
		allow  []string
		dlq    string
		routes []route
	}{
		{name: "limit: the first max distinct topics, repeats free, the next refused for good",
			tmpl: "t.{aggregate_type}", max: 2, dlq: "t.dlq",
			routes: []route{
				{agg: "a", topic: "t.a"}, {agg: "a", topic: "t.a"}, {agg: "b", topic: "t.b"},
				{agg: "c", topic: "t.c", err: ErrTopicLimit},
				{agg: "a", topic: "t.a"}, {agg: "b", topic: "t.b"},
				{agg: "c", topic: "t.c", err: ErrTopicLimit}, {agg: "d", topic: "t.d", err: ErrTopicLimit},
			}},
		{name: "the dead-letter topic is not counted",
			tmpl: "t.{aggregate_type}", max: 1, dlq: "t.dlq",
			routes: []route{
				{agg: "dlq", topic: "t.dlq"}, {agg: "a", topic: "t.a"}, {agg: "dlq", topic: "t.dlq"},
				{agg: "b", topic: "t.b", err: ErrTopicLimit},
			}},
		{name: "event_type placeholder counts distinct rendered names",
			tmpl: "{aggregate_type}.{event_type}", max: 2, dlq: "outbox.dlq",
			routes: []route{
				{agg: "order", ev: "paid", topic: "order.paid"}, {agg: "order", ev: "created", topic: "order.created"},
				{agg: "order", ev: "shipped", topic: "order.shipped", err: ErrTopicLimit},
			}},
		{name: "fixed topic is one topic",
			tmpl: "events", max: 1, dlq: "outbox.dlq",
			routes: []route{{agg: "a", topic: "events"}, {agg: "b", ev: "x", topic: "events"}}},
		{name: "allowlist: exact names and prefixes",
			tmpl: "{aggregate_type}", max: 100, allow: []string{"orders", "pay.*", "x.y.*"}, dlq: "outbox.dlq",
			routes: []route{
				{agg: "orders", topic: "orders"},
				{agg: "orders.v2", topic: "orders.v2", err: ErrTopicNotAllowed}, // exact means exact
				{agg: "orders2", topic: "orders2", err: ErrTopicNotAllowed},
				{agg: "pay.card", topic: "pay.card"},
				{agg: "pay.", topic: "pay."},                        // the prefix itself followed by nothing
				{agg: "pay", topic: "pay", err: ErrTopicNotAllowed}, // "pay.*" needs the dot
				{agg: "payx", topic: "payx", err: ErrTopicNotAllowed},
				{agg: "x.y.z", topic: "x.y.z"},
				{agg: "x.yz", topic: "x.yz", err: ErrTopicNotAllowed},
				{agg: "PAY.card", topic: "PAY.card", err: ErrTopicNotAllowed}, // case-sensitive, like Kafka
			}},
		{name: "allowlist before the limit: a refused topic does not use up a slot",
			tmpl: "{aggregate_type}", max: 1, allow: []string{"ok.*"}, dlq: "outbox.dlq",
			routes: []route{
				{agg: "bad", topic: "bad", err: ErrTopicNotAllowed},
				{agg: "ok.a", topic: "ok.a"},
				{agg: "ok.b", topic: "ok.b", err: ErrTopicLimit},
			}},
		{name: "the dead-letter topic is subject to the allowlist when an event renders it",
			tmpl: "{aggregate_type}", max: 1, allow: []string{"orders"}, dlq: "outbox.dlq",
			routes: []route{{agg: "outbox.dlq", topic: "outbox.dlq", err: ErrTopicNotAllowed}}},
		{name: "hostile names: invalid ones are refused and never count",
			tmpl: "t.{aggregate_type}", max: 2, dlq: "t.dlq",
			routes: []route{
				{agg: "a b", err: ErrInvalidTopic},
				{agg: "a/b", err: ErrInvalidTopic},
				{agg: "\u00e4", err: ErrInvalidTopic},
				{agg: "a\x00", err: ErrInvalidTopic},
				{agg: "a\nb", err: ErrInvalidTopic},
				{agg: "*", err: ErrInvalidTopic},
				{agg: "{event_type}", err: ErrInvalidTopic},
				{agg: strings.Repeat("x", 248), err: ErrInvalidTopic}, // 250 characters with "t."
				{agg: strings.Repeat("x", 247), topic: "t." + strings.Repeat("x", 247)},
				{agg: "", topic: "t."}, // an empty aggregate_type still renders a valid name
				{agg: "c", topic: "t.c", err: ErrTopicLimit},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := ParseTemplate(tt.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			allow, err := ParseAllowlist(tt.allow)
			if err != nil {
				t.Fatal(err)
			}
			r, err := NewRouter(tmpl, tt.max, allow, tt.dlq)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tt.routes {
				topic, err := r.Route(w.agg, w.ev)
				if topic != w.topic || !errors.Is(err, w.err) || (err == nil) != (w.err == nil) {
					t.Errorf("route %d (%q, %q) = %q, %v; want %q, %v", i, w.agg, w.ev, topic, err, w.topic, w.err)
				}
			}
			if r.Topics() > tt.max {
				t.Errorf("Topics() = %d, over the limit %d", r.Topics(), tt.max)
			}
		})
	}
}

// The refusals say which topic, which limit and which key to change.
func TestRouterErrorsNameTheKey(t *testing.T) {
	tmpl, _ := ParseTemplate("t.{aggregate_type}")
	allow, _ := ParseAllowlist([]string{"t.a", "t.b"})
	r, err := NewRouter(tmpl, 1, allow, "t.dlq")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Route("a", ""); err != nil {
		t.Fatal(err)
	}
	_, err = r.Route("b", "")
	for _, want := range []string{`"t.b"`, "kafka.max_topics", "limit of 1", "OUTBOX_RELAY_KAFKA_MAX_TOPICS"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("limit error %v does not contain %s", err, want)
		}
	}
	_, err = r.Route("c", "")
	for _, want := range []string{`"t.c"`, "kafka.topic_allowlist", "t.*"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("allowlist error %v does not contain %s", err, want)
		}
	}
}

// A router never holds more than max topics, whatever a writer sends.
func TestRouterBoundedUnderManyTopics(t *testing.T) {
	tmpl, _ := ParseTemplate("{aggregate_type}.{event_type}")
	r, err := NewRouter(tmpl, 20, Allowlist{}, "outbox.dlq")
	if err != nil {
		t.Fatal(err)
	}
	var ok, limited int
	for i := range 5000 {
		_, err := r.Route("agg"+strconv.Itoa(i), "e")
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrTopicLimit):
			limited++
		default:
			t.Fatalf("route %d: %v", i, err)
		}
	}
	if ok != 20 || limited != 4980 || r.Topics() != 20 || len(r.admitted) != 20 {
		t.Errorf("routed %d, limited %d, holding %d topics; want 20, 4980, 20", ok, limited, r.Topics())
	}
}

func TestNewRouterLimitRange(t *testing.T) {
	tmpl, _ := ParseTemplate("t")
	for _, n := range []int{0, -1, MaxMaxTopics + 1} {
		if _, err := NewRouter(tmpl, n, Allowlist{}, "dlq"); err == nil || !strings.Contains(err.Error(), "kafka.max_topics") {
			t.Errorf("NewRouter(max %d) = %v, want an error naming kafka.max_topics", n, err)
		}
	}
	for _, n := range []int{1, MaxMaxTopics} {
		if _, err := NewRouter(tmpl, n, Allowlist{}, "dlq"); err != nil {
			t.Errorf("NewRouter(max %d): %v", n, err)
		}
	}
}

func TestParseAllowlist(t *testing.T) {
	tests := []struct {
		entries []string
		bad     string // substring of the error; "" = valid
	}{
		{nil, ""},
		{[]string{"orders", "pay.*", "a_b-c.*"}, ""},
		{[]string{""}, "empty entry"},
		{[]string{"orders", ""}, "empty entry"},
		{[]string{"*"}, "leave the allowlist empty"},
		{[]string{"or*ders"}, "may only end"},
		{[]string{"orders**"}, "may only end"},
		{[]string{"*.orders"}, "may only end"},
		{[]string{"bad name"}, "character"},
		{[]string{"bad/*"}, "character"},
		{[]string{".."}, "not a valid"},
		{[]string{strings.Repeat("x", 250)}, "longer than 249"},
		{[]string{strings.Repeat("x", 249) + "*"}, "longer than 249"}, // no valid name starts with it
	}
	for _, tt := range tests {
		_, err := ParseAllowlist(tt.entries)
		if tt.bad == "" && err != nil {
			t.Errorf("ParseAllowlist(%q): %v", tt.entries, err)
		}
		if tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)) {
			t.Errorf("ParseAllowlist(%q) = %v, want an error containing %q", tt.entries, err, tt.bad)
		}
	}
}

func TestAutoCreateTopicsIsOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Brokers = []string{"k:9092"}
		cfg.AutoCreateTopics = on
		sc, err := saramaConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if sc.Metadata.AllowAutoTopicCreation != on {
			t.Errorf("kafka.auto_create_topics %v: sarama AllowAutoTopicCreation = %v", on, sc.Metadata.AllowAutoTopicCreation)
		}
	}
	if DefaultConfig().AutoCreateTopics {
		t.Error("kafka.auto_create_topics defaults to true; it must be opt-in")
	}
}

// TestRouteAdmittedTopicAllocatesNothing: routing to a topic admitted
// before builds no string (it built one per event), and gives the same
// topic as the first time; a refused topic stays refused.
func TestRouteAdmittedTopicAllocatesNothing(t *testing.T) {
	for _, tc := range []struct{ tmpl, aggType, eventType, want string }{
		{"outbox.{aggregate_type}", "order", "created", "outbox.order"},
		{"{aggregate_type}.{event_type}.v1", "order", "created", "order.created.v1"},
		{"fixed.topic", "order", "created", "fixed.topic"},
		{"{schema}x.{aggregate_type}", "order", "", "x.order"},
	} {
		tmpl, err := ParseTemplate(tc.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewRouter(tmpl, 2, Allowlist{}, "t.dlq")
		if err != nil {
			t.Fatal(err)
		}
		if got, err := r.Route(tc.aggType, tc.eventType); got != tc.want || err != nil {
			t.Fatalf("%s: Route = %q, %v; want %q", tc.tmpl, got, err, tc.want)
		}
		var got string
		allocs := testing.AllocsPerRun(100, func() { got, err = r.Route(tc.aggType, tc.eventType) })
		if got != tc.want || err != nil || allocs != 0 {
			t.Errorf("%s: Route again = %q, %v with %.0f allocations; want %q with none", tc.tmpl, got, err, allocs, tc.want)
		}
	}
	tmpl, _ := ParseTemplate("outbox.{aggregate_type}")
	r, _ := NewRouter(tmpl, 1, Allowlist{}, "t.dlq")
	r.Route("a", "")
	for i := 0; i < 2; i++ {
		if got, err := r.Route("b", ""); got != "outbox.b" || !errors.Is(err, ErrTopicLimit) {
			t.Errorf("Route over the limit = %q, %v; want outbox.b refused with ErrTopicLimit", got, err)
		}
	}
}
