//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/internal/pg"
)

// pg.Keeper on a real server: it keeps one connection while the job
// succeeds, reconnects after the server ended its backend (one outage,
// reported once, then recovered), and closes its connection when ctx
// ends. The heartbeater, lag poller, slot saver and retention cleaner all
// run on it.
func TestKeeperReconnectsAfterTerminatedBackend(t *testing.T) {
	t.Parallel() // its own connections only
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())

	type event struct {
		pid       uint32 // the job's backend; 0 for an event that is not an attempt
		failure   *pg.Failure
		recovered bool
	}
	events := make(chan event, 100)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		pg.NewKeeper(pg.KeeperConfig{
			Connect:   func(ctx context.Context) (*pgx.Conn, error) { return pg.Connect(ctx, pgURL) },
			Every:     50 * time.Millisecond,
			Retry:     backoff.Policy{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: backoff.Exact},
			Failed:    func(f pg.Failure) { events <- event{failure: &f} },
			Recovered: func() { events <- event{recovered: true} },
		}).Run(runCtx, func(ctx context.Context, conn *pgx.Conn) error {
			var pid uint32
			if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()::bigint").Scan(&pid); err != nil {
				return fmt.Errorf("read pid: %w", err)
			}
			events <- event{pid: pid}
			return nil
		})
	}()
	next := func() event {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-ctx.Done():
			t.Fatal("no event from the keeper within a minute")
			return event{}
		}
	}

	first := next()
	for i := 0; i < 3; i++ { // the connection is kept while the job succeeds
		if ev := next(); ev.pid != first.pid {
			t.Fatalf("attempt %d: %+v, want the kept connection's backend %d", i+2, ev, first.pid)
		}
	}
	var ok bool
	if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int64(first.pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate backend %d: %v %v", first.pid, ok, err)
	}
	// Attempts that raced the termination still see the old backend.
	ev := next()
	for ev.pid == first.pid {
		ev = next()
	}
	if ev.failure == nil || ev.failure.Connecting || !ev.failure.First || ev.failure.Wait != 50*time.Millisecond {
		t.Fatalf("after the backend was terminated: %+v (failure %+v), want the job's first failure, retried in 50ms", ev, ev.failure)
	}
	second := next()
	if second.pid == 0 || second.pid == first.pid {
		t.Fatalf("then %+v, want an attempt on a new backend (not %d)", second, first.pid)
	}
	if ev = next(); !ev.recovered {
		t.Fatalf("then %+v, want recovered", ev)
	}

	stop()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of ctx's end")
	}
	// Its connection is closed: the backend goes away.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(second.pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still there 10s after Run returned: the keeper did not close its connection", second.pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
