package pg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// KeeperConfig is what a Keeper runs: how it connects, how it paces the
// attempts of its job, what it counts and whom it tells about failures.
type KeeperConfig struct {
	// Connect opens the connection (e.g. Connect with the URL, plus any
	// session setup or timeout of the caller's). Required.
	Connect func(context.Context) (*pgx.Conn, error)
	// Every paces the attempts. Required, positive.
	Every time.Duration
	// Ticked: attempts follow a ticker of period Every started with Run (a
	// slow attempt is followed at once by the next); otherwise Run waits
	// Every after each attempt ends.
	Ticked bool
	// Retry, when its Initial is set, is the backoff after a failed
	// attempt: Run waits the next delay, then attempts again at once.
	// Zero: a failed attempt waits like a successful one.
	Retry backoff.Policy
	// Due, when set, is asked before each attempt; false skips it (no
	// connection is opened) until the next tick or pause.
	Due func() bool
	// Done counts successful attempts and Errors failed ones; nil: not
	// counted.
	Done, Errors prometheus.Counter
	// Failed, when set, is told about each failed attempt. Recovered, when
	// set, is called on the first success after a failure.
	Failed    func(Failure)
	Recovered func()
}

// Failure is one failed attempt of a Keeper's job.
type Failure struct {
	Err error
	// Connecting: Connect failed; otherwise the job did.
	Connecting bool
	// First: the first failure since Run started or the last success, so
	// a caller logs an outage once.
	First bool
	// Wait is how long Run waits before the next attempt when Retry is
	// set; 0 otherwise (the next tick or pause).
	Wait time.Duration
}

// Keeper keeps one normal connection to PostgreSQL for a job that runs
// again and again: it connects when it has no connection, runs the job on
// it, and on an error closes it, so the next attempt reconnects. Only the
// goroutine that calls Run uses it.
type Keeper struct {
	cfg  KeeperConfig
	conn *pgx.Conn
}

// closeTimeout bounds closing a connection: a dead server must not hold
// the job, or the end of Run.
const closeTimeout = time.Second

// NewKeeper allocates; it does not connect. It panics if cfg.Connect is nil
// or cfg.Every is not positive: those are programming errors.
func NewKeeper(cfg KeeperConfig) *Keeper {
	if cfg.Connect == nil || cfg.Every <= 0 {
		panic("pg.NewKeeper: Connect and a positive Every are required")
	}
	return &Keeper{cfg: cfg}
}

// Run attempts job on the kept connection, paced by the config, until ctx
// ends; then it closes the connection and returns. An attempt that ends
// with ctx ended is neither counted nor reported. job runs on Run's
// goroutine and must return when ctx ends; a job error is never fatal to
// Run: it is counted, reported to Failed, and the next attempt runs on a
// new connection. Call Run once, from one goroutine; it blocks.
func (k *Keeper) Run(ctx context.Context, job func(context.Context, *pgx.Conn) error) {
	defer k.close(ctx)
	var t *time.Ticker
	if k.cfg.Ticked {
		t = time.NewTicker(k.cfg.Every)
		defer t.Stop()
	}
	b := backoff.Backoff{Policy: k.cfg.Retry}
	failing := false
	for {
		if k.cfg.Due == nil || k.cfg.Due() {
			connecting, err := k.attempt(ctx, job)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				wait := time.Duration(0)
				if k.cfg.Retry.Initial > 0 {
					wait = b.Next()
				}
				if k.cfg.Errors != nil {
					k.cfg.Errors.Inc()
				}
				if k.cfg.Failed != nil {
					k.cfg.Failed(Failure{Err: err, Connecting: connecting, First: !failing, Wait: wait})
				}
				failing = true
				if wait > 0 {
					if backoff.Sleep(ctx, wait) != nil {
						return
					}
					continue
				}
			} else {
				if k.cfg.Done != nil {
					k.cfg.Done.Inc()
				}
				if failing && k.cfg.Recovered != nil {
					k.cfg.Recovered()
				}
				failing = false
				b.Reset()
			}
		}
		if t == nil {
			if backoff.Sleep(ctx, k.cfg.Every) != nil {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// attempt connects if needed and runs job; on an error it closes the
// connection. connecting reports that Connect failed.
func (k *Keeper) attempt(ctx context.Context, job func(context.Context, *pgx.Conn) error) (connecting bool, err error) {
	if k.conn == nil {
		c, err := k.cfg.Connect(ctx)
		if err != nil {
			return true, err
		}
		k.conn = c
	}
	if err := job(ctx, k.conn); err != nil {
		k.close(ctx)
		return false, err
	}
	return false, nil
}

// close closes the connection, if any, within closeTimeout.
func (k *Keeper) close(ctx context.Context) {
	if k.conn == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	k.conn.Close(cctx)
	k.conn = nil
}
