// Package cloudevents is what the relay needs to write an event as a
// CloudEvent 1.0 on Kafka, per the CloudEvents Kafka protocol binding:
// the binary content mode (the attributes as ce_* headers, the payload as
// the value, its media type in the content-type header) and the
// structured one (the whole event as one JSON value, content-type
// application/cloudevents+json). It is pure: no I/O, no goroutines; every
// function may be called from any goroutine.
//
// The relay renders the source and type of each event from templates
// (Config.Compile), fills Attributes, calls Attributes.Check (an event
// that fails it is dead-lettered with its words), then AppendHeaders or
// StructuredValue. A row's own headers go through CheckHeader first.
package cloudevents

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/sink"
)

// Content modes, the spec version written and the content type of a
// structured record.
const (
	Binary                = "binary"
	Structured            = "structured"
	SpecVersion           = "1.0"
	ContentTypeStructured = "application/cloudevents+json; charset=UTF-8"
)

// Header keys of the Kafka binding's binary mode.
const (
	HeaderSpecVersion     = "ce_specversion"
	HeaderID              = "ce_id"
	HeaderSource          = "ce_source"
	HeaderType            = "ce_type"
	HeaderTime            = "ce_time"
	HeaderSubject         = "ce_subject"
	HeaderDataSchema      = "ce_dataschema"
	HeaderDataContentType = "ce_datacontenttype" // never written: content-type carries it
	HeaderContentType     = "content-type"
	HeaderPrefix          = "ce_"
)

// MaxExtensionNameLength is the longest extension name CheckHeader
// accepts: the spec's SHOULD, and what the Go SDK enforces.
const MaxExtensionNameLength = 20

// Attributes are the context attributes of one event. ID, Source and Type
// are required; the others are written only when set (Time when not zero).
type Attributes struct {
	ID, Source, Type, Subject, DataContentType, DataSchema string
	Time                                                   time.Time
}

// Check reports the first attribute a CloudEvents reader would refuse, in
// words for an operator: the relay dead-letters such an event. Any
// goroutine; it does not allocate unless it fails.
func (a Attributes) Check() error {
	if err := checkString("id", a.ID, true, "the event's identity (event_id) is empty"); err != nil {
		return err
	}
	if err := checkString("source", a.Source, true, "check cloudevents.source and the values it renders"); err != nil {
		return err
	}
	if err := checkURIRef(a.Source); err != nil {
		return fmt.Errorf("cloudevents: source %q is not a URI-reference: %s; check cloudevents.source and the values it renders", clip(a.Source), err)
	}
	if err := checkString("type", a.Type, true, "map an event type column or set cloudevents.type"); err != nil {
		return err
	}
	if err := checkString("subject", a.Subject, false, "the event's aggregate id"); err != nil {
		return err
	}
	if err := checkString("dataschema", a.DataSchema, false, ""); err != nil {
		return err
	}
	if a.DataSchema != "" {
		if err := checkURIRef(a.DataSchema); err != nil || !hasScheme(a.DataSchema) {
			if err == nil {
				err = errors.New("it has no scheme")
			}
			return fmt.Errorf("cloudevents: dataschema %q is not an absolute URI: %s", clip(a.DataSchema), err)
		}
	}
	if err := checkString("datacontenttype", a.DataContentType, false, ""); err != nil {
		return err
	}
	if a.DataContentType != "" {
		if err := checkMediaType(a.DataContentType); err != nil {
			return fmt.Errorf("cloudevents: datacontenttype %q is not a media type (RFC 2046): %s", clip(a.DataContentType), err)
		}
		if IsCloudEventsFormat(a.DataContentType) {
			return fmt.Errorf("cloudevents: datacontenttype %q is a CloudEvents format: a reader would take the record for a structured event", clip(a.DataContentType))
		}
	}
	if !a.Time.IsZero() && (a.Time.Year() < 0 || a.Time.Year() > 9999) {
		return fmt.Errorf("cloudevents: time %s is outside RFC 3339's years 0000-9999", a.Time)
	}
	return nil
}

