package cloudevents

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/outbox-relay/outbox-relay/sink"
)

// readSDK reads a record with the official CloudEvents Go SDK, as a
// consumer would, and validates the event.
func readSDK(t *testing.T, headers []sink.Header, value []byte) event.Event {
	t.Helper()
	cm := &sarama.ConsumerMessage{Topic: "outbox.event.order", Partition: 1, Offset: 7, Value: value}
	for _, h := range headers {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	e, err := binding.ToEvent(context.Background(), kafka_sarama.NewMessageFromConsumerMessage(cm))
	if err != nil {
		t.Fatalf("SDK read: %v", err)
	}
	if err := e.Validate(); err != nil {
		t.Fatalf("SDK validate: %v", err)
	}
	return *e
}

// sdkExtensions drops the extensions the SDK's Kafka reader adds itself.
func sdkExtensions(e event.Event) map[string]any {
	x := map[string]any{}
	for k, v := range e.Extensions() {
		if k != "kafkaoffset" && k != "kafkapartition" && k != "kafkatopic" {
			x[k] = v
		}
	}
	return x
}

func compareSDK(t *testing.T, e event.Event, a Attributes, data []byte, binary bool) {
	t.Helper()
	if e.SpecVersion() != SpecVersion || e.ID() != a.ID || e.Source() != a.Source || e.Type() != a.Type || e.Subject() != a.Subject ||
		e.DataSchema() != a.DataSchema {
		t.Errorf("SDK read\n%s\nwant %+v\n%q %q %q %q", e, a, e.ID(), e.Type(), e.Subject(), e.DataSchema())
	}
	if !e.Time().Equal(a.Time) {
		t.Errorf("time %v, want %v", e.Time(), a.Time)
	}
	if got := e.DataContentType(); got != a.DataContentType {
		t.Errorf("datacontenttype %q, want %q", got, a.DataContentType)
	}
	got := e.Data()
	if !binary && len(got) > 0 && inlineJSON(a.DataContentType) && json.Valid(data) {
		// The SDK hands inline JSON data as the member's raw text.
		var x, y any
		if json.Unmarshal(got, &x) != nil || json.Unmarshal(data, &y) != nil || !jsonEqual(x, y) {
			t.Errorf("data %q, want %q", got, data)
		}
	} else if !bytes.Equal(got, data) {
		t.Errorf("data %q, want %q", got, data)
	}
	if x := sdkExtensions(e); len(x) != 0 {
		t.Errorf("extensions %v, want none", x)
	}
}

func jsonEqual(x, y any) bool {
	a, _ := json.Marshal(x)
	b, _ := json.Marshal(y)
	return bytes.Equal(a, b)
}

var commit = time.Date(2026, 12, 5, 11, 30, 0, 123456789, time.FixedZone("CET", 3600))

var hostile = []struct {
	name string
	a    Attributes
	data []byte
}{
	{"plain", Attributes{ID: "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b", Source: "/outbox-relay/public/outbox", Type: "order.created",
		Subject: "ord_1", DataContentType: "application/json", Time: commit}, []byte(`{"id":1,"total":12.5}`)},
	{"minimal", Attributes{ID: "1", Source: "/s", Type: "t"}, nil},
	{"quotes and backslashes", Attributes{ID: `a"b\c`, Source: "/o'r(d)e*r!$&+,;=@", Type: `t"\"\\`, Subject: `{"k":"v\"}`,
		DataContentType: "application/json", Time: commit}, []byte(`"a \"string\" \\ value"`)},
	{"unicode, U+2028 and emoji", Attributes{ID: "é\u2028\u2029😀", Source: "/caf%C3%A9", Type: "ordre.\u2029créé", Subject: "ключ",
		DataContentType: "application/vnd.order+json; charset=utf-8", Time: commit}, []byte(`{"name":"ключ\u2028"}`)},
	{"non-JSON data with a JSON content type", Attributes{ID: "2", Source: "/s", Type: "t", DataContentType: "application/json", Time: commit},
		[]byte("not json {\x00\xff")},
	{"binary data", Attributes{ID: "3", Source: "urn:outbox:3", Type: "t", DataContentType: "application/octet-stream",
		DataSchema: "https://registry.example/schemas/ids/7", Time: time.Unix(0, 0)}, []byte{0, 0, 0, 0, 7, 0xff, '"', '\\'}},
	{"text data", Attributes{ID: "4", Source: "https://example.com/x?y=1#f", Type: "t", DataContentType: "text/plain; charset=us-ascii"},
		[]byte("hello \"world\"\n")},
	{"huge strings", Attributes{ID: strings.Repeat("i", 1<<16), Source: "/" + strings.Repeat("s", 1<<16), Type: strings.Repeat(`"\`, 1<<15),
		Subject: strings.Repeat("é", 1<<15), DataContentType: "application/json", Time: commit}, []byte(`[` + strings.Repeat(`"x",`, 1<<16) + `1]`)},
	{"JSON data without a content type", Attributes{ID: "5", Source: "/s", Type: "t"}, []byte(`{"a":1}`)},
}

func TestAttributesReadBySDK(t *testing.T) {
	for _, tt := range hostile {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.a.Check(); err != nil {
				t.Fatalf("Check: %v", err)
			}
			t.Run("binary", func(t *testing.T) {
				h := AppendHeaders([]sink.Header{{Key: []byte("event_id"), Value: []byte(tt.a.ID)}}, tt.a)
				for _, x := range h {
					if strings.HasPrefix(string(x.Key), HeaderPrefix) || string(x.Key) == HeaderContentType {
						if strings.Count(headerKeys(h), "|"+string(x.Key)+"|") != 1 {
							t.Errorf("header %s written more than once", x.Key)
						}
					}
				}
				if tt.a.Time.IsZero() != !strings.Contains(headerKeys(h), "|ce_time|") {
					t.Errorf("ce_time presence wrong: %s", headerKeys(h))
				}
				compareSDK(t, readSDK(t, h, tt.data), tt.a, tt.data, true)
			})
			t.Run("structured", func(t *testing.T) {
				v, err := StructuredValue([]byte("junk"), tt.a, tt.data)
				if err != nil {
					t.Fatal(err)
				}
				if string(v[:4]) != "junk" {
					t.Fatal("dst not kept")
				}
				v = v[4:]
				if !json.Valid(v) {
					t.Fatalf("not JSON: %s", clip(string(v)))
				}
				var m map[string]json.RawMessage
				if err := json.Unmarshal(v, &m); err != nil {
					t.Fatal(err)
				}
				_, inline := m["data"]
				_, b64 := m["data_base64"]
				wantInline := len(tt.data) > 0 && inlineJSON(tt.a.DataContentType) && json.Valid(tt.data)
				if inline != wantInline || b64 != (len(tt.data) > 0 && !wantInline) {
					t.Errorf("data inline %v base64 %v, want inline %v", inline, b64, wantInline)
				}
				e := readSDK(t, []sink.Header{StructuredHeader()}, v)
				if b64 && len(tt.data) > 0 {
					// Its own reading must agree with the SDK's.
					var s string
					_ = json.Unmarshal(m["data_base64"], &s)
					if d, _ := base64.StdEncoding.DecodeString(s); !bytes.Equal(d, tt.data) {
						t.Errorf("data_base64 decodes to %q", d)
					}
				}
				compareSDK(t, e, tt.a, tt.data, false)
			})
		})
	}
}

func headerKeys(h []sink.Header) string {
	var b strings.Builder
	b.WriteString("|")
	for _, x := range h {
		b.WriteString(string(x.Key) + "|")
	}
	return b.String()
}

// A time is written in UTC, RFC 3339 with only the fraction it has.
func TestTimeFormat(t *testing.T) {
	for _, tt := range []struct {
		t    time.Time
		want string
	}{
		{commit, "2026-12-05T10:30:00.123456789Z"},
		{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "2026-01-02T03:04:05Z"},
		{time.Date(2026, 1, 2, 3, 4, 5, 500000000, time.FixedZone("", -7*3600)), "2026-01-02T10:04:05.5Z"},
	} {
		h := AppendHeaders(nil, Attributes{ID: "1", Source: "/s", Type: "t", Time: tt.t})
		for _, x := range h {
			if string(x.Key) == HeaderTime && string(x.Value) != tt.want {
				t.Errorf("%v: ce_time %s, want %s", tt.t, x.Value, tt.want)
			}
		}
		v, _ := StructuredValue(nil, Attributes{ID: "1", Source: "/s", Type: "t", Time: tt.t}, nil)
		if !bytes.Contains(v, []byte(`"time":"`+tt.want+`"`)) {
			t.Errorf("%v: %s", tt.t, v)
		}
	}
}

func TestAppendHeadersExact(t *testing.T) {
	a := Attributes{ID: "id", Source: "/src", Type: "typ", Subject: "sub", DataContentType: "application/json", DataSchema: "https://r/s/1",
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	h := AppendHeaders(nil, a)
	var got []string
	for _, x := range h {
		got = append(got, string(x.Key)+"="+string(x.Value))
	}
	want := "ce_specversion=1.0 ce_id=id ce_source=/src ce_type=typ ce_time=2026-01-02T03:04:05Z ce_subject=sub ce_dataschema=https://r/s/1 content-type=application/json"
	if strings.Join(got, " ") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, " "), want)
	}
	// Appending to the returned values must not overwrite a neighbour.
	h[1].Value = append(h[1].Value, 'X')
	if string(h[2].Value) != "/src" {
		t.Errorf("values share capacity: %s", h[2].Value)
	}
	h = AppendHeaders(nil, Attributes{ID: "i", Source: "/s", Type: "t"})
	if len(h) != 4 {
		t.Errorf("optional headers written when unset: %s", headerKeys(h))
	}
}

func TestStructuredValueExact(t *testing.T) {
	a := Attributes{ID: "i\"d", Source: "/src", Type: "t\x01\n", Subject: "s", DataContentType: "application/json",
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	v, err := StructuredValue(nil, a, []byte(`{"a":1}`))
	want := `{"specversion":"1.0","id":"i\"d","source":"/src","type":"t\u0001\n","subject":"s","time":"2026-01-02T03:04:05Z","datacontenttype":"application/json","data":{"a":1}}`
	if err != nil || string(v) != want {
		t.Errorf("got  %s\nwant %s (%v)", v, want, err)
	}
	if _, err := StructuredValue(nil, Attributes{ID: "\xff", Source: "/s", Type: "t"}, nil); err == nil {
		t.Error("invalid UTF-8 accepted")
	}
}

// The escaper agrees with encoding/json on every string encoding/json
// reads back to the same string.
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "a", `"\`, "\x00\x1f\x7f", "é\u2028", "\xff", "a\xc3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, ok := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, b, err)
		}
		if ok && back != s {
			t.Fatalf("%q -> %s -> %q", s, b, back)
		}
		if ok != utf8Valid(s) {
			t.Fatalf("%q: ok %v", s, ok)
		}
	})
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\x00x") == s }

func TestCheck(t *testing.T) {
	good := Attributes{ID: "1", Source: "/outbox-relay/public/outbox", Type: "order.created"}
	tests := []struct {
		name string
		f    func(a *Attributes)
		want string // "" = accepted
	}{
		{"good", func(a *Attributes) {}, ""},
		{"absolute source", func(a *Attributes) { a.Source = "https://orders.example.com/outbox" }, ""},
		{"urn source", func(a *Attributes) { a.Source = "urn:event:from:outbox" }, ""},
		{"percent-encoded", func(a *Attributes) { a.Source = "/caf%c3%A9" }, ""},
		{"empty id", func(a *Attributes) { a.ID = "" }, "cloudevents: id is empty"},
		{"blank id", func(a *Attributes) { a.ID = " \t " }, "id \" \\t \" is only white space"},
		{"empty type", func(a *Attributes) { a.Type = "" }, "cloudevents: type is empty: map an event type column or set cloudevents.type"},
		{"empty source", func(a *Attributes) { a.Source = "" }, "cloudevents: source is empty"},
		{"space in source", func(a *Attributes) { a.Source = "/a b" }, `source "/a b" is not a URI-reference: byte 2 (' ') must be percent-encoded`},
		{"bad percent", func(a *Attributes) { a.Source = "/a%2" }, "not followed by two hex digits"},
		{"unicode source", func(a *Attributes) { a.Source = "/café" }, "must be percent-encoded"},
		{"colon in first segment", func(a *Attributes) { a.Source = "1a:b" }, "is not a scheme"},
		{"two fragments", func(a *Attributes) { a.Source = "/a#b#c" }, "more than one '#'"},
		{"ip literal", func(a *Attributes) { a.Source = "http://[::1]/" }, "must be percent-encoded"},
		{"control in type", func(a *Attributes) { a.Type = "a\nb" }, "type \"a\\nb\" holds control character U+000A at byte 1"},
		{"C1 control", func(a *Attributes) { a.Type = "a\u0085b" }, "U+0085"},
		{"DEL", func(a *Attributes) { a.ID = "a\x7f" }, "U+007F"},
		{"invalid utf8 id", func(a *Attributes) { a.ID = "a\xffb" }, "id \"a\\xffb\" is not valid UTF-8 (byte 1)"},
		{"invalid utf8 subject", func(a *Attributes) { a.Subject = "\xc3" }, "subject"},
		{"blank subject", func(a *Attributes) { a.Subject = " " }, "subject \" \" is only white space"},
		{"trailing space", func(a *Attributes) { a.Type = "order.created " }, "starts or ends with white space, which readers trim"},
		{"leading U+2029", func(a *Attributes) { a.Subject = "\u2029x" }, "starts or ends with white space"},
		{"inner space", func(a *Attributes) { a.Subject = "a b\u2028c" }, ""},
		{"relative dataschema", func(a *Attributes) { a.DataSchema = "/schemas/1" }, "dataschema \"/schemas/1\" is not an absolute URI: it has no scheme"},
		{"dataschema", func(a *Attributes) { a.DataSchema = "https://r.example/schemas/ids/1" }, ""},
		{"content type params", func(a *Attributes) { a.DataContentType = `application/json; charset="utf-8"` }, ""},
		{"bad content type", func(a *Attributes) { a.DataContentType = "json" }, `datacontenttype "json" is not a media type`},
		{"bad content type param", func(a *Attributes) { a.DataContentType = "application/json; x" }, `parameter "x"`},
		{"cloudevents content type", func(a *Attributes) { a.DataContentType = "application/cloudevents+json" }, "is a CloudEvents format"},
		{"year 10000", func(a *Attributes) { a.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "outside RFC 3339"},
		{"huge id is clipped", func(a *Attributes) { a.ID = strings.Repeat("x", 1<<20) + "\n" }, "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := good
			tt.f(&a)
			err := a.Check()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				// Accepted means the SDK accepts it, in both modes.
				readSDK(t, AppendHeaders(nil, a), []byte("x"))
				v, err := StructuredValue(nil, a, []byte("x"))
				if err != nil {
					t.Fatal(err)
				}
				readSDK(t, []sink.Header{StructuredHeader()}, v)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d bytes: a dead letter carries it", len(err.Error()))
			}
		})
	}
}

