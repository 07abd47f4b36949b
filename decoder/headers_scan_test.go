package decoder

import (
	"strconv"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// headersOf returns the parsed headers as key/value/refused triples.
func headersOf(d *Decoder) [][3]string {
	out := make([][3]string, len(d.hdrs))
	for i, h := range d.hdrs {
		out[i] = [3]string{h.key, string(d.vals.Bytes()[h.start:h.end]), strconv.FormatBool(h.refused)}
	}
	return out
}

// FuzzFlatHeadersScanMatchesJSON: wherever the hand-written scan answers,
// encoding/json must accept the same document and give the same headers.
func FuzzFlatHeadersScanMatchesJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { } `, `{"a": "x"}`, `{"trace_id": "t-1", "n": 3, "f": -1.5e+3, "t": true, "no": false, "z": null}`,
		`{"a":1,"a":2}`, `{"é": "ü"}`, `{"a": "x\\"y"}`, `{"a": {"b": [1, 2]}}`, `{"a": 01}`, `{"a": 1.}`,
		`{"a": -}`, `{"a": tru}`, `{"a": truex}`, `{"a": 1} {}`, `{"a" 1}`, `{"a": 1,}`, `["a"]`, `"a"`,
		"{\"a\": \"\x01\"}", "{\"a\": \"\xff\"}", `{"a": 1e5, "b": 0, "c": -0.0}`, "{\t\"a\"\n:\r\"b\" }",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		fast, _ := New("public.outbox")
		if !fast.scanFlatHeaders(doc) {
			return
		}
		slow, _ := New("public.outbox")
		if r := slow.parseHeadersJSON(doc); r != nil {
			t.Fatalf("scan accepted %q, encoding/json rejects it: %s", doc, r.text)
		}
		got, want := headersOf(fast), headersOf(slow)
		if len(got) != len(want) {
			t.Fatalf("%q: scan %q, encoding/json %q", doc, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%q: scan %q, encoding/json %q", doc, got, want)
			}
		}
	})
}

// The scan takes the common documents itself (no fallback).
func TestFlatHeadersScanTakesCommonDocuments(t *testing.T) {
	for _, doc := range []string{
		`{}`, `{"trace_id": "4bf92f3577b34da6", "tenant_id": "acme", "schema_version": 2}`,
		`{"a": true, "b": null, "c": -12.5e-3, "d": "café"}`,
	} {
		d, _ := New("public.outbox")
		if !d.scanFlatHeaders([]byte(doc)) {
			t.Errorf("scan fell back on %s", doc)
		}
	}
	d, _ := New("public.outbox")
	if d.scanFlatHeaders([]byte(`{"a": {"b": 1}}`)) {
		t.Error("scan took a nested value")
	}
}

// The verdict on a reserved header key is kept with the interned key and
// with the previous row's keys: it holds for every later row, also for a
// key first interned as another column's value, and for the Decoder's
// extra reserved keys, and it is the verdict reservedKey gives.
func TestReservedKeyVerdictKept(t *testing.T) {
	d, err := NewMapped([]outboxschema.Mapping{outboxschema.DefaultMapping(outboxschema.Table{Schema: "public", Name: "outbox"})}, []string{"id"})
	if err != nil {
		t.Fatal(err)
	}
	_ = d.str([]byte("event_id")) // an aggregate_type, say: interned unchecked
	for round := range 3 {
		for _, tc := range []struct {
			doc  string
			want []bool
		}{
			{`{"event_id": "x", "trace": "t"}`, []bool{true, false}},
			{`{"ID": 1, "tenant": "a"}`, []bool{true, false}},
			{`{"dlq.reason": "r", "Pg_Lsn": "0/0", "trace": "u"}`, []bool{true, true, false}},
		} {
			for range 2 { // the second time from the previous row's keys
				if !d.scanFlatHeaders([]byte(tc.doc)) {
					t.Fatalf("scan fell back on %s", tc.doc)
				}
				for i, h := range d.hdrs {
					if h.refused != tc.want[i] || h.refused != d.refusedKey(h.key) {
						t.Fatalf("round %d, %s: key %q refused=%v, want %v", round, tc.doc, h.key, h.refused, tc.want[i])
					}
				}
			}
		}
	}
}
