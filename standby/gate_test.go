package standby

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// fakeSlots is the poll source: what pg_replication_slots says now.
type fakeSlots struct {
	mu    sync.Mutex
	slots []pgsetup.StandbySlot
	err   error
	polls atomic.Int64
}

func (f *fakeSlots) set(slots []pgsetup.StandbySlot, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slots, f.err = slots, err
}

func (f *fakeSlots) read(context.Context) ([]pgsetup.StandbySlot, error) {
	f.polls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]pgsetup.StandbySlot(nil), f.slots...), f.err
}

// lockedBuf is a log sink safe for the poller's goroutine.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testGate runs a gate over src; skew moves its clock forward.
type testGate struct {
	*Gate
	src  *fakeSlots
	log  *lockedBuf
	skew atomic.Int64
}

func startGate(t *testing.T, names []string, slots []pgsetup.StandbySlot, err error) *testGate {
	t.Helper()
	tg := &testGate{src: &fakeSlots{}, log: &lockedBuf{}}
	tg.src.set(slots, err)
	tg.Gate = New("unused", names, zerolog.New(tg.log), nil)
	tg.now = func() time.Time { return time.Now().Add(time.Duration(tg.skew.Load())) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tg.RunWith(ctx, tg.src.read)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return tg
}

func phys(name string, flushed pglogrepl.LSN, active bool) pgsetup.StandbySlot {
	return pgsetup.StandbySlot{Name: name, Exists: true, Type: "physical", Active: active, Flushed: flushed, RestartLSN: flushed.String()}
}

// wait runs Wait in the background; its error arrives on the channel.
func (tg *testGate) wait(ctx context.Context, lsn pglogrepl.LSN) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- tg.Wait(ctx, lsn) }()
	return ch
}

const (
	want  = pglogrepl.LSN(0x1000)
	ahead = want + 0x10
	below = want - 0x10
)