func TestCheckHeader(t *testing.T) {
	for _, tt := range []struct {
		key  string
		want string
	}{
		{"event_id", ""}, {"traceparent", ""}, {"schema_version", ""}, {"ce_traceparent", ""}, {"ce_a", ""},
		{"ce_" + strings.Repeat("a", 20), ""}, {"ce_x9", ""}, {"Content-Type2", ""}, {"ce", ""},
		{"ce_specversion", "the relay sets"}, {"ce_id", "the relay sets"}, {"CE_ID", "the relay sets"}, {"ce_Source", "the relay sets"},
		{"ce_type", "the relay sets"}, {"ce_time", "the relay sets"}, {"ce_subject", "the relay sets"}, {"ce_dataschema", "the relay sets"},
		{"ce_datacontenttype", "the relay sets"}, {"content-type", "the relay sets"}, {"Content-Type", "the relay sets"}, {"ce_data", "the relay sets"},
		{"ce_", "1 to 20 characters, not 0"}, {"ce_" + strings.Repeat("a", 21), "not 21"}, {"ce_Trace", "byte 0 is 'T'"},
		{"ce_trace-parent", "byte 5 is '-'"}, {"ce_trace_parent", "byte 5 is '_'"}, {"Ce_foo", "starts with lower-case ce_"},
		{"ce_é", "lower-case letters"},
	} {
		err := CheckHeader(tt.key)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckHeader(%q) = %v, want %q", tt.key, err, tt.want)
		}
	}
}

