package checkpoint

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// TestWatermarkNeverPassesUnacked acks the events of random transactions in
// random orders and checks, after every single ack, that the watermark is
// exactly the end of the longest fully acked prefix.
func TestWatermarkNeverPassesUnacked(t *testing.T) {
	t.Parallel()
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7+1))
		const start = pglogrepl.LSN(1000)
		tr := New(start, Limits{})
		clock := time.Unix(0, 0)
		tr.now = func() time.Time { clock = clock.Add(time.Second); return clock }
		ntx := 1 + rng.IntN(40)
		type ev struct{ tx int }
		var (
			pend   []*Pending
			ends   []pglogrepl.LSN // 0 for a chunk of a larger transaction
			counts []int
			added  []time.Time
			evs    []ev
		)
		lsn := start
		for i := 0; i < ntx; i++ {
			end := pglogrepl.LSN(0)
			if rng.IntN(3) > 0 { // a third are leading chunks of a transaction
				lsn += pglogrepl.LSN(1 + rng.IntN(500))
				end = lsn
			}
			n := rng.IntN(5) // zero-event transactions included
			p, err := tr.Add(context.Background(), end, n, int64(n*10))
			if err != nil {
				t.Fatalf("seed %d: add: %v", seed, err)
			}
			pend, ends, counts, added = append(pend, p), append(ends, end), append(counts, n), append(added, clock)
			for j := 0; j < n; j++ {
				evs = append(evs, ev{i})
			}
		}
		rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
		acked := make([]int, ntx)
		for k, e := range evs {
			pend[e.tx].Ack(10)
			acked[e.tx]++
			want := start
			for i := 0; i < ntx && acked[i] == counts[i]; i++ {
				if ends[i] != 0 {
					want = ends[i]
				}
			}
			if got := tr.Flushed(); got != want {
				t.Fatalf("seed %d after ack %d: watermark %s, want %s", seed, k, got, want)
			}
			// The oldest in flight is the first transaction not fully acked.
			wantOldest, wantOK := time.Time{}, false
			for i := 0; i < ntx; i++ {
				if acked[i] < counts[i] {
					wantOldest, wantOK = added[i], true
					break
				}
			}
			if got, ok := tr.Oldest(); ok != wantOK || !got.Equal(wantOldest) {
				t.Fatalf("seed %d after ack %d: oldest in flight %v (%v), want %v (%v)", seed, k, got, ok, wantOldest, wantOK)
			}
		}
		if got := tr.Flushed(); got != lsn {
			t.Fatalf("seed %d: final watermark %s, want %s", seed, got, lsn)
		}
		if e, b := tr.InFlight(); e != 0 || b != 0 {
			t.Fatalf("seed %d: in flight after all acks: %d events %d bytes", seed, e, b)
		}
	}
}

func TestConcurrentAcks(t *testing.T) {
	t.Parallel()
	tr := New(0, Limits{MaxEvents: 64})
	acks := make(chan *Pending, 1024)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range acks {
				p.Ack(1)
			}
		}()
	}
	var last pglogrepl.LSN
	for i := 1; i <= 5000; i++ {
		n := 1 + i%3
		p, err := tr.Add(context.Background(), pglogrepl.LSN(i*100), n, int64(n))
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < n; j++ {
			acks <- p
		}
		if f := tr.Flushed(); f < last {
			t.Fatalf("watermark went back from %s to %s", last, f)
		} else {
			last = f
		}
	}
	close(acks)
	wg.Wait()
	if got := tr.Flushed(); got != 500000 {
		t.Fatalf("final watermark %s, want 0/7A120", got)
	}
}

func TestAddBlocksAtLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		limits Limits
		first  [2]int64 // events, bytes
		second [2]int64
	}{
		{"events", Limits{MaxEvents: 3}, [2]int64{3, 1}, [2]int64{1, 1}},
		{"bytes", Limits{MaxBytes: 100}, [2]int64{1, 90}, [2]int64{1, 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := New(0, tt.limits)
			p, err := tr.Add(context.Background(), 10, int(tt.first[0]), tt.first[1])
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if _, err := tr.Add(ctx, 20, int(tt.second[0]), tt.second[1]); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("add over the limit: err %v, want it to block until the deadline", err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := tr.Add(context.Background(), 20, int(tt.second[0]), tt.second[1])
				done <- err
			}()
			for i := int64(0); i < tt.first[0]; i++ {
				p.Ack(tt.first[1] / tt.first[0])
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("add stayed blocked after acks freed space")
			}
		})
	}
}

func TestOversizedTransactionAdmittedWhenIdle(t *testing.T) {
	t.Parallel()
	tr := New(0, Limits{MaxEvents: 2, MaxBytes: 10})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := tr.Add(ctx, 5, 100, 1000); err != nil {
		t.Fatalf("a transaction larger than the limits must pass when nothing is in flight: %v", err)
	}
}

