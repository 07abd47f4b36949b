package serialize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
)

// avroCodec converts JSON payloads to Avro binary and back for one schema.
// It is immutable after newAvroCodec and safe for concurrent use.
type avroCodec struct {
	schema avro.Schema
}

// newAvroCodec parses text after the referenced schemas (refs by name,
// parsed in order: dependencies first), whose named types it may use.
func newAvroCodec(text string, order []string, refs map[string]string) (*avroCodec, error) {
	cache := &avro.SchemaCache{}
	for _, name := range order {
		if _, err := avro.ParseWithCache(refs[name], "", cache); err != nil {
			return nil, fmt.Errorf("parse Avro schema reference %q: %w", name, err)
		}
	}
	s, err := avro.ParseWithCache(text, "", cache)
	if err != nil {
		return nil, fmt.Errorf("parse Avro schema: %w", err)
	}
	return &avroCodec{schema: s}, nil
}

// fieldError is a conversion problem at a path inside the payload; Encode
// turns it into a *MismatchError.
type fieldError struct {
	path string
	msg  string
}

func (e *fieldError) Error() string {
	if e.path == "" {
		return e.msg
	}
	return e.path + ": " + e.msg
}

func mismatchf(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

// decodeJSON reads exactly one JSON value with numbers kept as json.Number.
// Invalid UTF-8 is refused: encoding/json would replace it with U+FFFD, and
// changing data silently is what this package must not do.
func decodeJSON(payload []byte) (any, error) {
	if !utf8.Valid(payload) {
		off := 0
		for off < len(payload) {
			r, n := utf8.DecodeRune(payload[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return nil, mismatchf("", "payload is not valid UTF-8 (byte %d)", off)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, mismatchf("", "payload is not JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, mismatchf("", "payload has data after its JSON value")
	}
	return v, nil
}

// encode converts payload (JSON) to Avro binary appended to dst.
func (c *avroCodec) encode(dst, payload []byte) ([]byte, error) {
	v, err := decodeJSON(payload)
	if err != nil {
		return nil, err
	}
	native, err := avroNative(c.schema, v, "")
	if err != nil {
		return nil, err
	}
	b, err := avro.Marshal(c.schema, native)
	if err != nil {
		return nil, mismatchf("", "Avro encoding: %v", err)
	}
	return append(dst, b...), nil
}

func joinPath(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		s := x
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return strconv.Quote(s)
	case json.Number:
		s := string(x)
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return s
	case bool:
		return strconv.FormatBool(x)
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	default:
		return fmt.Sprintf("%v", x)
	}
}

func deref(s avro.Schema) avro.Schema {
	if r, ok := s.(*avro.RefSchema); ok {
		return r.Schema()
	}
	return s
}

func logicalOf(s avro.Schema) avro.LogicalType {
	if l, ok := s.(avro.LogicalTypeSchema); ok && l.Logical() != nil {
		return l.Logical().Type()
	}
	return ""
}

// unionName is the key hamba expects for a union branch in the map form.
func unionName(s avro.Schema) string {
	s = deref(s)
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	name := string(s.Type())
	if lt := logicalOf(s); lt != "" {
		name += "." + string(lt)
	}
	return name
}

// jsonName is a union branch's name in Avro's JSON encoding: the full name
// of a named type, else the type name.
func jsonName(s avro.Schema) string {
	s = deref(s)
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}

// avroInt parses an integral JSON number within [lo, hi].
func avroInt(v any, lo, hi int64, typ, path string) (int64, error) {
	var s string
	switch x := v.(type) {
	case json.Number:
		s = string(x)
	case float64: // schema defaults, parsed by hamba
		if x != math.Trunc(x) || x < float64(lo) || x > float64(hi) {
			return 0, mismatchf(path, "%v is not an Avro %s", x, typ)
		}
		return int64(x), nil
	case int:
		return avroInt(json.Number(strconv.Itoa(x)), lo, hi, typ, path)
	case int64:
		return avroInt(json.Number(strconv.FormatInt(x, 10)), lo, hi, typ, path)
	case int32:
		return avroInt(json.Number(strconv.FormatInt(int64(x), 10)), lo, hi, typ, path)
	default:
		return 0, mismatchf(path, "%s is not an Avro %s", describe(v), typ)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// 1e3 and 2.0 are integral; 1.5 and 1e400 are not ints.
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) >= 1<<53 {
			if ferr == nil && f == math.Trunc(f) || errors.Is(ferr, strconv.ErrRange) || errors.Is(err, strconv.ErrRange) {
				return 0, mismatchf(path, "%s is out of range of an Avro %s", describe(v), typ)
			}
			return 0, mismatchf(path, "%s is not an Avro %s", describe(v), typ)
		}
		n = int64(f)
	}
	if n < lo || n > hi {
		return 0, mismatchf(path, "%s is out of range of an Avro %s", describe(v), typ)
	}
	return n, nil
}

func avroFloat(v any, bits int, typ, path string) (float64, error) {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), bits)
		if err != nil {
			return 0, mismatchf(path, "%s is out of range of an Avro %s", describe(v), typ)
		}
		return f, nil
	case float64:
		return x, nil
	case int:
		return float64(x), nil
	case int64:
		return float64(x), nil
	}
	return 0, mismatchf(path, "%s is not an Avro %s", describe(v), typ)
}

