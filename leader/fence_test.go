package leader

import (
	"strings"
	"testing"
)

// canFence follows pg_terminate_backend's rule: a superuser ends any
// backend; anyone else only non-superuser backends, of a role whose
// privileges it has or, with pg_signal_backend, of any role.
func TestCanFence(t *testing.T) {
	holder := func(role string, super, privs bool) privileges {
		return privileges{Role: "me", RoleSQL: "me", HolderPID: 42, HolderRole: role, HolderSuper: super, HolderPrivs: privs}
	}
	with := func(p privileges, f func(*privileges)) privileges { f(&p); return p }
	tests := []struct {
		name string
		p    privileges
		ok   bool
		want []string // in the problem
	}{
		{"superuser, superuser holder", with(holder("root", true, true), func(p *privileges) { p.Super = true }), true, nil},
		{"superuser, no holder", privileges{Role: "me", Super: true}, true, nil},
		{"same role as the holder", holder("me", false, true), true, nil},
		{"member of the holder's role", holder("relays", false, true), true, nil},
		{"pg_signal_backend, other role", with(holder("other", false, false), func(p *privileges) { p.SignalBackend = true }), true, nil},
		{"no holder to check against", privileges{Role: "me", RoleSQL: "me"}, true, nil},
		{"other role, no pg_signal_backend", holder("other", false, false), false,
			[]string{"cannot fence a stalled leader", "pid 42, role other", "GRANT pg_signal_backend TO me"}},
		{"superuser holder, pg_signal_backend", with(holder("postgres", true, false), func(p *privileges) { p.SignalBackend = true }), false,
			[]string{"superuser postgres", "only a superuser", "same non-superuser role"}},
		{"superuser holder, member of it", holder("postgres", true, true), false, []string{"superuser postgres"}},
		{"quoted role in the GRANT", with(holder("other", false, false), func(p *privileges) { p.Role, p.RoleSQL = "Relay", `"Relay"` }), false,
			[]string{`GRANT pg_signal_backend TO "Relay"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, problem := tt.p.canFence()
			if ok != tt.ok {
				t.Fatalf("canFence = %v (%q), want %v", ok, problem, tt.ok)
			}
			if ok && problem != "" {
				t.Errorf("able to fence, yet a problem: %q", problem)
			}
			for _, w := range tt.want {
				if !strings.Contains(problem, w) {
					t.Errorf("problem %q lacks %q", problem, w)
				}
			}
		})
	}
}
