package serialize

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
)

// Any payload: the Avro converter never panics, and what it accepts hamba
// reads back and our decode turns into JSON that encodes the same way.
func FuzzAvroEncode(f *testing.F) {
	c, err := newAvroCodec(orderAvsc, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{minimal, withField("choice", `{"long":5}`), withField("amount", `"1e5"`),
		withField("items", `[{"sku":"a","qty":1}]`), withField("at", `"2024-01-01T00:00:00Z"`), `[]`, `{"id":1e400}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		// A payload must not make the converter work for long (big.Rat
		// expanding an exponent did): crash loudly, naming it.
		slow := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("payload %q takes over 5 s", payload)) })
		defer slow.Stop()
		b, err := c.encode(nil, payload)
		if err != nil {
			return
		}
		var v any
		if err := avro.Unmarshal(c.schema, b, &v); err != nil {
			t.Fatalf("hamba cannot read what %q became: %v", payload, err)
		}
		j, err := c.decode(b)
		if err != nil {
			t.Fatalf("decode of %q: %v", payload, err)
		}
		b2, err := c.encode(nil, j)
		if err != nil {
			t.Fatalf("%q decoded to %s, which does not encode: %v", payload, j, err)
		}
		if len(b2) != len(b) && !bytes.Contains(payload, []byte("attrs")) {
			t.Fatalf("%q: %d bytes, again %d", payload, len(b), len(b2))
		}
	})
}