// latin1 turns a JSON string into bytes as Avro's JSON encoding does: each
// code point 0-255 is one byte.
func latin1(s, path string) ([]byte, error) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 255 {
			return nil, mismatchf(path, "character %q is not a byte: Avro bytes in JSON are code points 0-255", r)
		}
		b = append(b, byte(r))
	}
	return b, nil
}

// maxDecimalText bounds the decimal strings parsed: big.Rat expands
// exponents, and "1e999999999" must not allocate gigabytes.
const maxDecimalText = 200

var decimalRE = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$`)

func avroDecimal(v any, prec, scale int, path string) (*big.Rat, error) {
	var s string
	switch x := v.(type) {
	case json.Number:
		s = string(x)
	case string:
		s = x
	default:
		return nil, mismatchf(path, "%s is not a decimal (a JSON number or string)", describe(v))
	}
	if len(s) > maxDecimalText {
		return nil, mismatchf(path, "decimal of %d characters is too long", len(s))
	}
	// Plain decimal notation only: big.Rat also takes "0x1p99999999" and
	// "1/3", and would compute the former for minutes.
	if !decimalRE.MatchString(s) {
		return nil, mismatchf(path, "%s is not a decimal number", describe(v))
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil || e > 100 || e < -100 {
			return nil, mismatchf(path, "%s is not a decimal of precision %d", describe(v), prec)
		}
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, mismatchf(path, "%s is not a decimal", describe(v))
	}
	// Exact at the scale: r * 10^scale must be an integer.
	unscaled := new(big.Rat).Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil)))
	if !unscaled.IsInt() {
		return nil, mismatchf(path, "%s has more than %d decimal places", describe(v), scale)
	}
	if digits := len(new(big.Int).Abs(unscaled.Num()).String()); digits > prec && unscaled.Num().Sign() != 0 {
		return nil, mismatchf(path, "%s has more than %d digits", describe(v), prec)
	}
	return r, nil
}

func avroTimestamp(v any, unit time.Duration, path, typ string) (int, error) {
	if s, ok := v.(string); ok {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, mismatchf(path, "%s is not an RFC 3339 time for %s", describe(v), typ)
		}
		if unit == time.Millisecond {
			return int(t.UnixMilli()), nil
		}
		return int(t.UnixMicro()), nil
	}
	n, err := avroInt(v, math.MinInt64, math.MaxInt64, typ, path)
	return int(n), err
}

// avroNative converts a decoded JSON value to the Go value hamba encodes
// for schema s, refusing anything that does not fit exactly.
func avroNative(s avro.Schema, v any, path string) (any, error) {
	s = deref(s)
	lt := logicalOf(s)
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return nil, mismatchf(path, "%s is not null", describe(v))
		}
		return nil, nil
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return nil, mismatchf(path, "%s is not an Avro boolean", describe(v))
		}
		return b, nil
	case avro.Int:
		if lt == avro.Date {
			if str, ok := v.(string); ok {
				t, err := time.Parse(time.DateOnly, str)
				if err != nil {
					return nil, mismatchf(path, "%s is not a date (YYYY-MM-DD)", describe(v))
				}
				return int(t.Unix() / 86400), nil
			}
		}
		n, err := avroInt(v, math.MinInt32, math.MaxInt32, "int", path)
		return int(n), err
	case avro.Long:
		switch lt {
		case avro.TimestampMillis, avro.LocalTimestampMillis:
			return avroTimestamp(v, time.Millisecond, path, string(lt))
		case avro.TimestampMicros, avro.LocalTimestampMicros:
			return avroTimestamp(v, time.Microsecond, path, string(lt))
		}
		n, err := avroInt(v, math.MinInt64, math.MaxInt64, "long", path)
		return int(n), err
	case avro.Float:
		f, err := avroFloat(v, 32, "float", path)
		return float32(f), err
	case avro.Double:
		return avroFloat(v, 64, "double", path)
	case avro.String:
		str, ok := v.(string)
		if !ok {
			return nil, mismatchf(path, "%s is not an Avro string", describe(v))
		}
		return str, nil
	case avro.Bytes:
		if d, ok := s.(*avro.PrimitiveSchema).Logical().(*avro.DecimalLogicalSchema); ok {
			return avroDecimal(v, d.Precision(), d.Scale(), path)
		}
		str, ok := v.(string)
		if !ok {
			return nil, mismatchf(path, "%s is not Avro bytes (a JSON string)", describe(v))
		}
		return latin1(str, path)
	case avro.Enum:
		e := s.(*avro.EnumSchema)
		str, ok := v.(string)
		if !ok {
			return nil, mismatchf(path, "%s is not a symbol of enum %s", describe(v), e.FullName())
		}
		for _, sym := range e.Symbols() {
			if sym == str {
				return str, nil
			}
		}
		return nil, mismatchf(path, "%s is not a symbol of enum %s %v", describe(v), e.FullName(), e.Symbols())
	case avro.Fixed:
		f := s.(*avro.FixedSchema)
		if d, ok := f.Logical().(*avro.DecimalLogicalSchema); ok {
			return avroDecimal(v, d.Precision(), d.Scale(), path)
		}
		str, ok := v.(string)
		if !ok {
			return nil, mismatchf(path, "%s is not Avro fixed %s (a JSON string)", describe(v), f.FullName())
		}
		b, err := latin1(str, path)
		if err != nil {
			return nil, err
		}
		if len(b) != f.Size() {
			return nil, mismatchf(path, "%d bytes do not fit fixed %s of %d bytes", len(b), f.FullName(), f.Size())
		}
		arr := reflect.New(reflect.ArrayOf(f.Size(), reflect.TypeFor[byte]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(b))
		return arr.Interface(), nil
	case avro.Array:
		a, ok := v.([]any)
		if !ok {
			return nil, mismatchf(path, "%s is not an array", describe(v))
		}
		items := s.(*avro.ArraySchema).Items()
		out := make([]any, len(a))
		for i, item := range a {
			x, err := avroNative(items, item, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	case avro.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, mismatchf(path, "%s is not an object (Avro map)", describe(v))
		}
		values := s.(*avro.MapSchema).Values()
		out := make(map[string]any, len(m))
		for k, item := range m {
			x, err := avroNative(values, item, path+"["+strconv.Quote(k)+"]")
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case avro.Record, avro.Error:
		return avroRecord(s.(*avro.RecordSchema), v, path)
	case avro.Union:
		return avroUnion(s.(*avro.UnionSchema), v, path)
	}
	return nil, mismatchf(path, "Avro type %s is not supported", s.Type())
}

func avroRecord(r *avro.RecordSchema, v any, path string) (any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, mismatchf(path, "%s is not an object (record %s)", describe(v), r.FullName())
	}
	out := make(map[string]any, len(r.Fields()))
	known := 0
	for _, f := range r.Fields() {
		fp := joinPath(path, f.Name())
		val, present := m[f.Name()]
		if present {
			known++
		} else {
			if !f.HasDefault() {
				return nil, mismatchf(fp, "missing, and the field has no default")
			}
			x, err := avroDefault(f.Type(), f.Default(), fp)
			if err != nil {
				return nil, err
			}
			out[f.Name()] = x
			continue
		}
		x, err := avroNative(f.Type(), val, fp)
		if err != nil {
			return nil, err
		}
		out[f.Name()] = x
	}
	if len(m) > known {
		unknown := make([]string, 0, len(m)-known)
		for k := range m {
			if _, ok := out[k]; !ok {
				unknown = append(unknown, k)
			}
		}
		sort.Strings(unknown)
		return nil, mismatchf(joinPath(path, unknown[0]), "unknown field: record %s has no such field", r.FullName())
	}
	return out, nil
}

// avroDefault converts a field's default (as hamba parsed it) to its native
// value; a union's default belongs to its first branch.
func avroDefault(s avro.Schema, def any, path string) (any, error) {
	s = deref(s)
	if u, ok := s.(*avro.UnionSchema); ok {
		first := u.Types()[0]
		x, err := avroDefault(first, def, path)
		if err != nil {
			return nil, err
		}
		if deref(first).Type() == avro.Null {
			return map[string]any(nil), nil
		}
		return map[string]any{unionName(first): x}, nil
	}
	if d, ok := logicalSchema(s).(*avro.DecimalLogicalSchema); ok {
		if b, ok := defaultBytes(def); ok { // the unscaled two's complement
			n := new(big.Int).SetBytes(b)
			if len(b) > 0 && b[0]&0x80 != 0 {
				n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
			}
			return new(big.Rat).SetFrac(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil)), nil
		}
	}
	x, err := avroNative(s, defaultJSON(def), path)
	if err != nil {
		return nil, fmt.Errorf("default: %w", err)
	}
	return x, nil
}

func defaultBytes(def any) ([]byte, bool) {
	switch x := def.(type) {
	case []byte:
		return x, true
	case string:
		b, err := latin1(x, "")
		return b, err == nil
	}
	rv := reflect.ValueOf(def)
	if rv.Kind() == reflect.Array && rv.Type().Elem().Kind() == reflect.Uint8 {
		b := make([]byte, rv.Len())
		reflect.Copy(reflect.ValueOf(b), rv)
		return b, true
	}
	return nil, false
}

// defaultJSON brings a default parsed by hamba back to the shapes of a
// payload decoded with UseNumber (bytes and fixed as code points 0-255):
// the converter then treats both alike.
func defaultJSON(def any) any {
	switch x := def.(type) {
	case nil, bool, string:
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, v := range x {
			out[k] = defaultJSON(v)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, v := range x {
			out[i] = defaultJSON(v)
		}
		return out
	}
	if b, ok := defaultBytes(def); ok {
		return latin1String(b)
	}
	b, err := json.Marshal(def)
	if err != nil {
		return def
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return def
	}
	return v
}

func avroUnion(u *avro.UnionSchema, v any, path string) (any, error) {
	types := u.Types()
	if v == nil {
		for _, t := range types {
			if deref(t).Type() == avro.Null {
				return map[string]any(nil), nil
			}
		}
		return nil, mismatchf(path, "null is not allowed (union %s)", unionList(types))
	}
	// Avro's JSON form: {"<branch name>": value}.
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k, inner := range m {
			for _, t := range types {
				if jsonName(t) == k || unionName(t) == k {
					x, err := avroNative(t, inner, path)
					if err != nil {
						return nil, err
					}
					if deref(t).Type() == avro.Null {
						return map[string]any(nil), nil
					}
					return map[string]any{unionName(t): x}, nil
				}
			}
		}
	}
	// A plain value: exactly one branch must take it.
	var (
		found   avro.Schema
		value   any
		fits    []string
		lastErr error
	)
	for _, t := range types {
		if deref(t).Type() == avro.Null {
			continue
		}
		x, err := avroNative(t, v, path)
		if err != nil {
			lastErr = err
			continue
		}
		fits = append(fits, jsonName(t))
		found, value = t, x
	}
	switch len(fits) {
	case 1:
		return map[string]any{unionName(found): value}, nil
	case 0:
		if nonNull := countNonNull(types); nonNull == 1 && lastErr != nil {
			return nil, lastErr // the one branch's own words
		}
		return nil, mismatchf(path, "%s fits no branch of union %s", describe(v), unionList(types))
	default:
		return nil, mismatchf(path, "%s fits several branches of union %s (%s): write it as {%q: value}",
			describe(v), unionList(types), strings.Join(fits, ", "), fits[0])
	}
}

func countNonNull(types []avro.Schema) int {
	n := 0
	for _, t := range types {
		if deref(t).Type() != avro.Null {
			n++
		}
	}
	return n
}

func unionList(types []avro.Schema) string {
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = jsonName(t)
	}
	return "[" + strings.Join(names, ",") + "]"
}

// decode turns Avro binary back into JSON: unions as the plain value when
// the union has one non-null branch, else Avro's {"<branch>": value} form;
// bytes and fixed as code points 0-255; decimals as strings; timestamps as
// RFC 3339; so that encode(decode(x)) gives x back.
func (c *avroCodec) decode(data []byte) ([]byte, error) {
	var v any
	if err := avro.Unmarshal(c.schema, data, &v); err != nil {
		return nil, fmt.Errorf("decode Avro: %w", err)
	}
	j, err := avroJSON(c.schema, v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(j)
}

func avroJSON(s avro.Schema, v any) (any, error) {
	s = deref(s)
	switch x := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		return latin1String(x), nil
	case *big.Rat:
		scale := 0
		if d, ok := logicalSchema(s).(*avro.DecimalLogicalSchema); ok {
			scale = d.Scale()
		}
		return json.Number(x.FloatString(scale)), nil
	case time.Time:
		if logicalOf(s) == avro.Date {
			return x.UTC().Format(time.DateOnly), nil
		}
		return x.UTC().Format(time.RFC3339Nano), nil
	case time.Duration:
		if logicalOf(s) == avro.TimeMillis {
			return x.Milliseconds(), nil
		}
		return x.Microseconds(), nil
	}
	switch s.Type() {
	case avro.Fixed:
		rv := reflect.ValueOf(v)
		if rv.Kind() == reflect.Array {
			b := make([]byte, rv.Len())
			reflect.Copy(reflect.ValueOf(b), rv)
			return latin1String(b), nil
		}
	case avro.Array:
		a, _ := v.([]any)
		out := make([]any, len(a))
		for i := range a {
			y, err := avroJSON(s.(*avro.ArraySchema).Items(), a[i])
			if err != nil {
				return nil, err
			}
			out[i] = y
		}
		return out, nil
	case avro.Map:
		m, _ := v.(map[string]any)
		out := make(map[string]any, len(m))
		for k, item := range m {
			y, err := avroJSON(s.(*avro.MapSchema).Values(), item)
			if err != nil {
				return nil, err
			}
			out[k] = y
		}
		return out, nil
	case avro.Record, avro.Error:
		m, _ := v.(map[string]any)
		out := make(map[string]any, len(m))
		for _, f := range s.(*avro.RecordSchema).Fields() {
			y, err := avroJSON(f.Type(), m[f.Name()])
			if err != nil {
				return nil, err
			}
			out[f.Name()] = y
		}
		return out, nil
	case avro.Union:
		u := s.(*avro.UnionSchema)
		t, inner := unionBranch(u, v)
		if t == nil {
			return nil, fmt.Errorf("decode Avro: no branch of union %s holds a %T", unionList(u.Types()), v)
		}
		y, err := avroJSON(t, inner)
		if err != nil {
			return nil, err
		}
		if countNonNull(u.Types()) == 1 {
			return y, nil
		}
		return map[string]any{jsonName(t): y}, nil
	}
	return v, nil
}

// unionBranch finds the branch hamba decoded v from: named types come
// wrapped as {"<full name>": value}, the others as the bare Go value.
func unionBranch(u *avro.UnionSchema, v any) (avro.Schema, any) {
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k, inner := range m {
			if t, _ := u.Types().Get(k); t != nil {
				if _, named := deref(t).(avro.NamedSchema); named {
					return t, inner
				}
			}
		}
	}
	for _, t := range u.Types() {
		d := deref(t)
		lt := logicalOf(d)
		var fits bool
		switch v.(type) {
		case int, int32:
			fits = d.Type() == avro.Int && lt == ""
		case int64:
			fits = d.Type() == avro.Long && lt == ""
		case time.Time:
			fits = lt == avro.Date || lt == avro.TimestampMillis || lt == avro.TimestampMicros ||
				lt == avro.LocalTimestampMillis || lt == avro.LocalTimestampMicros
		case time.Duration:
			fits = lt == avro.TimeMillis || lt == avro.TimeMicros
		case *big.Rat:
			fits = lt == avro.Decimal
		case float32:
			fits = d.Type() == avro.Float
		case float64:
			fits = d.Type() == avro.Double
		case string:
			fits = d.Type() == avro.String
		case []byte:
			fits = d.Type() == avro.Bytes && lt == ""
		case bool:
			fits = d.Type() == avro.Boolean
		case []any:
			fits = d.Type() == avro.Array
		case map[string]any:
			fits = d.Type() == avro.Map
		}
		if fits {
			return t, v
		}
	}
	return nil, nil
}

func logicalSchema(s avro.Schema) avro.LogicalSchema {
	if l, ok := s.(avro.LogicalTypeSchema); ok {
		return l.Logical()
	}
	return nil
}

func latin1String(b []byte) string {
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}
