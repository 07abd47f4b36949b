// Package backoff is the one retry schedule of the relay: waits that double
// from Initial up to Max, spread over the upper half of each step so that
// many clients retrying the same outage do not march in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is an exponential, capped schedule. The zero Jitter spreads each
// wait uniformly over [d/2, d] (UpperHalf); Exact keeps d.
type Policy struct {
	Initial, Max time.Duration
	// Jitter turns an attempt's ceiling d into the wait; nil is UpperHalf.
	// Tests set it to make delays deterministic.
	Jitter func(d time.Duration) time.Duration
}

// Ceiling is the longest wait before attempt (1, 2, ...): Initial doubled
// attempt-1 times, capped at Max. Attempts below 1 count as 1.
func (p Policy) Ceiling(attempt int) time.Duration {
	shift := min(max(attempt-1, 0), 62)
	if p.Initial > p.Max>>shift { // also keeps Initial<<shift from overflowing
		return p.Max
	}
	return p.Initial << shift
}

// Delay is the wait before attempt (1, 2, ...): Ceiling with jitter.
func (p Policy) Delay(attempt int) time.Duration {
	jitter := p.Jitter
	if jitter == nil {
		jitter = UpperHalf
	}
	return jitter(p.Ceiling(attempt))
}

// UpperHalf returns a uniformly random duration in [d/2, d].
func UpperHalf(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d-d/2+1)
}

// Exact returns d: for a loop that is alone in retrying, where a steady
// schedule reads better in logs than a random one.
func Exact(d time.Duration) time.Duration { return d }

// Backoff counts the attempts of one retry loop. The zero value of the
// counter starts at attempt 1; not safe for concurrent use.
type Backoff struct {
	Policy
	attempt int
}

// Next returns the wait before the next attempt and counts it; it does not
// wait (pass the result to Sleep).
func (b *Backoff) Next() time.Duration {
	b.attempt++
	return b.Delay(b.attempt)
}

// Reset starts the schedule over, after a success.
func (b *Backoff) Reset() { b.attempt = 0 }

// Sleep blocks for d and returns nil, or returns ctx.Err() as soon as ctx
// ends first. Unlike time.After in a select, the timer is stopped at once
// when ctx wins. Any goroutine.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
