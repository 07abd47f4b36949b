package backoff

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

func TestCeiling(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name    string
		p       Policy
		attempt int
		want    time.Duration
	}{
		{"first attempt", Policy{Initial: 100 * ms, Max: 5 * time.Second}, 1, 100 * ms},
		{"second doubles", Policy{Initial: 100 * ms, Max: 5 * time.Second}, 2, 200 * ms},
		{"sixth", Policy{Initial: 100 * ms, Max: 5 * time.Second}, 6, 3200 * ms},
		{"seventh is capped", Policy{Initial: 100 * ms, Max: 5 * time.Second}, 7, 5 * time.Second},
		{"attempt 0 counts as 1", Policy{Initial: 100 * ms, Max: 5 * time.Second}, 0, 100 * ms},
		{"negative attempt counts as 1", Policy{Initial: 100 * ms, Max: 5 * time.Second}, -3, 100 * ms},
		{"huge attempt does not overflow", Policy{Initial: 100 * ms, Max: 5 * time.Second}, math.MaxInt, 5 * time.Second},
		{"shift 62 with tiny initial", Policy{Initial: 1, Max: math.MaxInt64}, 63, 1 << 62},
		{"shift capped at 62", Policy{Initial: 1, Max: math.MaxInt64}, 1000, 1 << 62},
		{"initial above max is capped", Policy{Initial: 30 * time.Second, Max: 10 * time.Second}, 1, 10 * time.Second},
		{"initial equals max", Policy{Initial: time.Second, Max: time.Second}, 5, time.Second},
		{"zero policy", Policy{}, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Ceiling(tt.attempt); got != tt.want {
				t.Errorf("Ceiling(%d) = %s, want %s", tt.attempt, got, tt.want)
			}
		})
	}
}

// Delay stays within [ceiling/2, ceiling] for every attempt, and actually
// spreads: a schedule that always returned one end would pass the bounds.
func TestDelayBoundsAndSpread(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
	}{
		{"sarama produce retries", Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}},
		{"stream reconnect", Policy{Initial: 200 * time.Millisecond, Max: 30 * time.Second}},
		{"dead-letter marking", Policy{Initial: time.Second, Max: 30 * time.Second}},
		{"odd nanoseconds", Policy{Initial: 3, Max: 1001}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for attempt := 1; attempt <= 40; attempt++ {
				ceil := tt.p.Ceiling(attempt)
				lo, hi := ceil, time.Duration(0)
				for range 200 {
					d := tt.p.Delay(attempt)
					if d < ceil/2 || d > ceil {
						t.Fatalf("attempt %d: Delay = %s outside [%s, %s]", attempt, d, ceil/2, ceil)
					}
					lo, hi = min(lo, d), max(hi, d)
				}
				if ceil >= 100 && hi-lo < ceil/10 {
					t.Errorf("attempt %d: 200 delays within [%s, %s] of a %s ceiling: not jittered", attempt, lo, hi, ceil)
				}
			}
		})
	}
}

func TestUpperHalf(t *testing.T) {
	tests := []struct {
		d      time.Duration
		lo, hi time.Duration
	}{
		{0, 0, 0},
		{-5 * time.Second, 0, 0},
		{1, 0, 1},
		{2, 1, 2},
		{3, 1, 3},
		{time.Second, 500 * time.Millisecond, time.Second},
	}
	for _, tt := range tests {
		seen := map[time.Duration]bool{}
		for range 1000 {
			got := UpperHalf(tt.d)
			if got < tt.lo || got > tt.hi {
				t.Fatalf("UpperHalf(%s) = %s, want within [%s, %s]", tt.d, got, tt.lo, tt.hi)
			}
			seen[got] = true
		}
		// Small ranges are covered end to end: no off-by-one at either bound.
		if span := tt.hi - tt.lo; span <= 2 && len(seen) != int(span)+1 {
			t.Errorf("UpperHalf(%s) produced %d distinct values, want %d", tt.d, len(seen), span+1)
		}
	}
}

func TestJitterIsInjectable(t *testing.T) {
	p := Policy{Initial: time.Second, Max: 8 * time.Second, Jitter: Exact}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w {
			t.Errorf("Exact Delay(%d) = %s, want %s", i+1, got, w)
		}
	}
	var asked []time.Duration
	p.Jitter = func(d time.Duration) time.Duration { asked = append(asked, d); return d / 2 }
	if got := p.Delay(3); got != 2*time.Second || len(asked) != 1 || asked[0] != 4*time.Second {
		t.Errorf("Delay(3) = %s with jitter asked %v; want 2s from a 4s ceiling", got, asked)
	}
}

func TestBackoffNextAndReset(t *testing.T) {
	b := Backoff{Policy: Policy{Initial: 200 * time.Millisecond, Max: time.Second, Jitter: Exact}}
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	b.Reset()
	got = append(got, b.Next())
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second, 200 * time.Millisecond}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Next sequence = %v, want %v", got, want)
		}
	}
}

func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep elapsed = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep on a cancelled ctx = %v, want context.Canceled", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("Sleep on a cancelled ctx took %s", el)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer dcancel()
	if err := Sleep(dctx, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Sleep past the deadline = %v, want context.DeadlineExceeded", err)
	}
}
