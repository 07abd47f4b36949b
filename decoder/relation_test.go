package decoder

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Every required column must feed a role, or missingColumn would report it
// missing from every relation.
func TestRequiredColumnsHaveRoles(t *testing.T) {
	all := make([]role, len(roleNames))
	for r := range all {
		all[r] = role(r)
	}
	if m := missingColumn(all); m != "" {
		t.Fatalf("required column %q has no role", m)
	}
	for _, c := range outboxschema.RequiredColumns {
		t.Run(c, func(t *testing.T) {
			var without []role
			for r, n := range roleNames {
				if n != c {
					without = append(without, role(r))
				}
			}
			if got := missingColumn(without); got != c {
				t.Errorf("missingColumn without %s = %q, want %q", c, got, c)
			}
		})
	}
	if got := missingColumn(all[:roleHeaders]); got != "" {
		t.Errorf("headers is optional, but missingColumn reports %q", got)
	}
}