// checkString: valid UTF-8, no control characters, not blank when set
// (readers trim spaces before testing for empty), non-empty when required.
func checkString(name, s string, required bool, hint string) error {
	suffix := func() string {
		if hint == "" {
			return ""
		}
		return ": " + hint
	}
	if s == "" {
		if required {
			return fmt.Errorf("cloudevents: %s is empty%s", name, suffix())
		}
		return nil
	}
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("cloudevents: %s %q is only white space%s", name, clip(s), suffix())
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Errorf("cloudevents: %s %q starts or ends with white space, which readers trim%s", name, clip(s), suffix())
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n == 1 {
				return fmt.Errorf("cloudevents: %s %q is not valid UTF-8 (byte %d)%s", name, clip(s), i, suffix())
			}
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("cloudevents: %s %q holds control character %U at byte %d%s", name, clip(s), r, i, suffix())
		}
	}
	return nil
}

// clip bounds a value quoted in an error: a dead letter carries it.
func clip(s string) string {
	const max = 200
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// uriChars marks the bytes RFC 3986 allows in a URI-reference outside
// percent-encodings: unreserved, gen-delims but '[' ']' (IP literals are
// not supported), sub-delims.
var uriChars = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-._~:/?#@!$&'()*+,;=" {
		t[c] = true
	}
	return t
}()

// checkURIRef checks s is an RFC 3986 URI-reference: its bytes, its
// percent-encodings, a scheme where a colon comes before the first '/',
// '?' or '#', and at most one '#'. It allocates only when it fails.
func checkURIRef(s string) error {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' {
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return fmt.Errorf("'%%' at byte %d is not followed by two hex digits", i)
			}
			i += 2
			continue
		}
		if !uriChars[c] {
			return fmt.Errorf("byte %d (%q) must be percent-encoded", i, rune(c))
		}
	}
	if strings.Count(s, "#") > 1 {
		return errors.New("it has more than one '#'")
	}
	end := strings.IndexAny(s, "/?#")
	if end < 0 {
		end = len(s)
	}
	if colon := strings.IndexByte(s[:end], ':'); colon >= 0 && !validScheme(s[:colon]) {
		return fmt.Errorf("%q before the first ':' is not a scheme (write ./ before a relative path with a colon)", s[:colon])
	}
	return nil
}

func hasScheme(s string) bool {
	colon := strings.IndexByte(s, ':')
	return colon > 0 && validScheme(s[:colon]) && !strings.ContainsAny(s[:colon], "/?#")
}

