package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestEncodeValidation(t *testing.T) {
	ok := Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: json.RawMessage(`{"id":"o-1"}`)}
	with := func(f func(e *Event)) Event { e := ok; f(&e); return e }
	tests := []struct {
		name    string
		events  []Event
		wantErr string // substring; "" = no error
	}{
		{"valid", []Event{ok}, ""},
		{"no events", nil, ""},
		{"empty aggregate type", []Event{ok, with(func(e *Event) { e.AggregateType = "" })}, "event 1: AggregateType is empty"},
		{"empty aggregate id", []Event{with(func(e *Event) { e.AggregateID = "" })}, "event 0: AggregateID is empty"},
		{"empty event type", []Event{with(func(e *Event) { e.EventType = "" })}, "event 0: EventType is empty"},
		{"invalid raw JSON", []Event{ok, ok, with(func(e *Event) { e.Payload = json.RawMessage(`{"a":`) })}, "event 2: Payload is not valid JSON"},
		{"invalid byte JSON", []Event{with(func(e *Event) { e.Payload = []byte(`nope`) })}, "event 0: Payload is not valid JSON"},
		{"nil payload", []Event{with(func(e *Event) { e.Payload = nil })}, "event 0: Payload is nil"},
		{"unmarshallable payload", []Event{with(func(e *Event) { e.Payload = map[string]any{"c": make(chan int)} })}, "event 0: Payload cannot be marshalled to JSON"},
		{"struct payload", []Event{with(func(e *Event) { e.Payload = struct{ ID string }{"o-1"} })}, ""},
		{"reserved header", []Event{ok, with(func(e *Event) { e.Headers = map[string]string{"event_id": "7"} })}, `event 1: Headers: header name "event_id" is reserved`},
		{"reserved header any case", []Event{with(func(e *Event) { e.Headers = map[string]string{"Aggregate_ID": "x"} })}, `event 0: Headers: header name "Aggregate_ID" is reserved`},
		{"reserved dlq prefix", []Event{with(func(e *Event) { e.Headers = map[string]string{"dlq.reason": "x"} })}, `event 0: Headers: header name "dlq.reason" is reserved`},
		{"reserved outbox_id", []Event{with(func(e *Event) { e.Headers = map[string]string{"Outbox_ID": "1"} })}, `event 0: Headers: header name "Outbox_ID" is reserved`},
		{"reserved replay mark", []Event{with(func(e *Event) { e.Headers = map[string]string{"outbox_replayed_from": "dlq"} })}, `event 0: Headers: header name "outbox_replayed_from" is reserved`},
		{"empty header key", []Event{with(func(e *Event) { e.Headers = map[string]string{"": "x"} })}, `event 0: Headers: header name "" is empty`},
		{"schema_version twice", []Event{with(func(e *Event) { e.SchemaVersion = 2; e.Headers = map[string]string{"schema_version": "2"} })}, "event 0: both SchemaVersion and Headers"},
		{"negative schema version", []Event{with(func(e *Event) { e.SchemaVersion = -1 })}, "event 0: SchemaVersion is -1"},
		{"ordinary headers", []Event{with(func(e *Event) { e.Headers = map[string]string{"tenant_id": "acme", "x-event_id": "ok"} })}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := encode(context.Background(), tt.events)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("no error, want %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestEncodeHeaders(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const tp2 = "00-11111111111111111111111111111111-2222222222222222-01"
	base := Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: map[string]int{"n": 1}}
	withTP := WithTraceparent(context.Background(), tp)
	tests := []struct {
		name string
		ctx  context.Context
		ev   func(e *Event)
		hook func(context.Context) (string, string)
		want string // headers JSON, "" = NULL
	}{
		{"none", context.Background(), nil, nil, ""},
		{"schema version", context.Background(), func(e *Event) { e.SchemaVersion = 2 }, nil, `{"schema_version":"2"}`},
		{"traceparent from context", withTP, nil, nil, `{"traceparent":"` + tp + `"}`},
		{"tracestate too", WithTracestate(withTP, "congo=t61rcWkgMzE"), nil, nil, `{"traceparent":"` + tp + `","tracestate":"congo=t61rcWkgMzE"}`},
		{"tracestate alone is dropped", WithTracestate(context.Background(), "congo=t61rcWkgMzE"), nil, nil, ""},
		{"invalid traceparent dropped", WithTraceparent(context.Background(), "garbage"), nil, nil, ""},
		{"event header wins", withTP, func(e *Event) { e.Headers = map[string]string{"traceparent": tp2} }, nil, `{"traceparent":"` + tp2 + `"}`},
		{"hook", context.Background(), nil, func(context.Context) (string, string) { return tp, "a=b" }, `{"traceparent":"` + tp + `","tracestate":"a=b"}`},
		{"context beats hook", withTP, nil, func(context.Context) (string, string) { return tp2, "" }, `{"traceparent":"` + tp + `"}`},
		{"all", withTP, func(e *Event) { e.SchemaVersion = 1; e.Headers = map[string]string{"tenant_id": "acme"} }, nil,
			`{"schema_version":"1","tenant_id":"acme","traceparent":"` + tp + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := TraceparentFrom
			TraceparentFrom = tt.hook
			defer func() { TraceparentFrom = old }()
			e := base
			if tt.ev != nil {
				tt.ev(&e)
			}
			rows, err := encode(tt.ctx, []Event{e})
			if err != nil {
				t.Fatal(err)
			}
			if got := string(rows[0].headers); got != tt.want {
				t.Errorf("headers %s, want %s", got, tt.want)
			}
			if got := string(rows[0].payload); got != `{"n":1}` {
				t.Errorf("payload %s", got)
			}
		})
	}
}