func TestIdleAdvance(t *testing.T) {
	t.Parallel()
	tr := New(100, Limits{})
	tr.AdvanceIdle(200)
	if got := tr.Flushed(); got != 200 {
		t.Fatalf("idle advance: %s, want 0/C8", got)
	}
	p, err := tr.Add(context.Background(), 300, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	tr.AdvanceIdle(400) // must be ignored: an event is in flight
	if got := tr.Flushed(); got != 200 {
		t.Fatalf("idle advance with an event in flight moved the watermark to %s", got)
	}
	p.Ack(1)
	if got := tr.Flushed(); got != 300 {
		t.Fatalf("after ack: %s, want 0/12C", got)
	}
	tr.AdvanceIdle(250) // never backwards
	if got := tr.Flushed(); got != 300 {
		t.Fatalf("idle advance went backwards to %s", got)
	}
}

func TestOutOfOrderAddRejected(t *testing.T) {
	t.Parallel()
	tr := New(0, Limits{})
	if _, err := tr.Add(context.Background(), 50, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Add(context.Background(), 50, 1, 0); !errors.Is(err, ErrOutOfOrder) {
		t.Fatalf("err %v, want ErrOutOfOrder", err)
	}
}

func TestWaitDrained(t *testing.T) {
	t.Parallel()
	tr := New(0, Limits{})
	p, _ := tr.Add(context.Background(), 10, 2, 2)
	go func() {
		time.Sleep(10 * time.Millisecond)
		p.Ack(1)
		p.Ack(1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	if tr.Flushed() != 10 {
		t.Fatal("drained but watermark not at the last transaction")
	}
}

// Abandon drops what is in flight and keeps the watermark: the dropped
// transactions can be added again, and late acks of them change nothing.
func TestAbandon(t *testing.T) {
	tr := New(10, Limits{MaxEvents: 3, MaxBytes: 1 << 20})
	ctx := context.Background()
	a, _ := tr.Add(ctx, 20, 1, 5)
	b, _ := tr.Add(ctx, 30, 2, 5)
	a.Ack(5)
	b.Ack(1)
	if tr.Flushed() != 20 {
		t.Fatalf("watermark %s, want 0/14", tr.Flushed())
	}
	tr.Abandon()
	if e, by := tr.InFlight(); e != 0 || by != 0 || tr.Flushed() != 20 {
		t.Fatalf("after Abandon: %d events, %d bytes, watermark %s; want 0, 0, 0/14", e, by, tr.Flushed())
	}
	b.Ack(1) // late: ignored, no panic, no move
	again, err := tr.Add(ctx, 30, 2, 5)
	if err != nil {
		t.Fatalf("re-adding the dropped transaction: %v", err)
	}
	if tr.Flushed() != 20 {
		t.Fatalf("a late ack of a dropped transaction moved the watermark to %s", tr.Flushed())
	}
	again.Ack(1)
	again.Ack(1)
	if tr.Flushed() != 30 {
		t.Errorf("watermark %s after the resent transaction was acked, want 0/1E", tr.Flushed())
	}
}

// TestReset moves the watermark to a session's start on a changed server
// history: down as well as up, only when nothing is in flight, and the
// transactions the server then resends (ending below what was added
// before) are accepted.
func TestReset(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		start     pglogrepl.LSN
		added     []pglogrepl.LSN // transactions of one event each, acked before the reset
		inflight  bool            // one more transaction, not acked, at the reset
		reset     pglogrepl.LSN
		wantErr   error
		wantAfter pglogrepl.LSN // watermark after the reset
		resend    pglogrepl.LSN // a transaction added and acked after the reset
	}{
		{name: "down, below transactions added before", start: 100, added: []pglogrepl.LSN{200, 300}, reset: 150, wantAfter: 150, resend: 200},
		{name: "up", start: 100, added: []pglogrepl.LSN{200}, reset: 500, wantAfter: 500, resend: 600},
		{name: "same", start: 100, reset: 100, wantAfter: 100, resend: 101},
		{name: "in flight refused", start: 100, added: []pglogrepl.LSN{200}, inflight: true, reset: 50, wantErr: ErrInFlight, wantAfter: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(tc.start, Limits{})
			ctx := context.Background()
			last := tc.start
			for _, end := range tc.added {
				p, err := tr.Add(ctx, end, 1, 1)
				if err != nil {
					t.Fatal(err)
				}
				p.Ack(1)
				last = end
			}
			if tc.inflight {
				if _, err := tr.Add(ctx, last+10, 1, 1); err != nil {
					t.Fatal(err)
				}
			}
			err := tr.Reset(tc.reset)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("reset to %s: err %v, want %v", tc.reset, err, tc.wantErr)
			}
			if got := tr.Flushed(); got != tc.wantAfter {
				t.Fatalf("after reset to %s: watermark %s, want %s", tc.reset, got, tc.wantAfter)
			}
			if tc.wantErr != nil {
				return
			}
			p, err := tr.Add(ctx, tc.resend, 1, 1)
			if err != nil {
				t.Fatalf("add %s after the reset: %v", tc.resend, err)
			}
			if got := tr.Flushed(); got != tc.wantAfter {
				t.Fatalf("unacked %s moved the watermark to %s", tc.resend, got)
			}
			p.Ack(1)
			if got := tr.Flushed(); got != tc.resend {
				t.Fatalf("after acking %s: watermark %s", tc.resend, got)
			}
		})
	}
}

// TestOldest: the age readiness compares with max_unacked_age is the Add
// time of the oldest transaction with an unacked event.
func TestOldest(t *testing.T) {
	t.Parallel()
	base := time.Unix(1000, 0)
	type step struct {
		add  int // events of a transaction to add (-1: none)
		ack  int // index of a transaction to ack one event of (-1: none)
		want int // index of the transaction whose Add time Oldest returns (-1: nothing in flight)
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"empty", []step{{-1, -1, -1}}},
		{"one in flight", []step{{1, -1, 0}, {-1, 0, -1}}},
		{"zero-event transaction is never in flight", []step{{0, -1, -1}}},
		{"later ack leaves the oldest", []step{{1, -1, 0}, {1, -1, 0}, {-1, 1, 0}, {-1, 0, -1}}},
		{"oldest acked: the next is the oldest", []step{{1, -1, 0}, {2, -1, 0}, {-1, 0, 1}, {-1, 1, 1}, {-1, 1, -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := New(0, Limits{})
			var pend []*Pending
			for i, s := range tt.steps {
				if s.add >= 0 {
					at := base.Add(time.Duration(len(pend)) * time.Second)
					tr.now = func() time.Time { return at }
					p, err := tr.Add(context.Background(), pglogrepl.LSN(10*(len(pend)+1)), s.add, 0)
					if err != nil {
						t.Fatal(err)
					}
					pend = append(pend, p)
				}
				if s.ack >= 0 {
					pend[s.ack].Ack(0)
				}
				got, ok := tr.Oldest()
				switch {
				case s.want < 0 && ok:
					t.Fatalf("step %d: oldest %v, want nothing in flight", i, got)
				case s.want >= 0 && (!ok || !got.Equal(base.Add(time.Duration(s.want)*time.Second))):
					t.Fatalf("step %d: oldest %v (%v), want the Add time of transaction %d", i, got, ok, s.want)
				}
			}
		})
	}
}

// A mark (a heartbeat's position) is reached once everything added before
// it is acked, holds back nothing after it, and is ignored when it is not
// after the last position added.
func TestMark(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		run  func(tr *Tracker) pglogrepl.LSN // returns the watermark expected at the end
	}{
		{"idle: reached at once", func(tr *Tracker) pglogrepl.LSN { tr.Mark(150); return 150 }},
		{"after an unacked transaction: waits", func(tr *Tracker) pglogrepl.LSN {
			tr.Add(ctx, 110, 1, 1)
			tr.Mark(150)
			return 100
		}},
		{"reached when the transaction before is acked", func(tr *Tracker) pglogrepl.LSN {
			p, _ := tr.Add(ctx, 110, 1, 1)
			tr.Mark(150)
			p.Ack(1)
			return 150
		}},
		{"a later unacked transaction does not hold it", func(tr *Tracker) pglogrepl.LSN {
			p, _ := tr.Add(ctx, 110, 1, 1)
			tr.Mark(150)
			tr.Add(ctx, 200, 1, 1)
			p.Ack(1)
			return 150
		}},
		{"at the last end: ignored, no error later", func(tr *Tracker) pglogrepl.LSN {
			p, _ := tr.Add(ctx, 110, 1, 1)
			tr.Mark(110)
			tr.Mark(105)
			if _, err := tr.Add(ctx, 200, 0, 0); err != nil {
				t.Errorf("Add after ignored marks: %v", err)
			}
			p.Ack(1)
			return 200
		}},
		{"below the watermark: ignored", func(tr *Tracker) pglogrepl.LSN { tr.Mark(50); return 100 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := New(100, Limits{MaxEvents: 10, MaxBytes: 100})
			want := tt.run(tr)
			if got := tr.Flushed(); got != want {
				t.Errorf("watermark %s, want %s", got, want)
			}
			if e, _ := tr.InFlight(); e > 2 {
				t.Errorf("%d events in flight: a mark counted as one", e)
			}
		})
	}
}

