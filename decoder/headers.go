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
	refused    bool // the name breaks the header-name rule (Decoder.refusedKey); set for the headers column's keys only
	start, end int
}

// parseHeaders reads the top-level keys of a headers document, in document
// order, into d.hdrs and d.vals. It returns why the document cannot be used,
// or nil.
//
// The common document (a flat object of plain strings, numbers and
// literals, as jsonb renders it) takes a hand-written scan with no
// allocation but the interned keys; anything else (escapes, nesting,
// errors) takes encoding/json, which also words the errors. A fuzz test
// checks that both give the same result wherever the scan answers.
func (d *Decoder) parseHeaders(doc []byte) *reason {
	if d.scanFlatHeaders(doc) {
		return nil
	}
	return d.parseHeadersJSON(doc)
}

// parseHeadersJSON is parseHeaders through encoding/json.
//
// Keys come from the token stream. Values are read whole as raw JSON, so a
// number keeps its exact text (what UseNumber would keep, without re-encoding)
// and a nested value only needs its whitespace removed.
func (d *Decoder) parseHeadersJSON(doc []byte) *reason {
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
		d.hdrs = append(d.hdrs, hdrSpan{key: key, refused: d.refusedKey(key), start: start, end: d.vals.Len()})
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

// scanFlatHeaders parses doc when it is a JSON object whose values are
// strings without escapes, numbers, true, false or null, and keys are
// strings without escapes. It reports false, leaving garbage in d.hdrs and
// d.vals, for anything else, valid or not.
func (d *Decoder) scanFlatHeaders(doc []byte) bool {
	d.hdrs = d.hdrs[:0]
	d.vals.Reset()
	i := skipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return false
	}
	i = skipSpace(doc, i+1)
	if i < len(doc) && doc[i] == '}' {
		return skipSpace(doc, i+1) == len(doc)
	}
	for {
		key, next, ok := plainString(doc, i)
		if !ok {
			return false
		}
		i = skipSpace(doc, next)
		if i >= len(doc) || doc[i] != ':' {
			return false
		}
		i = skipSpace(doc, i+1)
		if i >= len(doc) {
			return false
		}
		var val []byte
		switch c := doc[i]; {
		case c == '"':
			if val, next, ok = plainString(doc, i); !ok {
				return false
			}
		case c == '-' || c >= '0' && c <= '9':
			if next = numberEnd(doc, i); next < 0 {
				return false
			}
			val = doc[i:next]
		default:
			next = -1
			for _, lit := range [...]string{"true", "false", "null"} {
				if bytes.HasPrefix(doc[i:], []byte(lit)) {
					val, next = doc[i:i+len(lit)], i+len(lit)
				}
			}
			if next < 0 {
				return false // nested value or invalid
			}
		}
		start := d.vals.Len()
		d.vals.Write(val)
		var k string
		var refused bool
		if n := len(d.hdrs); n < len(d.last.keys) {
			if l := &d.last.keys[n]; l.ok && l.s == string(key) { // the previous row's key here
				k, refused = l.s, l.refused
			} else {
				k, refused = d.headerKey(key)
				*l = lastKey{s: k, refused: refused, ok: true}
			}
		} else {
			k, refused = d.headerKey(key)
		}
		d.hdrs = append(d.hdrs, hdrSpan{key: k, refused: refused, start: start, end: d.vals.Len()})
		i = skipSpace(doc, next)
		if i >= len(doc) {
			return false
		}
		switch doc[i] {
		case ',':
			i = skipSpace(doc, i+1)
		case '}':
			return skipSpace(doc, i+1) == len(doc)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString returns the contents of the JSON string starting at b[i] and
// the index after its closing quote, if it has no escapes, no control
// characters and is valid UTF-8.
func plainString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	ascii := true
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s = b[i+1 : j]
			return s, j + 1, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= 0x80:
			ascii = false
		}
	}
	return nil, 0, false
}

// numberEnd returns the index after the JSON number starting at b[i], or -1
// if it is not one: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func numberEnd(b []byte, i int) int {
	digits := func(j int) int {
		k := j
		for k < len(b) && b[k] >= '0' && b[k] <= '9' {
			k++
		}
		return k
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}
