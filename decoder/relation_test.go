package decoder

import (
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// The default mapping reads exactly the relay's own required columns, so a
// table made by migrate is read as before the mapping existed.
func TestDefaultMappingReadsRequiredColumns(t *testing.T) {
	tm := newTableMap(outboxschema.DefaultMapping(outboxschema.Table{Schema: "public", Name: "outbox"}))
	for _, c := range outboxschema.RequiredColumns {
		if !slices.Contains(tm.cols[:], c) {
			t.Errorf("required column %q is not mapped by DefaultMapping", c)
		}
	}
	if tm.cols[roleHeaders] != outboxschema.ColHeaders {
		t.Errorf("headers column = %q, want %q", tm.cols[roleHeaders], outboxschema.ColHeaders)
	}
}
