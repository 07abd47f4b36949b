package decoder

import "testing"

// headersOf returns the parsed headers as key/value pairs.
func headersOf(d *Decoder) [][2]string {
	out := make([][2]string, len(d.hdrs))
	for i, h := range d.hdrs {
		out[i] = [2]string{h.key, string(d.vals.Bytes()[h.start:h.end])}
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