// An extension header CheckHeader lets through is read by the SDK as that
// extension, beside the attributes.
func TestExtensionHeaderReadBySDK(t *testing.T) {
	a := Attributes{ID: "1", Source: "/s", Type: "t", DataContentType: "application/json"}
	h := AppendHeaders([]sink.Header{{Key: []byte("ce_traceparent"), Value: []byte("00-abc-01")}, {Key: []byte("event_id"), Value: []byte("1")}}, a)
	for _, x := range h[:2] {
		if err := CheckHeader(string(x.Key)); err != nil {
			t.Fatal(err)
		}
	}
	e := readSDK(t, h, []byte(`{}`))
	if x := sdkExtensions(e); len(x) != 1 || x["traceparent"] != "00-abc-01" {
		t.Errorf("extensions %v", x)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate("cloudevents"); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		name string
		c    Config
		want []string
	}{
		{"structured", Config{Mode: Structured, Source: "https://orders.example.com/{topic}", Type: "com.example.{aggregate_type}.{event_type}"}, nil},
		{"urn", Config{Mode: Binary, Source: "urn:outbox:{table}", Type: "t"}, nil},
		{"empty", Config{}, []string{`cloudevents.mode: "" is not a content mode`, "cloudevents.source: empty", "cloudevents.type: empty"}},
		{"mode", Config{Mode: "Binary", Source: "/s", Type: "t"}, []string{`cloudevents.mode: "Binary"`}},
		{"unknown placeholder", Config{Mode: Binary, Source: "/{tabel}", Type: "{type}"},
			[]string{"cloudevents.source: unknown placeholder {tabel}: use {schema} {table}", "cloudevents.type: unknown placeholder {type}"}},
		{"braces", Config{Mode: Binary, Source: "/{table", Type: "a}"}, []string{"cloudevents.source: a '{' without its '}'", "cloudevents.type: a '}' without its '{'"}},
		{"not a URI", Config{Mode: Binary, Source: "/outbox relay/{table}", Type: "t"}, []string{`cloudevents.source: "/outbox relay/{table}" does not render a URI-reference`}},
		{"control in type", Config{Mode: Binary, Source: "/s", Type: "a\tb{event_type}"}, []string{"cloudevents.type: ", "control character"}},
		{"blank", Config{Mode: Binary, Source: " ", Type: "t"}, []string{"cloudevents.source:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Validate("cloudevents")
			if len(tt.want) == 0 && err != nil {
				t.Fatalf("refused: %v", err)
			}
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want it to contain %q", err, w)
				}
			}
			if _, cerr := tt.c.Compile(); (cerr == nil) != (err == nil) {
				t.Errorf("Compile: %v, Validate: %v", cerr, err)
			}
		})
	}
}

