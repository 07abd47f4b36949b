package relay

import (
	"context"
	"sync"
	"time"
)

// queue is an unbounded FIFO of jobs, each due at a time, worked off by one
// goroutine (run). push never blocks, so it may be called from the
// producer's ack goroutines. Jobs run in push order whatever their due
// times: sarama reports the records of a partition in order, so a queue of
// failed records resends them in order (per-record timers would shuffle
// them).
type queue[T any] struct {
	mu    sync.Mutex
	items []queued[T]
	wake  chan struct{}
}

type queued[T any] struct {
	v   T
	due time.Time
}

func newQueue[T any]() *queue[T] { return &queue[T]{wake: make(chan struct{}, 1)} }

func (q *queue[T]) push(v T, after time.Duration) {
	q.mu.Lock()
	q.items = append(q.items, queued[T]{v, time.Now().Add(after)})
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// len is the number of jobs waiting. Any goroutine.
func (q *queue[T]) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// run calls f on each job once it is due, until ctx ends (it returns nil)
// or f fails (it returns f's error; the failed job is dropped).
func (q *queue[T]) run(ctx context.Context, f func(context.Context, T) error) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		q.mu.Lock()
		if len(q.items) == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		head := q.items[0]
		q.mu.Unlock()
		if wait := time.Until(head.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return nil
			}
		}
		q.mu.Lock()
		q.items[0] = queued[T]{}
		q.items = q.items[1:]
		q.mu.Unlock()
		if err := f(ctx, head.v); err != nil {
			return err
		}
	}
}
