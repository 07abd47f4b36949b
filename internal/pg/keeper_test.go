package pg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outbox-relay/outbox-relay/backoff"
)

var errDown = errors.New("server down")

// fake stands for the server: Connect and the job fail as scripted,
// attempt by attempt (past the script's end they succeed). Connect returns
// no connection, so every attempt connects again: at is the start of each
// attempt. After the stop-th attempt it cancels Run's context, so that
// attempt ends with ctx ended. Only Run's goroutine touches it until Run
// returned.
type fake struct {
	connects, jobs []error
	nJob           int
	at             []time.Time
	stop           int
	cancel         func()
}

func pick(errs []error, i int) error {
	if i < len(errs) {
		return errs[i]
	}
	return nil
}

func (f *fake) connect(context.Context) (*pgx.Conn, error) {
	f.at = append(f.at, time.Now())
	err := pick(f.connects, len(f.at)-1)
	if err != nil && len(f.at) >= f.stop {
		f.cancel()
	}
	return nil, err
}

func (f *fake) job(context.Context, *pgx.Conn) error {
	err := pick(f.jobs, f.nJob)
	f.nJob++
	if len(f.at) >= f.stop {
		f.cancel()
	}
	return err
}

func TestKeeperRun(t *testing.T) {
	t.Parallel()
	const every = 20 * time.Millisecond
	conn := func(first bool) Failure { return Failure{Err: errDown, Connecting: true, First: first} }
	job := func(first bool) Failure { return Failure{Err: errDown, First: first} }
	withWait := func(f Failure, d time.Duration) Failure { f.Wait = d; return f }
	for _, tc := range []struct {
		name           string
		connects, jobs []error
		retry          backoff.Policy
		ticked         bool
		due            []bool // Due's answers in turn (nil: no Due); past the end: true
		stop           int    // the attempt that ends Run (cut by ctx: never reported)
		// want
		failures      []Failure
		recovered     int
		done          float64
		minGaps       []time.Duration // at least this between attempt i and i+1; the last one repeats
		attemptsTotal int
	}{
		{name: "connect fails twice, then works: one outage, reported first once", connects: []error{errDown, errDown}, stop: 4,
			failures: []Failure{conn(true), conn(false)}, recovered: 1, done: 1, minGaps: []time.Duration{every}},
		{name: "job fails, works, fails, works (ticked)", jobs: []error{errDown, nil, errDown}, ticked: true, stop: 5,
			failures: []Failure{job(true), job(true)}, recovered: 2, done: 2, minGaps: []time.Duration{every / 2}},
		{name: "with retry: each failure waits the doubling backoff, then retries at once", connects: []error{errDown, errDown, errDown}, ticked: true, stop: 4,
			retry:    backoff.Policy{Initial: 30 * time.Millisecond, Max: time.Second, Jitter: backoff.Exact},
			failures: []Failure{withWait(conn(true), 30*time.Millisecond), withWait(conn(false), 60*time.Millisecond), withWait(conn(false), 120*time.Millisecond)},
			minGaps:  []time.Duration{30 * time.Millisecond, 60 * time.Millisecond, 120 * time.Millisecond}},
		{name: "failing at once, again and again: paced by Every, no busy loop", connects: []error{errDown, errDown, errDown, errDown, errDown, errDown}, stop: 6,
			failures: []Failure{conn(true), conn(false), conn(false), conn(false), conn(false)}, minGaps: []time.Duration{every}},
		{name: "not due: no connection, no attempt", due: []bool{false, false, false}, ticked: true, stop: 2,
			done: 1, minGaps: []time.Duration{every / 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := &fake{connects: tc.connects, jobs: tc.jobs, stop: tc.stop, cancel: cancel}
			done := prometheus.NewCounter(prometheus.CounterOpts{Name: "done_total"})
			errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "errors_total"})
			var failures []Failure
			recovered, asked := 0, 0
			var dueAt []time.Time
			cfg := KeeperConfig{Connect: f.connect, Every: every, Ticked: tc.ticked, Retry: tc.retry, Done: done, Errors: errs,
				Failed:    func(fl Failure) { failures = append(failures, fl) },
				Recovered: func() { recovered++ },
			}
			if tc.due != nil {
				cfg.Due = func() bool {
					dueAt = append(dueAt, time.Now())
					asked++
					return asked > len(tc.due) || tc.due[asked-1]
				}
			}
			finished := make(chan struct{})
			go func() {
				defer close(finished)
				NewKeeper(cfg).Run(ctx, f.job)
			}()
			select {
			case <-finished:
			case <-time.After(10 * time.Second):
				cancel()
				<-finished
				t.Fatalf("Run still going after 10s: %d attempts", len(f.at))
			}
			if len(f.at) != tc.stop {
				t.Errorf("%d attempts, want %d", len(f.at), tc.stop)
			}
			if len(failures) != len(tc.failures) {
				t.Fatalf("failures %+v, want %+v", failures, tc.failures)
			}
			for i, got := range failures {
				if w := tc.failures[i]; !errors.Is(got.Err, w.Err) || got.Connecting != w.Connecting || got.First != w.First || got.Wait != w.Wait {
					t.Errorf("failure %d = %+v, want %+v", i, got, w)
				}
			}
			if recovered != tc.recovered {
				t.Errorf("recovered %d times, want %d", recovered, tc.recovered)
			}
			if got := value(errs); got != float64(len(tc.failures)) {
				t.Errorf("errors counted %v, want %d", got, len(tc.failures))
			}
			if got := value(done); got != tc.done {
				t.Errorf("done counted %v, want %v", got, tc.done)
			}
			gaps := tc.minGaps
			at := f.at
			if tc.due != nil {
				at = dueAt // Due is asked at each tick
				if want := len(tc.due) + 2; asked != want {
					t.Errorf("Due asked %d times, want %d", asked, want)
				}
			}
			for i := 1; i < len(at); i++ {
				min := gaps[min(i-1, len(gaps)-1)]
				if gap := at[i].Sub(at[i-1]); gap < min-2*time.Millisecond { // a ticker may fire a little early
					t.Errorf("attempts %d and %d only %s apart, want at least %s", i-1, i, gap, min)
				}
			}
		})
	}
}

