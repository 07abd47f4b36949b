package replay

import (
	"context"
	"sync"
	"time"
)

// limiter is a token bucket: rate tokens a second, at most burst saved up.
// One goroutine (the reader) waits on it.
type limiter struct {
	rate, burst, tokens float64
	last                time.Time
	now                 func() time.Time
	sleep               func(ctx context.Context, d time.Duration) error
}

// newLimiter returns a limiter of rate rows a second, or nil (no limit) for
// rate 0. Its burst is 50 ms worth of rows, at least one row, so a high
// rate does not sleep per row and a low rate is paced evenly.
func newLimiter(rate float64) *limiter {
	if rate <= 0 {
		return nil
	}
	b := max(1, rate/20)
	return &limiter{rate: rate, burst: b, tokens: b, last: time.Now(), now: time.Now, sleep: sleepCtx}
}

// wait takes one token, sleeping until there is one or ctx ends.
func (l *limiter) wait(ctx context.Context) error {
	if l == nil {
		return ctx.Err()
	}
	for {
		now := l.now()
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
		l.last = now
		if l.tokens >= 1 {
			l.tokens--
			return nil
		}
		if err := l.sleep(ctx, time.Duration((1-l.tokens)/l.rate*float64(time.Second))+time.Microsecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// budget bounds the rows published and not yet settled (acked,
// dead-lettered or failed for good) by count and payload bytes
// (inflight.max_events, inflight.max_bytes). One row always fits.
type budget struct {
	mu        sync.Mutex
	maxEvents int
	maxBytes  int64
	events    int
	bytes     int64
	freed     chan struct{} // closed and replaced on every release
}

func newBudget(events int, bytes int64) *budget {
	return &budget{maxEvents: events, maxBytes: bytes, freed: make(chan struct{})}
}

// acquire blocks until a row of n bytes fits or ctx ends.
func (b *budget) acquire(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.events == 0 || b.events < b.maxEvents && b.bytes+n <= b.maxBytes {
			b.events++
			b.bytes += n
			b.mu.Unlock()
			return nil
		}
		ch := b.freed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release returns a row of n bytes. Any goroutine; it does not block.
func (b *budget) release(n int64) {
	b.mu.Lock()
	b.events--
	b.bytes -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// inFlight returns the rows not yet settled.
func (b *budget) inFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.events
}

// drained blocks until nothing is in flight or ctx ends.
func (b *budget) drained(ctx context.Context) error {
	for {
		b.mu.Lock()
		n, ch := b.events, b.freed
		b.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