func TestWriteRefusesWhatIsNotATransaction(t *testing.T) {
	ok := Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: json.RawMessage(`{}`)}
	for _, tx := range []any{nil, "tx", struct{}{}} {
		err := Write(context.Background(), tx, ok)
		if err == nil || !strings.Contains(err.Error(), "pgx.Tx or *sql.Tx") {
			t.Errorf("Write(%T): %v, want an error naming pgx.Tx or *sql.Tx", tx, err)
		}
	}
}

func TestNewWriterTable(t *testing.T) {
	for _, tt := range []struct{ in, want, err string }{
		{"", `"public"."outbox"`, ""},
		{"events.outbox", `"events"."outbox"`, ""},
		{"Out.Box", `"Out"."Box"`, ""},
		{`"bad"`, "", "quoted identifiers"},
		{"a.b.c", "", "more than one"},
	} {
		var opts []Option
		if tt.in != "" {
			opts = append(opts, WithTable(tt.in))
		}
		w, err := NewWriter(opts...)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("NewWriter(%q): %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || w.table.Quoted() != tt.want {
			t.Errorf("NewWriter(%q): %v %v, want %s", tt.in, w, err, tt.want)
		}
	}
}

func TestInsertChunksUnderParameterLimit(t *testing.T) {
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ n, stmts int }{{1, 1}, {9999, 1}, {10000, 1}, {10001, 2}, {25000, 3}} {
		rows := make([]row, tt.n)
		for i := range rows {
			rows[i] = row{"order", "o", "t", []byte(`{}`), nil}
		}
		stmts, total := 0, 0
		err := w.insert(rows, func(q string, args []any) error {
			stmts++
			total += len(args) / columnsPerRow
			if len(args) > 65535 {
				t.Errorf("n=%d: a statement with %d parameters; PostgreSQL allows 65535", tt.n, len(args))
			}
			if want := fmt.Sprintf("$%d::jsonb)", len(args)); !strings.HasSuffix(q, want) {
				t.Errorf("n=%d: statement ends %q, want %q", tt.n, q[max(0, len(q)-30):], want)
			}
			return nil
		})
		if err != nil || stmts != tt.stmts || total != tt.n {
			t.Errorf("n=%d: %d statements for %d rows (%v), want %d statements", tt.n, stmts, total, err, tt.stmts)
		}
	}
	if q := insertSQL(`"public"."outbox"`, 2); q != `INSERT INTO "public"."outbox" ("aggregate_type", "aggregate_id", "event_type", "payload", "headers") VALUES ($1,$2,$3,$4::jsonb,$5::jsonb),($6,$7,$8,$9::jsonb,$10::jsonb)` {
		t.Errorf("insertSQL: %s", q)
	}
}