// Run returns soon after ctx ends, even in a long backoff wait or between
// ticks.
func TestKeeperRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  KeeperConfig
	}{
		{name: "in a backoff wait", cfg: KeeperConfig{Every: time.Hour, Retry: backoff.Policy{Initial: time.Hour, Max: time.Hour},
			Connect: func(context.Context) (*pgx.Conn, error) { return nil, errDown }}},
		{name: "between ticks", cfg: KeeperConfig{Every: time.Hour, Ticked: true,
			Connect: func(context.Context) (*pgx.Conn, error) { return nil, nil }}},
		{name: "in a pause", cfg: KeeperConfig{Every: time.Hour,
			Connect: func(context.Context) (*pgx.Conn, error) { return nil, nil }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			attempted := make(chan struct{}, 1)
			finished := make(chan struct{})
			go func() {
				defer close(finished)
				NewKeeper(tc.cfg).Run(ctx, func(context.Context, *pgx.Conn) error {
					attempted <- struct{}{}
					return nil
				})
			}()
			if tc.cfg.Retry.Initial == 0 {
				<-attempted
			} else {
				time.Sleep(20 * time.Millisecond) // let it reach the wait
			}
			cancel()
			select {
			case <-finished:
			case <-time.After(time.Second):
				t.Fatal("Run did not return within 1s of ctx's end")
			}
		})
	}
}

func TestNewKeeperRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []KeeperConfig{
		{Every: time.Second},
		{Connect: func(context.Context) (*pgx.Conn, error) { return nil, nil }},
		{Connect: func(context.Context) (*pgx.Conn, error) { return nil, nil }, Every: -1},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewKeeper(%+v) did not panic", cfg)
				}
			}()
			NewKeeper(cfg)
		}()
	}
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
