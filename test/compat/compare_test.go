package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func rec(topic string, p int32, off int64, id, key, value string, extra ...Header) Rec {
	r := Rec{Topic: topic, Partition: p, Offset: off, Key: []byte(key), Value: []byte(value)}
	r.Headers = append(extra, Header{Name: "id", Value: []byte(id)})
	return r
}

func TestDiffDumps(t *testing.T) {
	base := []Rec{
		rec("outbox.event.order", 0, 0, "1", "k1", `{"a": 1}`),
		rec("outbox.event.order", 0, 1, "2", "k1", `{"a": 2}`),
		rec("outbox.event.order", 1, 0, "3", "k2", `"x"`),
	}
	clone := func(f func([]Rec) []Rec) []Rec {
		c := make([]Rec, len(base))
		for i, r := range base {
			r.Key = slices.Clone(r.Key)
			r.Value = slices.Clone(r.Value)
			r.Headers = slices.Clone(r.Headers)
			c[i] = r
		}
		return f(c)
	}
	ctx := Header{Name: "__debezium.context.runId", Value: []byte("r")}
	tests := []struct {
		name string
		a, b []Rec
		want []string // classes, in order of discovery
	}{
		{"identical", base, clone(func(r []Rec) []Rec { return r }), nil},
		{"value bytes", base, clone(func(r []Rec) []Rec { r[0].Value = []byte(`{"a":1}`); return r }), []string{"value"}},
		{"tombstone vs empty", base, clone(func(r []Rec) []Rec { r[2].Value = nil; return r }), []string{"value_null"}},
		{"empty vs null key", base, clone(func(r []Rec) []Rec { r[2].Key = nil; return r }), []string{"key_null"}},
		{"key", base, clone(func(r []Rec) []Rec { r[2].Key = []byte("K2"); return r }), []string{"key"}},
		{"partition", base, clone(func(r []Rec) []Rec { r[2].Partition = 2; return r }), []string{"partition"}},
		{"topic", base, clone(func(r []Rec) []Rec { r[2].Topic = "other"; return r }), []string{"topic"}},
		{"order in partition and key", base, clone(func(r []Rec) []Rec {
			r[0], r[1] = r[1], r[0]
			r[0].Offset, r[1].Offset = 0, 1
			return r
		}), []string{"order_within_partition", "order_within_key"}},
		{"offset gap", base, clone(func(r []Rec) []Rec { r[1].Offset = 5; return r }), []string{"offset"}},
		{"offset shifted by a missing record", base, clone(func(r []Rec) []Rec {
			r[1].Offset = 0
			return r[1:]
		}), []string{"missing_in_relay"}},
		{"missing", base, clone(func(r []Rec) []Rec { return r[:2] }), []string{"missing_in_relay"}},
		{"extra", base, clone(func(r []Rec) []Rec { return append(r, rec("outbox.dlq", 0, 0, "9", "k", "v")) }), []string{"extra_in_relay"}},
		{"dead-lettered, empty key", clone(func(r []Rec) []Rec { r[2].Key = []byte{}; return r }), clone(func(r []Rec) []Rec {
			r[2] = Rec{Topic: "outbox.dlq", Key: []byte{}, Headers: []Header{{Name: "dlq.reason", Value: []byte("bad_row")}, {Name: "dlq.event_id", Value: []byte("3")}}}
			return r
		}), []string{"dead_lettered_in_relay:bad_row:empty_key"}},
		{"dead-lettered", base, clone(func(r []Rec) []Rec {
			r[2] = Rec{Topic: "outbox.dlq", Headers: []Header{{Name: "dlq.reason", Value: []byte("message_too_large")}, {Name: "dlq.event_id", Value: []byte("3")}}}
			return r
		}), []string{"dead_lettered_in_relay:message_too_large"}},
		{"dead letter with a wrong dlq.event_id", base, clone(func(r []Rec) []Rec {
			r[2] = Rec{Topic: "outbox.dlq", Headers: []Header{{Name: "id", Value: []byte("3")}, {Name: "dlq.reason", Value: []byte("bad_row")}, {Name: "dlq.event_id", Value: []byte("0")}}}
			return r
		}), []string{"dead_letter_event_id_wrong", "dead_lettered_in_relay:bad_row"}},
		{"dead letter of nothing", base, clone(func(r []Rec) []Rec {
			return append(r, Rec{Topic: "outbox.dlq", Headers: []Header{{Name: "dlq.reason", Value: []byte("bad_row")}, {Name: "dlq.event_id", Value: []byte("77")}}})
		}), []string{"extra_in_relay:dead_letter"}},
		{"duplicate", base, clone(func(r []Rec) []Rec { return append(r, r[0]) }), []string{"duplicate_in_relay"}},
		{"header missing", clone(func(r []Rec) []Rec { r[0].Headers = append([]Header{ctx}, r[0].Headers...); return r }), base,
			[]string{"header_missing_in_relay:__debezium.context.runId"}},
		// the id header is what matches records: another id is another record
		{"id header value", base, clone(func(r []Rec) []Rec { r[1].Headers[0].Value = []byte("two"); return r }),
			[]string{"missing_in_relay", "extra_in_relay"}},
		{"header value", clone(func(r []Rec) []Rec { r[1].Headers = append([]Header{ctx}, r[1].Headers...); return r }),
			clone(func(r []Rec) []Rec {
				r[1].Headers = append([]Header{{Name: ctx.Name, Value: []byte("other")}}, r[1].Headers...)
				return r
			}), []string{"header_value:__debezium.context.runId"}},
		{"header order", clone(func(r []Rec) []Rec { r[1].Headers = append([]Header{ctx}, r[1].Headers...); return r }),
			clone(func(r []Rec) []Rec { r[1].Headers = append(r[1].Headers, ctx); return r }), []string{"header_order"}},
		{"header extra and order", base, clone(func(r []Rec) []Rec {
			r[0].Headers = []Header{{Name: "id", Value: []byte("1")}, {Name: "x", Value: nil}}
			return r
		}), []string{"header_extra_in_relay:x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := diffDumps(tc.a, tc.b, "debezium", "relay")
			if !slices.Equal(d.fd.order, tc.want) {
				t.Fatalf("classes %q, want %q", d.fd.order, tc.want)
			}
			if tc.want == nil && d.identical != len(base) {
				t.Fatalf("identical %d, want %d", d.identical, len(base))
			}
		})
	}
}

