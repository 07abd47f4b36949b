package leader

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
)

// What a standby does after the fencing statement: the statement has
// already terminated the lock holder's backend and the slot's walsender
// when (and only when) the row was stale; the standby notes the holder, or
// reports that it may not fence, or fails the round.
func TestFenceVerdict(t *testing.T) {
	refused := &pgconn.PgError{Code: "42501", Message: "permission denied to terminate process"}
	tests := []struct {
		name  string
		err   error
		stale bool
		want  fenceAction
	}{
		{"renewed within the TTL", nil, false, holderAlive},
		{"renewal older than the TTL: fenced", nil, true, holderFenced},
		{"no row yet: the lock holder has not written it", pgx.ErrNoRows, false, waitForRow},
		{"no row, wrapped", fmt.Errorf("scan: %w", pgx.ErrNoRows), false, waitForRow},
		{"pg_terminate_backend refused", refused, false, fenceRefused},
		{"pg_terminate_backend refused, wrapped", fmt.Errorf("query: %w", refused), false, fenceRefused},
		// Another privilege error (say on the lease table) is no refused
		// fence: the round fails, the can_fence report stays.
		{"other privilege error", &pgconn.PgError{Code: "42501", Message: "permission denied for table outbox_relay_leader"}, false, fenceError},
		{"connection lost", errors.New("unexpected EOF"), false, fenceError},
		{"timeout", context.DeadlineExceeded, false, fenceError},
		// stale is read from the row; with an error there is no row to trust.
		{"error with a stale flag", errors.New("unexpected EOF"), true, fenceError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fenceVerdict(tt.err, tt.stale); got != tt.want {
				t.Errorf("fenceVerdict(%v, %v) = %s, want %s", tt.err, tt.stale, got, tt.want)
			}
		})
	}
}

// A renewal keeps the term only when it updated the row naming this
// instance and epoch; a lost or timed-out lease connection and a row taken
// over both end it (serve then fences locally).
func TestRenewVerdict(t *testing.T) {
	tests := []struct {
		name string
		rows int64
		err  error
		want string // in the error; "" for none
	}{
		{"renewed", 1, nil, ""},
		{"taken over: newer epoch or another holder", 0, nil, "lease taken over"},
		{"connection lost", 0, errors.New("conn closed"), "renew lease: conn closed"},
		{"timed out", 0, context.DeadlineExceeded, "renew lease: context deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := renewVerdict(tt.rows, tt.err)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("renewVerdict = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("renewVerdict = %v, want %q", err, tt.want)
			case tt.err != nil && !errors.Is(err, tt.err):
				t.Errorf("renewVerdict = %v does not wrap %v", err, tt.err)
			}
		})
	}
}

// Check lets a session start only when the row still names this instance
// and epoch; everything else is ErrNotLeader.
func TestCheckVerdict(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
		err  error
		want string // in the error; "" for none
	}{
		{"the row names us", true, nil, ""},
		{"newer holder or epoch", false, nil, `the lease of slot "s" has a newer holder or epoch`},
		{"lease connection lost", false, errors.New("no lease connection"), "check lease: no lease connection"},
		{"query failed although ok", true, errors.New("timeout"), "check lease: timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkVerdict("s", tt.ok, tt.err)
			if tt.want == "" {
				if err != nil {
					t.Errorf("checkVerdict = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("checkVerdict = %v, want ErrNotLeader with %q", err, tt.want)
			}
		})
	}
}

// A term is valid strictly before its deadline; nil is no term.
func TestLeaseValidAt(t *testing.T) {
	tests := []struct {
		l    *lease
		now  time.Duration
		want bool
	}{
		{nil, 0, false},
		{nil, time.Hour, false},
		{&lease{epoch: 1, until: 3 * time.Second}, 2 * time.Second, true},
		{&lease{epoch: 1, until: 3 * time.Second}, 3 * time.Second, false},
		{&lease{epoch: 1, until: 3 * time.Second}, 4 * time.Second, false},
	}
	for _, tt := range tests {
		if got := tt.l.validAt(tt.now); got != tt.want {
			t.Errorf("%+v.validAt(%s) = %v, want %v", tt.l, tt.now, got, tt.want)
		}
	}
}

