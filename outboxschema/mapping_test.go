package outboxschema

import (
	"strings"
	"testing"
)

func TestParsePlacements(t *testing.T) {
	tests := []struct {
		in   []string
		want []Placement
		err  string
	}{
		{in: []string{"type:header", "trace_id:HEADER:x-trace"}, want: []Placement{{"type", "type"}, {"trace_id", "x-trace"}}},
		{in: []string{"type:envelope:eventType"}, err: "placement envelope is not supported"},
		{in: []string{"tenant:partition"}, err: "placement partition is not supported"},
		{in: []string{"type"}, err: "is not column:header or column:header:name"},
		{in: []string{"a:b:c:d"}, err: "is not column:header"},
		{in: []string{":header"}, err: "is not column:header"},
		{in: []string{"type:header:"}, err: "empty header name"},
		{in: []string{"type:body"}, err: `unknown placement "body"`},
	}
	for _, tt := range tests {
		got, err := ParsePlacements("columns.additional", tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.HasPrefix(err.Error(), "columns.additional: ") {
				t.Errorf("%v: err %v, want one naming columns.additional with %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || len(got) != len(tt.want) {
			t.Fatalf("%v: %v %v, want %v", tt.in, got, err, tt.want)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%v: %v, want %v", tt.in, got, tt.want)
			}
		}
	}
}

func TestMappingValidate(t *testing.T) {
	tb := Table{Schema: "public", Name: "outbox"}
	reserved := func(k string) bool { return ReservedHeader(k) || strings.EqualFold(k, "id") }
	tests := []struct {
		name string
		m    func(*Mapping)
		err  []string
	}{
		{name: "debezium ok", m: func(*Mapping) {}},
		{name: "no id", m: func(m *Mapping) { m.ID = "" }, err: []string{"columns.id: is empty"}},
		{name: "no key, no payload", m: func(m *Mapping) { m.Key, m.Payload = "", "" }, err: []string{"columns.key: is empty", "columns.payload: is empty"}},
		{name: "name too long", m: func(m *Mapping) { m.Type = strings.Repeat("t", 64) }, err: []string{"columns.type: "}},
		{name: "placement forging event_id", m: func(m *Mapping) { m.Additional = []Placement{{"type", "Event_ID"}} },
			err: []string{`columns.additional: header name "Event_ID" (column type) is reserved`}},
		{name: "placement forging id under compat", m: func(m *Mapping) { m.Additional = []Placement{{"aggregateid", "ID"}} },
			err: []string{`header name "ID" (column aggregateid) is reserved`}},
		{name: "placement forging dlq.*", m: func(m *Mapping) { m.Additional = []Placement{{"type", "dlq.reason"}} }, err: []string{"is reserved"}},
		{name: "placement with a bad name", m: func(m *Mapping) { m.Additional = []Placement{{"type", "event\u200btype"}} },
			err: []string{`columns.additional: header name "event\u200btype" contains the control or invisible character U+200B (column type)`}},
		{name: "same header twice", m: func(m *Mapping) { m.Additional = []Placement{{"type", "t"}, {"aggregateid", "T"}} }, err: []string{`header name "T" is placed twice`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := DebeziumMapping(tb)
			tt.m(&m)
			err := m.Validate("", reserved)
			if len(tt.err) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %v", tt.err)
			}
			for _, w := range tt.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if err := DefaultMapping(tb).Validate("tables[2].", ReservedHeader); err != nil {
		t.Errorf("default mapping: %v", err)
	}
	m := DefaultMapping(tb)
	m.ID = ""
	if err := m.Validate("tables[2].", ReservedHeader); err == nil || !strings.HasPrefix(err.Error(), "tables[2].columns.id: ") {
		t.Errorf("a tables item's error %v does not name tables[2].columns.id", err)
	}
}

func TestMappingCheckTypes(t *testing.T) {
	tb := Table{Schema: "app", Name: "outbox"}
	dbz := map[string]string{"id": "uuid", "aggregatetype": "varchar", "aggregateid": "varchar", "type": "varchar", "payload": "jsonb"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range dbz {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name  string
		types map[string]string
		m     func(*Mapping)
		err   string
	}{
		{name: "debezium table", types: dbz},
		{name: "bigint id, bytea payload", types: with("id", "int8"), m: func(m *Mapping) {}},
		{name: "text payload", types: with("payload", "text")},
		{name: "bytea payload", types: with("payload", "bytea")},
		{name: "numeric id", types: with("id", "numeric"),
			err: `columns.id: column "id" of app.outbox has type numeric, but the event id must be int8, int4, int2, uuid, text, varchar: point columns.id at another column, or ALTER TABLE "app"."outbox" ALTER COLUMN "id" TYPE int8`},
		{name: "xml payload", types: with("payload", "xml"), err: `columns.payload: column "payload" of app.outbox has type xml, but the payload must be jsonb`},
		{name: "missing key", types: with("aggregateid", ""), err: `columns.key: column "aggregateid" does not exist in app.outbox`},
		{name: "missing placement column", types: dbz, m: func(m *Mapping) { m.Additional = []Placement{{"trace", "trace"}} },
			err: `columns.additional: column "trace" does not exist`},
		{name: "headers column of type int", types: with("meta", "int4"), m: func(m *Mapping) { m.Headers = "meta" },
			err: `columns.headers: column "meta" of app.outbox has type int4`},
		{name: "key of any type", types: with("aggregateid", "int8")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := DebeziumMapping(tb)
			if tt.m != nil {
				tt.m(&m)
			}
			err := m.CheckTypes("", tt.types)
			switch {
			case tt.err == "" && err != nil:
				t.Fatal(err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("error %v, want one containing %q", err, tt.err)
			}
		})
	}
}

func TestMappingOwn(t *testing.T) {
	tb := Table{Schema: "public", Name: "outbox"}
	if !DefaultMapping(tb).Own() {
		t.Error("DefaultMapping is not Own")
	}
	if DebeziumMapping(tb).Own() {
		t.Error("DebeziumMapping is Own")
	}
	m := DefaultMapping(tb)
	m.Key = "tenant"
	if m.Own() {
		t.Error("a mapping with another key is Own")
	}
}