func TestGateWait(t *testing.T) {
	logical := phys("s1", ahead, true)
	logical.Type = "logical"
	lost := phys("s1", ahead, true)
	lost.WALStatus = "lost"
	tests := []struct {
		name    string
		names   []string
		slots   []pgsetup.StandbySlot
		pollErr error
		blocks  bool
		release []pgsetup.StandbySlot // what lets a blocked Wait through
	}{
		{name: "ahead", names: []string{"s1"}, slots: []pgsetup.StandbySlot{phys("s1", ahead, true)}},
		{name: "exactly at the end", names: []string{"s1"}, slots: []pgsetup.StandbySlot{phys("s1", want, true)}},
		{name: "inactive but flushed past it", names: []string{"s1"}, slots: []pgsetup.StandbySlot{phys("s1", ahead, false)}},
		{name: "behind", names: []string{"s1"}, slots: []pgsetup.StandbySlot{phys("s1", below, true)},
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", want, true)}},
		{name: "no standby has reported", names: []string{"s1"}, slots: []pgsetup.StandbySlot{phys("s1", 0, true)},
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", ahead, true)}},
		{name: "one of two behind", names: []string{"s1", "s2"}, slots: []pgsetup.StandbySlot{phys("s1", ahead, true), phys("s2", below, true)},
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", ahead, true), phys("s2", ahead, true)}},
		{name: "inactive and behind", names: []string{"s1"}, slots: []pgsetup.StandbySlot{phys("s1", below, false)},
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", ahead, true)}},
		{name: "missing", names: []string{"s1"}, slots: []pgsetup.StandbySlot{{Name: "s1"}},
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", ahead, true)}},
		{name: "logical", names: []string{"s1"}, slots: []pgsetup.StandbySlot{logical},
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", ahead, true)}},
		{name: "invalidated", names: []string{"s1"}, slots: []pgsetup.StandbySlot{lost},
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", ahead, true)}},
		{name: "polls fail", names: []string{"s1"}, pollErr: errors.New("connection refused"),
			blocks: true, release: []pgsetup.StandbySlot{phys("s1", ahead, true)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tg := startGate(t, tt.names, tt.slots, tt.pollErr)
			done := tg.wait(context.Background(), want)
			if !tt.blocks {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("Wait: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("Wait blocked although every slot flushed the transaction")
				}
				return
			}
			// Several fast polls see the same state: still waiting.
			n := tg.src.polls.Load()
			for tg.src.polls.Load() < n+5 {
				time.Sleep(time.Millisecond)
			}
			select {
			case err := <-done:
				t.Fatalf("Wait returned (%v) while a slot had not flushed LSN %s", err, want)
			default:
			}
			tg.src.set(tt.release, nil)
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Wait: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Wait still blocked after every slot flushed the transaction")
			}
		})
	}
}

// The end of ctx ends a Wait with an error naming the slots and the LSN.
func TestGateWaitContext(t *testing.T) {
	tg := startGate(t, []string{"s1"}, []pgsetup.StandbySlot{phys("s1", below, true)}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := tg.wait(ctx, want)
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "s1") || !strings.Contains(err.Error(), want.String()) {
			t.Fatalf("Wait = %v, want context.Canceled naming slot s1 and LSN %s", err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after its ctx ended")
	}
}

// A Wait blocked StallAfter, and a slot with a problem that long, make the
// gate not ready and are logged with the fix; once through, it is ready.
func TestGateStall(t *testing.T) {
	tests := []struct {
		name   string
		slot   pgsetup.StandbySlot
		reason []string // substrings of Ready's reason
		log    []string // substrings of the log
	}{
		{"behind", phys("s1", below, true), []string{"waiting", "s1", want.String()},
			[]string{"not publishing", `slot \"s1\" active`, "the standby is behind"}},
		{"inactive", phys("s1", below, false), []string{"s1", "inactive"},
			[]string{"inactive", "start the standby that streams from it (primary_slot_name = 's1')", "OUTBOX_RELAY_STANDBY_SLOTS"}},
		{"missing", pgsetup.StandbySlot{Name: "s1"}, []string{`slot "s1" does not exist`},
			[]string{"pg_create_physical_replication_slot('s1')"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tg := startGate(t, []string{"s1"}, []pgsetup.StandbySlot{tt.slot}, nil)
			done := tg.wait(context.Background(), want)
			for tg.src.polls.Load() < 2 {
				time.Sleep(time.Millisecond)
			}
			if ok, why := tg.Ready(); !ok {
				t.Fatalf("not ready before StallAfter: %s", why)
			}
			tg.skew.Store(int64(StallAfter + time.Second))
			ok, why := tg.Ready()
			for _, w := range tt.reason {
				if ok || !strings.Contains(why, w) {
					t.Errorf("Ready = %v %q, want not ready naming %q", ok, why, w)
				}
			}
			n := tg.src.polls.Load()
			for tg.src.polls.Load() < n+2 {
				time.Sleep(time.Millisecond)
			}
			for _, w := range tt.log {
				if !strings.Contains(tg.log.String(), w) {
					t.Errorf("log lacks %q:\n%s", w, tg.log.String())
				}
			}
			tg.src.set([]pgsetup.StandbySlot{phys("s1", ahead, true)}, nil)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			for tg.src.polls.Load() < n+4 {
				time.Sleep(time.Millisecond)
			}
			if ok, why := tg.Ready(); !ok {
				t.Errorf("still not ready once the standby caught up: %s", why)
			}
		})
	}
}

// While nothing waits the gate polls every IdlePoll, not every FastPoll;
// a Wait makes it poll at once.
func TestGateIdle(t *testing.T) {
	tg := startGate(t, []string{"s1"}, []pgsetup.StandbySlot{phys("s1", below, true)}, nil)
	time.Sleep(100 * time.Millisecond)
	if n := tg.src.polls.Load(); n > 2 {
		t.Fatalf("%d polls in 100ms while idle, want 1", n)
	}
	start := time.Now()
	tg.src.set([]pgsetup.StandbySlot{phys("s1", ahead, true)}, nil)
	if err := tg.Wait(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > IdlePoll/2 {
		t.Fatalf("Wait took %s: the poll it needs did not start at once", d)
	}
}

func TestCovered(t *testing.T) {
	inactive := phys("b", 0x50, false)
	tests := []struct {
		name  string
		slots []pgsetup.StandbySlot
		want  pglogrepl.LSN
	}{
		{"none", nil, 0},
		{"one", []pgsetup.StandbySlot{phys("a", 0x100, true)}, 0x100},
		{"the least", []pgsetup.StandbySlot{phys("a", 0x100, true), phys("b", 0x80, true)}, 0x80},
		{"inactive vouches for what it flushed", []pgsetup.StandbySlot{phys("a", 0x100, true), inactive}, 0x50},
		{"missing vouches for nothing", []pgsetup.StandbySlot{phys("a", 0x100, true), {Name: "b"}}, 0},
	}
	for _, tt := range tests {
		if got := Covered(tt.slots); got != tt.want {
			t.Errorf("%s: Covered = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestTxnLSN(t *testing.T) {
	tests := []struct {
		txn  decoder.Txn
		want pglogrepl.LSN
	}{
		{decoder.Txn{CommitLSN: 0x100, EndLSN: 0x130}, 0x130},
		// A chunk before the commit's end is known: past the commit record's start.
		{decoder.Txn{CommitLSN: 0x100, Partial: true}, 0x101},
	}
	for _, tt := range tests {
		if got := TxnLSN(&tt.txn); got != tt.want {
			t.Errorf("TxnLSN(%+v) = %s, want %s", tt.txn, got, tt.want)
		}
	}
}

// A transaction without events waits for nothing.
func TestGateWaitTxnEmpty(t *testing.T) {
	tg := startGate(t, []string{"s1"}, []pgsetup.StandbySlot{{Name: "s1"}}, nil)
	if err := tg.WaitTxn(context.Background(), &decoder.Txn{CommitLSN: 0x100, EndLSN: 0x130}); err != nil {
		t.Fatal(err)
	}
}
