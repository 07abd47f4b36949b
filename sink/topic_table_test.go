package sink

import (
	"strings"
	"testing"
)

func TestTemplateForTable(t *testing.T) {
	tests := []struct {
		tmpl, schema, table string
		agg                 string
		want, err           string
	}{
		{tmpl: "{schema}.{table}.{aggregate_type}", schema: "billing", table: "outbox", agg: "inv", want: "billing.outbox.inv"},
		{tmpl: "{schema}.events", schema: "billing", table: "outbox", want: "billing.events"}, // fixed after ForTable
		{tmpl: "outbox.event.{aggregate_type}", schema: "s", table: "t", agg: "order", want: "outbox.event.order"},
		{tmpl: "{schema}.x", schema: "a$b", table: "t", err: `has character '$'`},
		{tmpl: "{table}", schema: "s", table: strings.Repeat("t", 250), err: "longer than 249"},
	}
	for _, tt := range tests {
		base, err := ParseTemplate(tt.tmpl)
		if err != nil {
			t.Fatalf("%s: %v", tt.tmpl, err)
		}
		got, err := base.ForTable(tt.schema, tt.table)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s for %s.%s: err %v, want %q", tt.tmpl, tt.schema, tt.table, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.tmpl, err)
		}
		if topic, err := got.Render(tt.agg, "e"); err != nil || topic != tt.want {
			t.Errorf("%s for %s.%s: %q %v, want %q", tt.tmpl, tt.schema, tt.table, topic, err, tt.want)
		}
	}
	// Not replaced: {schema} and {table} render empty (an event with no table).
	base, _ := ParseTemplate("x.{schema}{table}.{aggregate_type}")
	if topic, err := base.Render("a", "e"); err != nil || topic != "x..a" {
		t.Errorf("unreplaced placeholders: %q %v", topic, err)
	}
}
