package replication

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/standby"
)

// A handler held by the standby gate (postgres.standby_slots: the standby
// has not flushed the transaction) is like backpressure: the pinger keeps
// sending status updates every status interval, so the walsender never
// times the connection out, and they never confirm what is held. Once the
// standby flushed it, the handler returns and the keepalives the server
// sent meanwhile are answered.
func TestStreamGatedKeepsConfirming(t *testing.T) {
	const (
		wal = slotConfirmed + 0x100 // the transaction the gate holds
		end = slotConfirmed + 0x200 // the server's keepalives meanwhile
	)
	var (
		mu      sync.Mutex
		flushed = slotConfirmed // the standby slot's restart_lsn
	)
	read := func(context.Context) ([]pgsetup.StandbySlot, error) {
		mu.Lock()
		defer mu.Unlock()
		return []pgsetup.StandbySlot{{Name: "standby_1", Exists: true, Type: "physical", Active: true, Flushed: flushed}}, nil
	}
	gate := standby.New("unused", []string{"standby_1"}, zerolog.Nop(), nil)
	gctx, stop := context.WithCancel(context.Background())
	defer stop()
	go gate.RunWith(gctx, read)

	entered, released := make(chan struct{}), make(chan struct{})
	h := func(ctx context.Context, walStart pglogrepl.LSN, _ []byte) error {
		close(entered)
		defer close(released)
		return gate.Wait(ctx, walStart+0x10) // the transaction's end
	}
	p := newFakeProgress(slotConfirmed, false)
	r := startStream(t, p, 20*time.Millisecond, fixedSlot(slotConfirmed), h)
	w := r.ready(t)
	w.copyData(xlogData(wal, "x"))
	select {
	case <-entered:
	case <-time.After(testWait):
		t.Fatal("handler not called")
	}
	w.copyData(keepalive(end, true), keepalive(end, true))
	// Gated for at least 10 status intervals: every update comes from the
	// pinger (Write at the held transaction) and confirms nothing new.
	for n := 0; n < 10; {
		u := w.status(t)
		if u.Flush != slotConfirmed || u.Write > wal {
			t.Fatalf("status update %s while the gate holds the transaction at %s", u, wal)
		}
		if u.Write == wal {
			n++
		}
		select {
		case <-released:
			t.Fatal("the gate let the transaction through before the standby flushed it")
		default:
		}
	}
	mu.Lock()
	flushed = wal + 0x10
	mu.Unlock()
	select {
	case <-released:
	case <-time.After(testWait):
		t.Fatal("the gate still holds the transaction after the standby flushed it")
	}
	for {
		if u := w.status(t); u.Write == end {
			break
		}
	}
}
