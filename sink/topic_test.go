package sink

import "testing"

func TestTemplateBadLiteralFailsAtParse(t *testing.T) {
	for _, tmpl := range []string{"bad topic.{aggregate_type}", "{event_type}/x"} {
		if _, err := ParseTemplate(tmpl); err == nil {
			t.Errorf("ParseTemplate(%q) accepted a template that can never render a valid topic", tmpl)
		}
	}
}

func TestTemplateUses(t *testing.T) {
	tests := []struct {
		tmpl     string
		agg, evt bool
	}{
		{"outbox.event.{aggregate_type}", true, false},
		{"{aggregate_type}.{event_type}", true, true},
		{"events.{event_type}", false, true},
		{"{schema}.{table}", false, false},
		{"fixed", false, false},
	}
	for _, tt := range tests {
		tmpl, err := ParseTemplate(tt.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if agg, evt := tmpl.Uses(); agg != tt.agg || evt != tt.evt {
			t.Errorf("%q.Uses() = %v, %v, want %v, %v", tt.tmpl, agg, evt, tt.agg, tt.evt)
		}
	}
}
