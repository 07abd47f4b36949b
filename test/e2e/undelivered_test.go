//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/retention"
)

// The undelivered count is exact when the relay is caught up: while a
// steady writer runs (the demo's shape) and the relay keeps up,
// outbox_relay_undelivered_events reads 0 and says it is exact; once the
// writer stops and every event is consumed, `outbox-relay status` says
// "0 rows not proven delivered (exact". It never claims rows delivered that
// are not: with the relay frozen (SIGSTOP, its walsender still active) the
// new rows are counted and the count says it is a bound.
func TestUndeliveredExactWhenCaughtUp(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "undeliv")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := e.startRelay()
	defer r.stop(syscall.SIGTERM, 30*time.Second)

	// A steady writer: one event every 250 ms for 16 s.
	const total, every = 64, 250 * time.Millisecond
	insert := func() error {
		_, err := e.DB.Exec(ctx, "INSERT INTO "+e.Table+" (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o1', 'order.created', '{}')")
		return err
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		for i := 0; i < total; i++ {
			if err := insert(); err != nil {
				done <- err
				return
			}
			select {
			case <-ctx.Done():
				done <- ctx.Err()
				return
			case <-time.After(time.Until(start.Add(time.Duration(i+1) * every))):
			}
		}
		done <- nil
	}()
	// Scrape while it writes, after the first horizon promotions (two
	// samples): before the count was exact it never read 0 here (it
	// counted every row created since the horizon's sample, 5-10 s of
	// writes).
	var readings []string
	zero := 0
	var werr error
	writing := true
	for writing {
		select {
		case werr = <-done:
			writing = false
			continue
		case <-time.After(250 * time.Millisecond):
		}
		if time.Since(start) < 2*retention.SampleInterval {
			continue
		}
		n, exact := r.metric("outbox_relay_undelivered_events"), r.metric("outbox_relay_undelivered_exact")
		if len(readings) == 0 || readings[len(readings)-1] != fmtReading(n, exact) {
			readings = append(readings, fmtReading(n, exact))
		}
		if n == 0 && exact == 1 {
			zero++
		}
	}
	if werr != nil {
		t.Fatal(werr)
	}
	t.Logf("while writing 4 events/s: %d of the scrapes read 0 exact; readings as they changed: %s", zero, strings.Join(readings, " "))
	if zero == 0 {
		t.Errorf("outbox_relay_undelivered_events never read 0 (exact) while a steady writer ran and the relay kept up; readings: %s", strings.Join(readings, " "))
	}

	// Every event consumed and the slot confirmed past the last commit:
	// status says 0 at once, and the metric within a sample.
	consume(t, []string{e.Prefix + ".order"}, total, 60*time.Second, 200*time.Millisecond)
	if err := e.WaitConfirmed(ctx, e.currentLSN(t), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	caughtUp := time.Now()
	rep := e.statusJSON(t)
	c := statusCheck(t, rep, "undelivered")
	d := rep.Facts.Delivery
	if d == nil || d.Undelivered == nil || *d.Undelivered != 0 || !d.UndeliveredExact || !strings.HasPrefix(c.Value, "0 rows not proven delivered (exact") {
		t.Errorf("status right after every event was consumed: undelivered %q (%s), facts %+v; want 0, exact", c.Value, c.Verdict, d)
	}
	waitFor(t, retention.SampleInterval+retention.ProofWait+5*time.Second, "outbox_relay_undelivered_events 0 and exact", func() bool {
		return r.metric("outbox_relay_undelivered_events") == 0 && r.metric("outbox_relay_undelivered_exact") == 1
	})
	t.Logf("caught up: status %q; metric 0 exact %s after", c.Value, time.Since(caughtUp).Round(100*time.Millisecond))

	// The relay frozen with its walsender still connected: the slot does
	// not confirm, so new rows are counted and the count is a bound.
	if err := r.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := true
	defer func() {
		if frozen {
			r.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	for i := 0; i < 3; i++ {
		if err := insert(); err != nil {
			t.Fatal(err)
		}
	}
	rep = e.statusJSON(t)
	c = statusCheck(t, rep, "undelivered")
	d = rep.Facts.Delivery
	if d == nil || d.Undelivered == nil || *d.Undelivered < 3 || d.UndeliveredExact || !strings.Contains(c.Value, "(a bound, not exact") {
		t.Errorf("status with the relay frozen and 3 new rows: undelivered %q, facts %+v; want >= 3, a bound", c.Value, d)
	}
	t.Logf("relay frozen: status %q", c.Value)
	if err := r.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	frozen = false
	consume(t, []string{e.Prefix + ".order"}, total+3, 60*time.Second, 200*time.Millisecond)
	waitFor(t, 30*time.Second, "status 0 exact after the relay thawed", func() bool {
		d := e.statusJSON(t).Facts.Delivery
		return d != nil && d.Undelivered != nil && *d.Undelivered == 0 && d.UndeliveredExact
	})
}

// fmtReading is a scrape as the demo shows it: =N exact, <=N a bound.
func fmtReading(n, exact float64) string {
	if exact == 1 {
		return fmt.Sprintf("=%.0f", n)
	}
	return fmt.Sprintf("<=%.0f", n)
}
