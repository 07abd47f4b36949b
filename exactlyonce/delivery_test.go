package exactlyonce

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/history"
)

// checkpointOnly is a producer that opens and answers ReadCheckpoint with
// value; the start path calls nothing else.
type checkpointOnly struct {
	Producer // nil: any other call panics
	key      string
	value    []byte
	opened   bool
}

func (c *checkpointOnly) CheckTopic(string) error    { return nil }
func (c *checkpointOnly) Open(context.Context) error { c.opened = true; return nil }
func (c *checkpointOnly) Opened() bool               { return c.opened }
func (c *checkpointOnly) Close()                     { c.opened = false }
func (c *checkpointOnly) ReadCheckpoint(_ context.Context, _ string, key []byte) ([]byte, error) {
	if string(key) != c.key {
		return nil, nil
	}
	return c.value, nil
}

// A checkpoint written for another PostgreSQL server (another system_id)
// or another slot (a transactional id shared by two slots) is refused at
// start with the fix, and the skip filter stays where it was; a valid one
// raises it.
func TestCheckpointOnStart(t *testing.T) {
	cases := []struct {
		name, value string
		err         string
		skip        pglogrepl.LSN
	}{
		{"none", "", "", 0},
		{"ours, written before the history fields", `{"slot":"s","system_id":"sys","commit_lsn":"0/16B3748","end_lsn":"0/16B3780"}`, "", 0x16B3748},
		{"ours, with its history", `{"slot":"s","system_id":"sys","timeline":2,"slot_lsn":"0/1000","slot_xid":740,"generation":9,"commit_lsn":"0/16B3748","end_lsn":"0/16B3780","xid":801,"commit_time":"2026-12-05T01:02:03.000004Z"}`, "", 0x16B3748},
		{"another server", `{"slot":"s","system_id":"other","commit_lsn":"0/16B3748","end_lsn":"0/16B3780"}`, "system_id other", 0},
		{"another slot", `{"slot":"billing","system_id":"sys","commit_lsn":"0/16B3748","end_lsn":"0/16B3780"}`, "written for slot billing, and this relay reads slot s", 0},
		{"not JSON", `{`, "not valid", 0},
		{"bad LSN", `{"slot":"s","system_id":"sys","commit_lsn":"x","end_lsn":"0/16B3780"}`, `commit_lsn "x"`, 0},
		{"bad commit time", `{"slot":"s","system_id":"sys","commit_lsn":"0/1","end_lsn":"0/2","commit_time":"yesterday"}`, `commit_time "yesterday"`, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			p := &checkpointOnly{key: cfg.ID("s")}
			if tc.value != "" {
				p.value = []byte(tc.value)
			}
			e := NewWith(cfg, p, Options{Slot: "s", MaxEvents: 10, MaxBytes: 1 << 20, Log: zerolog.Nop(),
				SystemID: func(context.Context) (string, error) { return "sys", nil }})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := e.start(ctx)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "exactly_once.") {
					t.Fatalf("start = %v, want an error with %q naming the key", err, tc.err)
				}
				if e.keptOK {
					t.Fatalf("a refused checkpoint was kept: %+v", e.kept)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			close(e.ready) // Run's doing, after start
			p2, ok, err := e.Kept(ctx, history.Mark{SystemID: "sys", Slot: "s"})
			if err != nil || ok != (tc.skip != 0) || p2.CommitLSN != tc.skip {
				t.Fatalf("Kept = %+v, %v, %v; want commit %s", p2, ok, err, tc.skip)
			}
			if ok {
				// What the record says comes back as written.
				if back := checkpointOf(p2); back.CommitLSN != p2.CommitLSN.String() {
					t.Fatalf("checkpointOf(%+v) = %+v", p2, back)
				}
				if strings.Contains(tc.value, "commit_time") && (p2.Xid != 801 || p2.Mark.Generation != 9 || p2.Mark.SlotLSN != 0x1000 ||
					p2.Mark.Timeline != 2 || p2.CommitTime.Nanosecond() != 4000) {
					t.Fatalf("history fields lost: %+v", p2)
				}
			}
		})
	}
}
