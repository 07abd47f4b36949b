package pgsetup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestXidHolderString(t *testing.T) {
	tests := []struct {
		name string
		h    XidHolder
		want []string
	}{
		{"prepared", XidHolder{Prepared: true, GID: "it's 1", User: "app", Database: "shop", Age: 83*time.Second + 400*time.Millisecond, AgeKnown: true},
			[]string{"prepared transaction 'it''s 1' (database shop, owner app, prepared 1m23s ago): COMMIT PREPARED 'it''s 1' or ROLLBACK PREPARED 'it''s 1', connected to database shop"}},
		{"session", XidHolder{PID: 4242, User: "app", Database: "shop", App: "psql", State: "idle in transaction", Query: `UPDATE t SET x = "y"`, Age: 2 * time.Minute, AgeKnown: true},
			[]string{`session pid 4242 (user app, database shop, application "psql", idle in transaction, transaction open 2m0s, query "UPDATE t SET x = \"y\""): finish or terminate pid 4242: SELECT pg_terminate_backend(4242)`}},
		{"hidden session", XidHolder{PID: 7, User: "other", Database: "shop"},
			[]string{"session pid 7 (user other, database shop; its transaction is hidden from this role: GRANT pg_read_all_stats", "SELECT pg_terminate_backend(7)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.h.String()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("got  %s\nwant %s", got, w)
				}
			}
		})
	}
}

func TestBlocking(t *testing.T) {
	hs := []XidHolder{
		{Prepared: true, GID: "fresh", AgeKnown: true, Age: time.Second},
		{PID: 1, AgeKnown: true, Age: 2 * time.Second},
		{PID: 2, AgeKnown: true, Age: 4 * time.Second},
		{PID: 3, AgeKnown: true, Age: 10 * time.Minute},
		{PID: 4}, // hidden
	}
	tests := []struct {
		waited time.Duration
		want   string
	}{
		// At the first report: sessions open since before the creation began.
		{3 * time.Second, "fresh 2 3 4"},
		// Later: those open slotWaitEvery or more, whenever they began.
		{time.Minute, "fresh 3 4"},
		{0, "fresh 1 2 3 4"},
	}
	for _, tc := range tests {
		var got []string
		for _, h := range blocking(hs, tc.waited) {
			if h.Prepared {
				got = append(got, h.GID)
			} else {
				got = append(got, fmt.Sprint(h.PID))
			}
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("waited %s: got %q, want %q", tc.waited, g, tc.want)
		}
	}
}

func TestListXidHoldersBounded(t *testing.T) {
	var hs []XidHolder
	for i := range 13 {
		hs = append(hs, XidHolder{Prepared: true, GID: fmt.Sprint("g", i), AgeKnown: true})
	}
	got := ListXidHolders(hs, XidHolder.Describe)
	if !strings.Contains(got, "'g9'") || strings.Contains(got, "'g10'") || !strings.HasSuffix(got, "; and 3 more (SELECT * FROM pg_prepared_xacts; SELECT * FROM pg_stat_activity WHERE backend_xid IS NOT NULL)") {
		t.Errorf("got %s", got)
	}
	if got := ListXidHolders(hs[:1], XidHolder.Fix); got != "COMMIT PREPARED 'g0' or ROLLBACK PREPARED 'g0', connected to database " {
		t.Errorf("got %s", got)
	}
}

// A creation given up says what it waited for: the last report, or where
// to look before the first.
func TestSlotWatchGaveUp(t *testing.T) {
	w := &slotWatch{slot: "s", start: time.Now().Add(-12 * time.Second)}
	err := w.gaveUp(fmt.Errorf("read: %w", context.Canceled))
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), `create slot "s": gave up after 12s, waiting for the transactions holding an xid to end (see pg_prepared_xacts`) {
		t.Errorf("before a report: %v", err)
	}
	w.last, w.at = waitWhy([]XidHolder{{Prepared: true, GID: "g1", Database: "d", User: "u", Age: time.Hour, AgeKnown: true}}), 8*time.Second
	err = w.gaveUp(context.Canceled)
	for _, want := range []string{`create slot "s": gave up after 12s: a new logical slot is ready only once every transaction holding an xid`,
		"in every database of the cluster; holding one now: prepared transaction 'g1' (database d, owner u, prepared 1h0m0s ago): COMMIT PREPARED 'g1' or ROLLBACK PREPARED 'g1'",
		"(as read at 8s): context canceled"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("after a report: %v\nwant %s", err, want)
		}
	}
	if got := waitWhy(nil); !strings.Contains(got, "none has held one for long now") {
		t.Errorf("no holder: %s", got)
	}
}