func TestRender(t *testing.T) {
	tests := []struct {
		src, typ                                     string
		schema, table, aggregateType, eventType, top string
		wantSrc, wantType                            string
	}{
		{DefaultSource, DefaultType, "public", "outbox", "order", "order.created", "outbox.event.order", "/outbox-relay/public/outbox", "order.created"},
		{"https://x.example/{schema}/{table}?t={topic}#{aggregate_type}", "com.example.{aggregate_type}.{event_type}", "My Schema", "a/b", "ä#?", "ev", "t:1",
			"https://x.example/My%20Schema/a%2Fb?t=t%3A1#%C3%A4%23%3F", "com.example.ä#?.ev"},
		{"{table}", "{event_type}", "", "1:x", "", "", "", "1%3Ax", ""},
		{"{aggregate_type}", "static", "", "", "", "", "", "", "static"},
		{"/fixed", "{topic}-{topic}", "", "", "", "", "tp", "/fixed", "tp-tp"},
		{"/{schema}", "t", "", "", "", "", "", "/", "t"},
		{"/{table}", "t", "", "\x00\xff\"%", "", "", "", "/%00%FF%22%25", "t"},
	}
	for _, tt := range tests {
		ts, err := Config{Mode: Binary, Source: tt.src, Type: tt.typ}.Compile()
		if err != nil {
			t.Fatalf("%s: %v", tt.src, err)
		}
		s := ts.Source.Render(tt.schema, tt.table, tt.aggregateType, tt.eventType, tt.top)
		ty := ts.Type.Render(tt.schema, tt.table, tt.aggregateType, tt.eventType, tt.top)
		if s != tt.wantSrc || ty != tt.wantType {
			t.Errorf("%s / %s: %q / %q, want %q / %q", tt.src, tt.typ, s, ty, tt.wantSrc, tt.wantType)
		}
		if s != "" {
			if err := checkURIRef(s); err != nil {
				t.Errorf("rendered source %q: %v", s, err)
			}
		}
	}
}

