package relay

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

// With postgres.standby_slots the pipeline publishes a transaction only
// once the standby's slot is at or past its end; the transactions behind
// it wait in order.
func TestPipelineWaitsForStandby(t *testing.T) {
	var (
		mu      sync.Mutex
		flushed pglogrepl.LSN = 100
	)
	setFlushed := func(l pglogrepl.LSN) {
		mu.Lock()
		defer mu.Unlock()
		flushed = l
	}
	read := func(context.Context) ([]pgsetup.StandbySlot, error) {
		mu.Lock()
		defer mu.Unlock()
		return []pgsetup.StandbySlot{{Name: "standby_1", Exists: true, Type: "physical", Active: true, Flushed: flushed}}, nil
	}
	h := newHarness(t, fastPolicy, func(string, int) error { return nil })
	gate := standby.New("unused", []string{"standby_1"}, zerolog.Nop(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go gate.RunWith(ctx, read)
	h.p.SetStandby(gate) // before the first transaction: the stream goroutine reads it after h.in

	done := make(chan error, 2)
	go func() {
		done <- h.txn(200, 210, order("1", "order-1"))
		done <- h.txn(300, 310, order("2", "order-1"))
	}()
	sent := func() int {
		s, _ := h.pub.snapshot()
		return len(s)
	}
	time.Sleep(50 * time.Millisecond)
	if n := sent(); n != 0 {
		t.Fatalf("%d records published while the standby had flushed only to 0/64, before the transaction's end 0/D2", n)
	}
	setFlushed(209) // one byte short of the end
	time.Sleep(50 * time.Millisecond)
	if n := sent(); n != 0 {
		t.Fatalf("%d records published while the standby was one byte short of the transaction's end", n)
	}
	setFlushed(210)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := sent(); n != 1 {
		t.Fatalf("%d records published, want the first transaction's only", n)
	}
	setFlushed(400)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.waitFlushed(310)
	if n := sent(); n != 2 {
		t.Fatalf("%d records published, want 2", n)
	}
}
