//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/replication"
)

// progress is a replication.Progress with nothing ever in flight that
// records the resets the stream asks for.
type progress struct {
	mu       sync.Mutex
	flushed  pglogrepl.LSN
	resets   []pglogrepl.LSN
	sessions []history.Now
}

func (p *progress) Session(_ context.Context, now history.Now) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sessions = append(p.sessions, now)
	return nil
}

func (p *progress) Flushed() pglogrepl.LSN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flushed
}

func (p *progress) AdvanceIdle(l pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushed = max(p.flushed, l)
}

func (p *progress) Reset(l pglogrepl.LSN) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flushed, p.resets = l, append(p.resets, l)
	return nil
}

func (p *progress) Drain(context.Context) error { return nil }
func (p *progress) Restarting() bool            { return false }
func (p *progress) Advanced() <-chan struct{}   { return nil }

// The stream reads IDENTIFY_SYSTEM on the real server and compares it with
// the history its watermark was acked on (what an earlier leadership term
// of the process saw): another system id or timeline discards the
// watermark and the session starts from the slot, with a warning naming
// both identities and outbox_relay_server_history_changes_total counted.
// One server cannot change its identity, so the earlier identity is made
// up; a real promotion is in failover_test.go.
func TestStreamResumesFromSlotOnChangedHistory(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "history")
	ctx := context.Background()
	cfg := replication.DefaultConfig()
	cfg.URL, cfg.Slot, cfg.Publication, cfg.Table = pgURL, e.Slot, e.Pub, e.Table
	var confirmed pglogrepl.LSN
	slotPos := func(t *testing.T) pglogrepl.LSN {
		t.Helper()
		var s string
		if err := e.DB.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", e.Slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// session runs one stream from prev's history with the given watermark
	// until it streams, then stops it.
	session := func(t *testing.T, prev pg.Identity, watermark pglogrepl.LSN) (*progress, pg.Identity, float64, string) {
		t.Helper()
		confirmed = slotPos(t)
		p := &progress{flushed: watermark}
		var logs bytes.Buffer
		reg := prometheus.NewRegistry()
		s, err := replication.NewStream(cfg, p, zerolog.New(&logs), replication.NewMetrics(reg))
		if err != nil {
			t.Fatal(err)
		}
		s.SetIdentity(prev)
		done := make(chan error, 1)
		go func() {
			done <- s.Run(ctx, func(context.Context, pglogrepl.LSN, []byte) error { return nil })
		}()
		waitFor(t, 30*time.Second, "the stream to stream", s.Streaming)
		s.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("run: %v\n%s", err, logs.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the stream did not stop")
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		changes := -1.0 // not registered
		for _, mf := range mfs {
			if mf.GetName() == "outbox_relay_server_history_changes_total" {
				changes = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return p, s.Identity(), changes, logs.String()
	}

	// The first session of a process: nothing to compare with.
	p, server, changes, _ := session(t, pg.Identity{}, 0)
	if server.SystemID == "" || server.Timeline < 1 {
		t.Fatalf("identity after a session: %+v", server)
	}
	if len(p.resets) != 0 || changes != 0 || p.Flushed() < confirmed {
		t.Fatalf("first session: resets %v, changes %v, flushed %s (slot at %s); want no reset, raised to the slot", p.resets, changes, p.Flushed(), confirmed)
	}
	// The session told the progress the server's history: its identity,
	// the slot's registry row, its generation raised by one per session.
	if len(p.sessions) != 1 {
		t.Fatalf("%d Session calls, want 1", len(p.sessions))
	}
	first := p.sessions[0]
	if m := first.Mark; m.SystemID != server.SystemID || m.Timeline != server.Timeline || m.Slot != e.Slot ||
		m.SlotLSN == 0 || m.Generation != first.Raised+1 || first.Confirmed != confirmed || first.ServerEnd < confirmed {
		t.Fatalf("first session's history %+v (raised %d, confirmed %s, end %s); want the server's, the slot's registry row and a raised generation",
			m, first.Raised, first.Confirmed, first.ServerEnd)
	}
	var gen int64
	if err := e.DB.QueryRow(ctx, "SELECT generation FROM "+e.Schema+".outbox_relay_slots WHERE slot_name = $1", e.Slot).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	if gen != first.Mark.Generation {
		t.Fatalf("registry generation %d, the session said %d", gen, first.Mark.Generation)
	}
	ahead := func(t *testing.T) pglogrepl.LSN { return slotPos(t) + 1<<20 }
	for _, tc := range []struct {
		name        string
		prev        pg.Identity
		watermark   func(*testing.T) pglogrepl.LSN
		wantReset   bool
		wantChanges float64
		wantLog     string
	}{
		{name: "same history, watermark behind the slot", prev: server, watermark: func(*testing.T) pglogrepl.LSN { return 1 }},
		{name: "same history, watermark ahead of the slot", prev: server, watermark: ahead, wantReset: true,
			wantLog: "behind the acked watermark"},
		{name: "new timeline", prev: pg.Identity{SystemID: server.SystemID, Timeline: server.Timeline + 1}, watermark: ahead,
			wantReset: true, wantChanges: 1, wantLog: "server history changed"},
		{name: "other system id", prev: pg.Identity{SystemID: "1", Timeline: server.Timeline}, watermark: ahead,
			wantReset: true, wantChanges: 1, wantLog: "server history changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, id, changes, log := session(t, tc.prev, tc.watermark(t))
			if id != server {
				t.Errorf("identity %v, want %v", id, server)
			}
			if changes != tc.wantChanges {
				t.Errorf("outbox_relay_server_history_changes_total %v, want %v", changes, tc.wantChanges)
			}
			if tc.wantReset && (len(p.resets) != 1 || p.resets[0] != confirmed) {
				t.Errorf("resets %v, want one to the slot's %s", p.resets, confirmed)
			}
			if !tc.wantReset && len(p.resets) != 0 {
				t.Errorf("resets %v, want none", p.resets)
			}
			if !strings.Contains(log, `"lsn":"`+confirmed.String()+`","system_id":"`+server.SystemID) {
				t.Errorf("did not start at the slot's %s:\n%s", confirmed, log)
			}
			if tc.wantLog != "" && !strings.Contains(log, tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, log)
			}
			if tc.wantChanges > 0 && (!strings.Contains(log, `"previous_system_id":"`+tc.prev.SystemID+`"`) || !strings.Contains(log, `"system_id":"`+server.SystemID+`"`)) {
				t.Errorf("the warning does not name both identities:\n%s", log)
			}
		})
	}
}