// A lease runs from the send of the statement that confirmed it, for the
// TTL less a tenth: the database stamped renewed_at no earlier, and its
// clock may run faster.
func TestNewLease(t *testing.T) {
	tests := []struct {
		sent, ttl, until time.Duration
	}{
		{0, 10 * time.Second, 9 * time.Second},
		{5 * time.Second, 3 * time.Second, 7700 * time.Millisecond},
		{time.Hour, 200 * time.Millisecond, time.Hour + 180*time.Millisecond},
	}
	for _, tt := range tests {
		l := newLease(4, tt.sent, tt.ttl)
		if l.epoch != 4 || l.until != tt.until {
			t.Errorf("newLease(4, %s, %s) = %+v, want epoch 4 until %s", tt.sent, tt.ttl, l, tt.until)
		}
		if tt.until > tt.sent+tt.ttl {
			t.Errorf("lease of TTL %s sent at %s outlives the database's expiry", tt.ttl, tt.sent)
		}
	}
}

// The server drops a silent lease connection 3*idle after its last packet
// (idle, then two probes idle apart): never before the TTL.
func TestKeepaliveIdle(t *testing.T) {
	tests := []struct {
		ttl  time.Duration
		want int
	}{
		{200 * time.Millisecond, 1},
		{3 * time.Second, 1},
		{5 * time.Second, 2}, // rounded down it was 1: dropped after 3s, inside a 5s lease
		{9 * time.Second, 3},
		{10 * time.Second, 4}, // rounded down it was 3: dropped after 9s
		{5 * time.Minute, 100},
	}
	for _, tt := range tests {
		got := keepaliveIdle(tt.ttl)
		if got != tt.want {
			t.Errorf("keepaliveIdle(%s) = %d, want %d", tt.ttl, got, tt.want)
		}
		if drop := 3 * time.Duration(got) * time.Second; drop < tt.ttl {
			t.Errorf("TTL %s: a silent peer is dropped after %s, before the lease ends", tt.ttl, drop)
		}
	}
}

// An elector that is not leader, or whose term expired by its own clock,
// refuses Check without a round trip (it has no connection here), and
// fence ends a term at once: Valid and Check fail from then on.
func TestCheckWithoutValidTerm(t *testing.T) {
	e, err := New(Config{URL: "postgres://x@127.0.0.1:1/db", Slot: "s", Schema: "public", InstanceID: "i",
		TTL: time.Second, Renew: 100 * time.Millisecond, Poll: 50 * time.Millisecond}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := e.Check(ctx); !errors.Is(err, ErrNotLeader) {
		t.Errorf("standby: Check = %v, want ErrNotLeader", err)
	}
	e.held.Store(&lease{epoch: 7, until: e.now() + time.Hour})
	if !e.Valid() {
		t.Fatal("a term with an hour left is not valid")
	}
	// Valid and held: Check goes to the database, and without a lease
	// connection it fails as ErrNotLeader.
	if err := e.Check(ctx); !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), "no lease connection") {
		t.Errorf("no connection: Check = %v, want ErrNotLeader naming the missing connection", err)
	}
	e.held.Store(&lease{epoch: 7, until: 1}) // expired: the deadline is in the past
	if e.Valid() {
		t.Error("an expired term is valid")
	}
	if err := e.Check(ctx); !errors.Is(err, ErrNotLeader) || strings.Contains(err.Error(), "check lease") {
		t.Errorf("expired: Check = %v, want ErrNotLeader without a round trip", err)
	}
	if st := e.Status(); st.Role != Standby {
		t.Errorf("expired term: Status().Role = %s, want standby", st.Role)
	}
	e.held.Store(&lease{epoch: 7, until: e.now() + time.Hour})
	e.fence()
	if e.Valid() || e.held.Load() != nil {
		t.Error("fence left the term valid")
	}
	// The lease session ending ends the term: the lock goes with it.
	e.held.Store(&lease{epoch: 7, until: e.now() + time.Hour})
	e.closeConn()
	if e.Valid() {
		t.Error("closing the lease connection left the term valid")
	}
	if got := gauge(t, e.metrics.leader); got != 0 {
		t.Errorf("outbox_relay_leader = %v after the term ended, want 0", got)
	}
	e.held.Store(&lease{epoch: 7, until: e.now() + time.Hour})
	if got := gauge(t, e.metrics.leader); got != 1 {
		t.Errorf("outbox_relay_leader = %v with a valid lease, want 1", got)
	}
	e.fence()
	if err := e.renew(ctx); err == nil || !strings.Contains(err.Error(), "lease expired") {
		t.Errorf("renew after fence = %v, want the expiry", err)
	}
}

func gauge(t *testing.T, g prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