// AckN is n Acks under one lock: the watermark, the events and the bytes in
// flight move as they would, and more acks than a transaction has unacked
// panic (absorbing them could move the watermark past an unacked event).
func TestAckN(t *testing.T) {
	for _, tc := range []struct {
		name      string
		acks      []int // AckN sizes in turn (100 bytes per event) on a 5-event transaction
		wantMark  pglogrepl.LSN
		wantLeft  int
		wantBytes int64
		wantPanic bool
	}{
		{"part", []int{2, 2}, 0x10, 1, 100, false},
		{"all in one", []int{5}, 0x20, 0, 0, false},
		{"all in turns", []int{1, 3, 1}, 0x20, 0, 0, false},
		{"one too many", []int{4, 2}, 0x10, 1, 100, true},
		{"none", []int{0}, 0x10, 5, 500, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(0x10, Limits{})
			p, err := tr.Add(context.Background(), 0x20, 5, 500)
			if err != nil {
				t.Fatal(err)
			}
			panicked := func() (did bool) {
				defer func() { did = recover() != nil }()
				for _, n := range tc.acks {
					p.AckN(n, int64(100*n))
				}
				return false
			}()
			if panicked != tc.wantPanic {
				t.Fatalf("panicked %v, want %v", panicked, tc.wantPanic)
			}
			events, bytes := tr.InFlight()
			if got := tr.Flushed(); got != tc.wantMark || events != tc.wantLeft || bytes != tc.wantBytes {
				t.Fatalf("watermark %s, %d events and %d bytes in flight; want %s, %d, %d", got, events, bytes, tc.wantMark, tc.wantLeft, tc.wantBytes)
			}
		})
	}
}
