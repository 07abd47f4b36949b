package exactlyonce

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"
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
		{"ours", `{"slot":"s","system_id":"sys","commit_lsn":"0/16B3748","end_lsn":"0/16B3780"}`, "", 0x16B3748},
		{"another server", `{"slot":"s","system_id":"other","commit_lsn":"0/16B3748","end_lsn":"0/16B3780"}`, "system_id other", 0},
		{"another slot", `{"slot":"billing","system_id":"sys","commit_lsn":"0/16B3748","end_lsn":"0/16B3780"}`, "written for slot billing, and this relay reads slot s", 0},
		{"not JSON", `{`, "not valid JSON", 0},
		{"bad LSN", `{"slot":"s","system_id":"sys","commit_lsn":"x","end_lsn":"0/16B3780"}`, "invalid LSNs", 0},
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
				if e.SkipThrough() != 0 {
					t.Fatalf("a refused checkpoint raised the skip filter to %s", e.SkipThrough())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.SkipThrough() != tc.skip {
				t.Fatalf("skip filter at %s, want %s", e.SkipThrough(), tc.skip)
			}
		})
	}
}
