package pgsetup

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/pg"
)

func TestMissingSlotCause(t *testing.T) {
	t.Parallel()
	// One cluster: its primary on timeline 1, a standby promoted to 2.
	primary, promoted := pg.Identity{SystemID: "7340001", Timeline: 1}, pg.Identity{SystemID: "7340001", Timeline: 2}
	for _, tc := range []struct {
		name      string
		prev, cur pg.Identity
		want      string
	}{
		{name: "streamed on the old primary, now on the promoted standby", prev: primary, cur: promoted,
			want: "the server history changed since the relay last streamed, from system 7340001 timeline 1 to system 7340001 timeline 2: a failover"},
		{name: "a fresh process on a promoted server", cur: promoted, want: "lost in a failover: this server is on system 7340001 timeline 2, so it was promoted"},
		{name: "same history, never promoted", prev: primary, cur: primary, want: "dropped: this server is on system 7340001 timeline 1, it was never promoted"},
		{name: "a fresh process, never promoted", cur: primary, want: "dropped: this server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := missingSlotCause(tc.prev, tc.cur); !strings.Contains(got, tc.want) {
				t.Errorf("missingSlotCause(%v, %v) = %q, want it to contain %q", tc.prev, tc.cur, got, tc.want)
			}
		})
	}
}