func TestAllowList(t *testing.T) {
	doc := "# x\n\n<!-- compat-allow-list:begin -->\n- `header_missing_in_relay:__debezium.context.*`: Debezium's context headers\n- `value`: reason\n<!-- compat-allow-list:end -->\n- `key`: outside the block\n"
	p := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	allow, err := readAllowList(p)
	if err != nil {
		t.Fatal(err)
	}
	for class, want := range map[string]bool{
		"header_missing_in_relay:__debezium.context.runId": true,
		"header_missing_in_relay:id":                       false,
		"value":                                            true,
		"key":                                              false,
		"value_null":                                       false,
	} {
		if _, got := allowed(allow, class); got != want {
			t.Errorf("allowed(%q) = %v, want %v", class, got, want)
		}
	}
	if err := os.WriteFile(p, []byte("no block\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readAllowList(p); err == nil {
		t.Fatal("a document without the block must be an error")
	}
}

func TestSameJSON(t *testing.T) {
	for _, tc := range []struct {
		got, want string
		same      bool
	}{
		{`{"a": 2, "b": []}`, `{"a":1,"a":2, "b" : [ ]}`, true},
		{`-0.00000005`, `-0.5e-7`, true},
		{`{"a": 1}`, `{"a": 2}`, false},
		{`"x"`, `"y"`, false},
		{`null`, `null`, true},
	} {
		if got := sameJSON([]byte(tc.got), []byte(tc.want)); got != tc.same {
			t.Errorf("sameJSON(%s, %s) = %v", tc.got, tc.want, got)
		}
	}
}