func validScheme(s string) bool {
	if s == "" || !isAlpha(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlpha(c) && !(c >= '0' && c <= '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func isAlpha(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }
func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'f'
}

// checkMediaType checks type/subtype[;params] with RFC 2045 tokens, as
// mime.ParseMediaType (what the SDK's Validate uses) reads it.
func checkMediaType(s string) error {
	mt, params, _ := strings.Cut(s, ";")
	mt = strings.TrimSpace(mt)
	typ, sub, ok := strings.Cut(mt, "/")
	if !ok || !isToken(typ) || !isToken(sub) {
		return errors.New("want type/subtype, e.g. application/json")
	}
	for params != "" {
		var p string
		p, params, _ = strings.Cut(params, ";")
		p = strings.TrimSpace(p)
		if p == "" && params == "" {
			break
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || !isToken(k) || !(isToken(v) || len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' && !strings.ContainsAny(v[1:len(v)-1], `"\`)) {
			return fmt.Errorf("parameter %q is not name=value", p)
		}
	}
	return nil
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?=`, c) >= 0 {
			return false
		}
	}
	return true
}

// mediaType is s's type/subtype, lower case (allocates only when s has
// upper case letters).
// MediaType is a content type's type/subtype, lower case, parameters cut.
func MediaType(s string) string {
	if i := strings.IndexByte(s, ';'); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimSpace(s)
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// IsJSON reports whether a content type is JSON: application/json or any
// type with the +json suffix (parameters ignored, case-insensitive).
func IsJSON(contentType string) bool {
	mt := MediaType(contentType)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// inlineJSON: the media types the Go SDK reads inline data of, compared
// as it does (case-sensitive, parameters cut).
func inlineJSON(contentType string) bool {
	if i := strings.IndexByte(contentType, ';'); i >= 0 {
		contentType = strings.TrimSpace(contentType[:i])
	}
	return contentType == "application/json" || contentType == "text/json"
}

// IsCloudEventsFormat reports whether contentType is one of CloudEvents'
// own formats (application/cloudevents...), structured JSON or another.
func IsCloudEventsFormat(contentType string) bool {
	return strings.HasPrefix(MediaType(contentType), "application/cloudevents")
}

// IsStructured reports whether a record's content-type header says it is
// a structured-mode CloudEvent in the JSON format.
func IsStructured(contentType string) bool {
	return MediaType(contentType) == "application/cloudevents+json"
}

var (
	keySpecVersion    = []byte(HeaderSpecVersion)
	keyID             = []byte(HeaderID)
	keySource         = []byte(HeaderSource)
	keyType           = []byte(HeaderType)
	keyTime           = []byte(HeaderTime)
	keySubject        = []byte(HeaderSubject)
	keyDataSchema     = []byte(HeaderDataSchema)
	keyContentType    = []byte(HeaderContentType)
	valueSpecVersion  = []byte(SpecVersion)
	valueCTStructured = []byte(ContentTypeStructured)
	timeLayout        = time.RFC3339Nano
	maxTimeLen        = len("2006-01-02T15:04:05.999999999Z")
	errNotCheckedUTF8 = errors.New("cloudevents: an attribute is not valid UTF-8 (call Attributes.Check first)")
)

// AppendHeaders appends a's binary-mode headers to h: ce_specversion,
// ce_id, ce_source, ce_type, ce_time (RFC 3339 in UTC, when set),
// ce_subject, ce_dataschema and content-type (each when set). The keys
// are shared read-only slices; the values share one new buffer. Call
// Check first. Any goroutine.
func AppendHeaders(h []sink.Header, a Attributes) []sink.Header {
	n := len(a.ID) + len(a.Source) + len(a.Type) + len(a.Subject) + len(a.DataSchema) + len(a.DataContentType)
	if !a.Time.IsZero() {
		n += maxTimeLen
	}
	buf := make([]byte, 0, n)
	str := func(s string) []byte {
		start := len(buf)
		buf = append(buf, s...)
		return buf[start:len(buf):len(buf)]
	}
	h = append(h, sink.Header{Key: keySpecVersion, Value: valueSpecVersion},
		sink.Header{Key: keyID, Value: str(a.ID)},
		sink.Header{Key: keySource, Value: str(a.Source)},
		sink.Header{Key: keyType, Value: str(a.Type)})
	if !a.Time.IsZero() {
		start := len(buf)
		buf = a.Time.UTC().AppendFormat(buf, timeLayout)
		h = append(h, sink.Header{Key: keyTime, Value: buf[start:len(buf):len(buf)]})
	}
	if a.Subject != "" {
		h = append(h, sink.Header{Key: keySubject, Value: str(a.Subject)})
	}
	if a.DataSchema != "" {
		h = append(h, sink.Header{Key: keyDataSchema, Value: str(a.DataSchema)})
	}
	if a.DataContentType != "" {
		h = append(h, sink.Header{Key: keyContentType, Value: str(a.DataContentType)})
	}
	return h
}

// StructuredHeader is the content-type header of a structured record.
func StructuredHeader() sink.Header {
	return sink.Header{Key: keyContentType, Value: valueCTStructured}
}

// StructuredValue appends the structured-mode value of the event (the
// JSON event format) to dst: the attributes, then data inline when
// DataContentType is application/json or text/json (parameters allowed)
// and data is valid JSON, else data_base64 (no data member when data is
// empty). A +json type goes as data_base64: the spec would inline it too,
// but the CloudEvents Go SDK (v2.16) refuses such an event. The record's content-type header is
// ContentTypeStructured (StructuredHeader). An error means an attribute
// is not valid UTF-8 (Check refuses that). Any goroutine.
func StructuredValue(dst []byte, a Attributes, data []byte) ([]byte, error) {
	inline := len(data) > 0 && inlineJSON(a.DataContentType) && json.Valid(data)
	n := 128 + len(a.ID) + len(a.Source) + len(a.Type) + len(a.Subject) + len(a.DataSchema) + len(a.DataContentType)
	if inline {
		n += len(data)
	} else {
		n += base64.StdEncoding.EncodedLen(len(data))
	}
	if cap(dst)-len(dst) < n {
		d := make([]byte, len(dst), len(dst)+n)
		copy(d, dst)
		dst = d
	}
	ok := true
	member := func(name, v string) {
		dst = append(dst, ',', '"')
		dst = append(dst, name...)
		dst = append(dst, '"', ':')
		var good bool
		dst, good = appendJSONString(dst, v)
		ok = ok && good
	}
	dst = append(dst, `{"specversion":"`+SpecVersion+`"`...)
	member("id", a.ID)
	member("source", a.Source)
	member("type", a.Type)
	if a.Subject != "" {
		member("subject", a.Subject)
	}
	if !a.Time.IsZero() {
		dst = append(dst, `,"time":"`...)
		dst = a.Time.UTC().AppendFormat(dst, timeLayout)
		dst = append(dst, '"')
	}
	if a.DataContentType != "" {
		member("datacontenttype", a.DataContentType)
	}
	if a.DataSchema != "" {
		member("dataschema", a.DataSchema)
	}
	switch {
	case inline:
		dst = append(dst, `,"data":`...)
		dst = append(dst, data...)
	case len(data) > 0:
		dst = append(dst, `,"data_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, data)
		dst = append(dst, '"')
	}
	dst = append(dst, '}')
	if !ok {
		return dst, errNotCheckedUTF8
	}
	return dst, nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string: '"' and '\\' escaped,
// control characters as \uXXXX (\n \r \t short), U+2028 and U+2029
// escaped (JavaScript readers), invalid UTF-8 replaced by U+FFFD and
// reported (false).
func appendJSONString(dst []byte, s string) ([]byte, bool) {
	ok := true
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			ok = false
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), ok
}

// reserved are the headers the relay sets in cloudevents mode (and ce_data,
// which the JSON format reserves), lower case.
var reserved = []string{HeaderSpecVersion, HeaderID, HeaderSource, HeaderType, HeaderTime, HeaderSubject,
	HeaderDataSchema, HeaderDataContentType, HeaderContentType, "ce_data", "ce_data_base64"}

// CheckHeader checks the key of a row's own header in cloudevents mode:
// the attributes the relay sets are refused (case-insensitively: readers
// lower-case header keys), as is a ce_ key (any case) that is not ce_
// followed by a valid extension name (a-z, 0-9, 1 to 20 characters); other
// ce_<name> keys pass and readers take them as extensions. Any goroutine.
func CheckHeader(key string) error {
	for _, r := range reserved {
		if strings.EqualFold(key, r) {
			return fmt.Errorf("cloudevents: header %q is the CloudEvents attribute %s, which the relay sets", clip(key), r)
		}
	}
	if len(key) < len(HeaderPrefix) || !strings.EqualFold(key[:len(HeaderPrefix)], HeaderPrefix) {
		return nil
	}
	if key[:len(HeaderPrefix)] != HeaderPrefix {
		return fmt.Errorf("cloudevents: header %q: a CloudEvents extension header starts with lower-case ce_", clip(key))
	}
	if err := CheckExtensionName(key[len(HeaderPrefix):]); err != nil {
		return fmt.Errorf("cloudevents: header %q: %w", clip(key), err)
	}
	return nil
}

// CheckExtensionName checks an extension attribute's name: a-z and 0-9,
// 1 to MaxExtensionNameLength characters.
func CheckExtensionName(name string) error {
	if name == "" || len(name) > MaxExtensionNameLength {
		return fmt.Errorf("an extension name has 1 to %d characters, not %d", MaxExtensionNameLength, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return fmt.Errorf("an extension name is lower-case letters a-z and digits 0-9 only, byte %d is %q", i, rune(c))
		}
	}
	return nil
}