// Any value renders a source Check accepts (a non-empty template part
// given), and the SDK reads it back unchanged.
func FuzzRenderedSourceIsAURIReference(f *testing.F) {
	f.Add("public", "outbox", "order", "a b:c/d?e#f%g\x00\xff")
	f.Fuzz(func(t *testing.T, schema, table, aggregateType, topic string) {
		ts, err := Config{Mode: Binary, Source: "{schema}:{table}/{aggregate_type}?{topic}", Type: "t"}.Compile()
		if err == nil {
			t.Fatal("a template whose rendering may start with a non-scheme colon was accepted")
		}
		ts, err = Config{Mode: Binary, Source: "/{schema}:{table}/{aggregate_type}?{topic}#{topic}", Type: "t"}.Compile()
		if err != nil {
			t.Fatal(err)
		}
		s := ts.Source.Render(schema, table, aggregateType, "", topic)
		if err := (Attributes{ID: "1", Source: s, Type: "t"}).Check(); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
	})
}

func TestRenderAllocs(t *testing.T) {
	ts, _ := DefaultConfig().Compile()
	if n := testing.AllocsPerRun(100, func() { _ = ts.Source.Render("public", "outbox", "order", "order.created", "outbox.event.order") }); n > 1 {
		t.Errorf("source Render: %v allocs, want at most 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = ts.Type.Render("public", "outbox", "order", "order.created", "outbox.event.order") }); n != 0 {
		t.Errorf("type Render of {event_type}: %v allocs, want 0", n)
	}
	a := Attributes{ID: "1", Source: "/outbox-relay/public/outbox", Type: "t", Subject: "s", Time: commit, DataContentType: "application/json"}
	if n := testing.AllocsPerRun(100, func() { _ = a.Check() }); n != 0 {
		t.Errorf("Check of a good event: %v allocs, want 0", n)
	}
}

var benchAttrs = Attributes{ID: "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b", Source: "/outbox-relay/public/outbox", Type: "order.created",
	Subject: "ord_12345", DataContentType: "application/json", Time: commit}

// ~200 bytes, like a small order event.
var benchPayload = []byte(`{"order_id":"ord_12345","customer_id":"cus_67890","currency":"EUR","total_cents":12550,"lines":[{"sku":"SKU-1","qty":2,"price_cents":5000},{"sku":"SKU-2","qty":1,"price_cents":2550}]}`)

func BenchmarkAppendHeaders(b *testing.B) {
	h := make([]sink.Header, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		h = AppendHeaders(h[:0], benchAttrs)
	}
}

func BenchmarkStructuredValue(b *testing.B) {
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchPayload)))
	for b.Loop() {
		var err error
		if dst, err = StructuredValue(dst[:0], benchAttrs, benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := benchAttrs.Check(); err != nil {
			b.Fatal(err)
		}
	}
}

// Whatever Check accepts, the SDK reads back unchanged in both modes.
func FuzzCheckedAttributesReadBySDK(f *testing.F) {
	f.Add("1", "/s", "t", "sub", "application/json", "", []byte(`{"a":1}`))
	f.Add("é\u2028", "urn:x:y", `"\`, "", "text/plain", "https://r/s", []byte("\x00\xff"))
	f.Fuzz(func(t *testing.T, id, source, typ, subject, ct, schema string, data []byte) {
		a := Attributes{ID: id, Source: source, Type: typ, Subject: subject, DataContentType: ct, DataSchema: schema, Time: commit}
		if a.Check() != nil {
			return
		}
		compareSDK(t, readSDK(t, AppendHeaders(nil, a), data), a, data, true)
		v, err := StructuredValue(nil, a, data)
		if err != nil {
			t.Fatal(err)
		}
		compareSDK(t, readSDK(t, []sink.Header{StructuredHeader()}, v), a, data, false)
	})
}
