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

// A term is valid strictly before its deadline; 0 is no term.
func TestValidAt(t *testing.T) {
	tests := []struct {
		until int64
		now   time.Duration
		want  bool
	}{
		{0, 0, false},
		{0, time.Hour, false},
		{int64(3 * time.Second), 2 * time.Second, true},
		{int64(3 * time.Second), 3 * time.Second, false},
		{int64(3 * time.Second), 4 * time.Second, false},
	}
	for _, tt := range tests {
		if got := validAt(tt.until, tt.now); got != tt.want {
			t.Errorf("validAt(%d, %s) = %v, want %v", tt.until, tt.now, got, tt.want)
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
	e.held.Store(&heldLease{epoch: 7})
	e.validUntil.Store(int64(time.Since(e.start) + time.Hour))
	if !e.Valid() {
		t.Fatal("a term with an hour left is not valid")
	}
	// Valid and held: Check goes to the database, and without a lease
	// connection it fails as ErrNotLeader.
	if err := e.Check(ctx); !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), "no lease connection") {
		t.Errorf("no connection: Check = %v, want ErrNotLeader naming the missing connection", err)
	}
	e.validUntil.Store(1) // expired: the deadline is in the past
	if e.Valid() {
		t.Error("an expired term is valid")
	}
	if err := e.Check(ctx); !errors.Is(err, ErrNotLeader) || strings.Contains(err.Error(), "check lease") {
		t.Errorf("expired: Check = %v, want ErrNotLeader without a round trip", err)
	}
	if st := e.Status(); st.Role != Standby {
		t.Errorf("expired term: Status().Role = %s, want standby", st.Role)
	}
	e.validUntil.Store(int64(time.Since(e.start) + time.Hour))
	e.fence()
	if e.Valid() || e.held.Load() != nil {
		t.Error("fence left the term valid")
	}
	if err := e.renew(ctx, 7); err == nil || !strings.Contains(err.Error(), "lease expired") {
		t.Errorf("renew after fence = %v, want the expiry", err)
	}
}
