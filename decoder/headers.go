package decoder

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"unicode/utf8"
)

// hdrSpan is one header of the current row: its key, and where its value
// sits in Decoder.vals.
type hdrSpan struct {
	key        string
	start, end int
}

// parseHeaders reads the top-level keys of a headers document, in document
// order, into d.hdrs and d.vals. It returns why the document cannot be used,
// or nil.
//
// Keys come from the token stream. Values are read whole as raw JSON, so a
// number keeps its exact text (what UseNumber would keep, without re-encoding)
// and a nested value only needs its whitespace removed.
func (d *Decoder) parseHeaders(doc []byte) *reason {
	d.hdrs = d.hdrs[:0]
	d.vals.Reset()
	d.rd.Reset(doc)
	dec := json.NewDecoder(&d.rd)

	tok, err := dec.Token()
	if err != nil {
		return invalidJSON(err)
	}
	if tok != json.Delim('{') {
		return &reason{"is " + jsonKind(tok) + ", not a JSON object", hintProducer}
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalidJSON(err)
		}
		key, _ := tok.(string) // a key is always a string token
		if err := dec.Decode(&d.raw); err != nil {
			return invalidJSON(err)
		}
		start := d.vals.Len()
		if err := appendValue(&d.vals, d.raw); err != nil {
			return invalidJSON(err)
		}
		d.hdrs = append(d.hdrs, hdrSpan{key: key, start: start, end: d.vals.Len()})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return invalidJSON(err)
	}
	// A headers column of type text could hold two documents; json and
	// jsonb cannot.
	if _, err := dec.Token(); err != io.EOF {
		return &reason{"has data after the JSON object", hintProducer}
	}
	return nil
}

// appendValue appends a header's value: a string unescaped, anything else
// as compact JSON.
func appendValue(dst *bytes.Buffer, raw json.RawMessage) error {
	if len(raw) == 0 {
		return errors.New("empty value") // unreachable after a successful Decode
	}
	switch raw[0] {
	case '"':
		// Most header strings need no unescaping: copy them as they are.
		if s := raw[1 : len(raw)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
			dst.Write(s)
			return nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return err
		}
		dst.WriteString(s)
		return nil
	case '{', '[':
		return json.Compact(dst, raw)
	default: // number, true, false, null: already compact
		dst.Write(raw)
		return nil
	}
}

func invalidJSON(err error) *reason {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return &reason{"is not valid JSON: " + err.Error(), hintProducer}
}

// jsonKind names the JSON type of a top-level token, for errors.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim: // only '[' can start a value here besides '{'
		return "a JSON array"
	case string:
		return "a JSON string"
	case bool:
		return "a JSON boolean"
	case nil:
		return "JSON null"
	default:
		return "a JSON number"
	}
}
