package leader

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// With PostgreSQL down at start, the log speaks of the database (its
// host:port, never the password), not of leases and standbys: with one
// instance there is no standby, and the database is what to fix.
func TestUnreachableDatabaseMessage(t *testing.T) {
	var buf syncBuf
	e, err := New(Config{URL: "postgres://relay:pw-never-shown-7@127.0.0.1:1/outbox?connect_timeout=2", Slot: "s", Schema: "public",
		InstanceID: "i", TTL: time.Second, Renew: 100 * time.Millisecond, Poll: 50 * time.Millisecond}, zerolog.New(&buf), nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- e.Run(t.Context(), func(ctx context.Context, _ int64) error { <-ctx.Done(); return nil })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), `"level":"warn"`) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling the log with a deadline
	}
	e.Close()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	line := strings.SplitN(buf.String(), "\n", 2)[0]
	for _, want := range []string{"PostgreSQL unreachable at 127.0.0.1:1", `"db":"127.0.0.1:1"`} {
		if !strings.Contains(line, want) {
			t.Errorf("log lacks %q: %s", want, line)
		}
	}
	for _, bad := range []string{"standby", "lease", "pw-never-shown-7"} {
		if strings.Contains(line, bad) {
			t.Errorf("log says %q: %s", bad, line)
		}
	}
}

// Taking the lease and handing it over at shutdown are the normal life of
// a relay: info, so a healthy start logs no warning. Losing it is a warning.
func TestTransitionLevels(t *testing.T) {
	tests := []struct {
		role   Role
		reason string
		level  string
	}{
		{Leader, "took the lease", `"level":"info"`},
		{Standby, "shutting down", `"level":"info"`},
		{Standby, "renew lease: lease lost", `"level":"warn"`},
		{Standby, "leader stopped", `"level":"warn"`},
	}
	for _, tt := range tests {
		var buf syncBuf
		e, err := New(Config{URL: "postgres://x@127.0.0.1:1/db", Slot: "s", Schema: "public", InstanceID: "i",
			TTL: time.Second, Renew: 100 * time.Millisecond, Poll: 50 * time.Millisecond}, zerolog.New(&buf), nil)
		if err != nil {
			t.Fatal(err)
		}
		e.transition(tt.role, 1, tt.reason)
		if !strings.Contains(buf.String(), tt.level) {
			t.Errorf("%s (%s): want %s, got %s", tt.role, tt.reason, tt.level, buf.String())
		}
	}
}
