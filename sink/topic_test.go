package sink

import "testing"

func TestTemplateBadLiteralFailsAtParse(t *testing.T) {
	for _, tmpl := range []string{"bad topic.{aggregate_type}", "{event_type}/x"} {
		if _, err := ParseTemplate(tmpl); err == nil {
			t.Errorf("ParseTemplate(%q) accepted a template that can never render a valid topic", tmpl)
		}
	}
}
