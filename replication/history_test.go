package replication

import (
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/pg"
)

func TestStartFrom(t *testing.T) {
	t.Parallel()
	primary := pg.Identity{SystemID: "7340001", Timeline: 1}
	promoted := pg.Identity{SystemID: "7340001", Timeline: 2} // a replica of it, promoted
	other := pg.Identity{SystemID: "7349999", Timeline: 1}    // another cluster
	for _, tc := range []struct {
		name                 string
		prev, cur            pg.Identity
		watermark, confirmed pglogrepl.LSN
		want                 restart
	}{
		{name: "first session of the process", cur: primary, watermark: 0, confirmed: 500, want: keepWatermark},
		{name: "same server, slot caught up", prev: primary, cur: primary, watermark: 400, confirmed: 400, want: keepWatermark},
		{name: "same server, slot ahead (another leader moved it)", prev: primary, cur: primary, watermark: 400, confirmed: 900, want: keepWatermark},
		{name: "same server, slot behind (last confirmation lost, slot put back)", prev: primary, cur: primary, watermark: 900, confirmed: 400, want: slotBehind},
		{name: "unknown history, slot behind", cur: primary, watermark: 900, confirmed: 400, want: slotBehind},
		{name: "new timeline, slot behind", prev: primary, cur: promoted, watermark: 900, confirmed: 400, want: historyChanged},
		{name: "new timeline, slot ahead", prev: primary, cur: promoted, watermark: 400, confirmed: 900, want: historyChanged},
		{name: "new timeline, same position", prev: primary, cur: promoted, watermark: 400, confirmed: 400, want: historyChanged},
		{name: "timeline went back (old primary again)", prev: promoted, cur: primary, watermark: 900, confirmed: 400, want: historyChanged},
		{name: "other system id, same timeline", prev: primary, cur: other, watermark: 900, confirmed: 400, want: historyChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, got := startFrom(tc.prev, tc.cur, tc.watermark, tc.confirmed)
			if got != tc.want {
				t.Errorf("startFrom(%v, %v, %s, %s) = %v, want %v", tc.prev, tc.cur, tc.watermark, tc.confirmed, got, tc.want)
			}
			// Whatever the reason, the server's confirmed position: starting
			// anywhere after it would skip what the server's history holds there.
			if start != tc.confirmed {
				t.Errorf("start %s, want the slot's confirmed position %s", start, tc.confirmed)
			}
		})
	}
}
