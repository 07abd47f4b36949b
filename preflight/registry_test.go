package preflight

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/serialize"
)

func TestRegistryChecks(t *testing.T) {
	cfg := serialize.RegistryConfig{URL: "http://reg:8081", Schemas: map[string]string{"filed-value": "/s.avsc"}}
	tests := []struct {
		name  string
		facts RegistryFacts
		want  map[string]report.Verdict // check name -> verdict
		words []string
	}{
		{"unused", RegistryFacts{}, map[string]report.Verdict{}, nil},
		{"unreachable", RegistryFacts{Used: true, URL: "http://reg:8081", Err: "connection refused"},
			map[string]report.Verdict{"schema_registry": Fail}, []string{"connection refused", "events wait"}},
		{"all registered", RegistryFacts{Used: true, URL: "http://reg:8081", Subjects: map[string]bool{"orders-value": true},
			Topics: map[string]string{"orders": "orders-value", "filed": "filed-value"}},
			map[string]report.Verdict{"schema_registry": OK, "schema_registry.subjects": OK}, []string{"1 subjects", "2 topics"}},
		{"one missing", RegistryFacts{Used: true, URL: "http://reg:8081", Subjects: map[string]bool{"orders-value": true},
			Topics: map[string]string{"orders": "orders-value", "payments": "payments-value"}},
			map[string]report.Verdict{"schema_registry": OK, "schema_registry.subjects": Warn}, []string{"payments-value (topic payments)", "schema_mismatch"}},
		{"per event", RegistryFacts{Used: true, URL: "http://reg:8081", Subjects: map[string]bool{}, Topics: map[string]string{"orders": ""}},
			map[string]report.Verdict{"schema_registry": OK, "schema_registry.subjects": OK}, []string{"per event"}},
		{"no topic yet", RegistryFacts{Used: true, URL: "http://reg:8081", Subjects: map[string]bool{}},
			map[string]report.Verdict{"schema_registry": OK, "schema_registry.subjects": Skip}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := opts()
			o.Registry = &RegistryOptions{Config: cfg, Format: func(string) string { return serialize.Avro }}
			got := map[string]report.Verdict{}
			var text strings.Builder
			registryChecks(tt.facts, o, func(name string, v report.Verdict, value, fix string) {
				got[name] = v
				text.WriteString(value + " " + fix + "\n")
			})
			if len(got) != len(tt.want) {
				t.Errorf("checks %v, want %v", got, tt.want)
			}
			for n, v := range tt.want {
				if got[n] != v {
					t.Errorf("%s = %s, want %s (all: %v)", n, got[n], v, got)
				}
			}
			for _, w := range tt.words {
				if !strings.Contains(text.String(), w) {
					t.Errorf("report does not say %q:\n%s", w, text.String())
				}
			}
		})
	}
}
