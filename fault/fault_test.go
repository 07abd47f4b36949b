package fault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"
)

func pgErr(code string) error {
	return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "test"}
}

func TestKindOf(t *testing.T) {
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name string
		err  error
		want Kind
	}{
		{"nil", nil, Transient},
		{"plain error", errors.New("boom"), Transient},
		{"text that looks like a code", errors.New("28P01"), Transient},

		// Explicit marks.
		{"Fatal mark", Fatal.Wrap(errors.New("slot is physical")), Fatal},
		{"wrapped Fatal mark", fmt.Errorf("start replication: %w", Fatal.Wrap(errors.New("x"))), Fatal},
		{"twice wrapped Fatal mark", fmt.Errorf("a: %w", fmt.Errorf("b: %w", Fatal.Wrap(io.EOF))), Fatal},
		{"joined with a Fatal mark", errors.Join(io.EOF, Fatal.Wrap(errors.New("x"))), Fatal},
		{"Fatal mark on a network error", Fatal.Wrap(netErr), Fatal},
		{"Poison mark", Poison.Wrap(errors.New("bad row")), Poison},
		{"Refused mark", fmt.Errorf("publish: %w", Refused.Wrap(sarama.ErrTopicAuthorizationFailed)), Refused},
		{"outermost mark wins", Transient.Wrap(fmt.Errorf("x: %w", Fatal.Wrap(io.EOF))), Transient},
		{"mark beats the SQLSTATE", Transient.Wrap(pgErr("42501")), Transient},
		{"SQLSTATE under a Fatal mark", Fatal.Wrap(pgErr("57P01")), Fatal},

		// PostgreSQL errors: what an operator must fix is fatal.
		{"28P01 invalid password", pgErr("28P01"), Fatal},
		{"28000 invalid authorization", pgErr("28000"), Fatal},
		{"42501 insufficient privilege", pgErr("42501"), Fatal},
		{"3D000 database does not exist", pgErr("3D000"), Fatal},
		{"wrapped 28P01", fmt.Errorf("connect: %w", pgErr("28P01")), Fatal},
		{"wrapped 42501", fmt.Errorf("create slot: %w", pgErr("42501")), Fatal},
		{"twice wrapped 3D000", fmt.Errorf("a: %w", fmt.Errorf("connect to %s: %w", "db", pgErr("3D000"))), Fatal},
		// A row update rejected by the database itself comes back on every try.
		{"P0001 raise_exception (a trigger)", pgErr("P0001"), Fatal},
		{"23514 check violation", pgErr("23514"), Fatal},
		{"23502 not-null violation (a trigger's NEW)", pgErr("23502"), Fatal},
		{"wrapped P0001", fmt.Errorf("mark outbox row: %w", pgErr("P0001")), Fatal},
		{"57P01 admin shutdown", pgErr("57P01"), Transient},
		{"57P03 starting up", pgErr("57P03"), Transient},
		{"53300 too many connections", pgErr("53300"), Transient},
		{"55006 slot active", pgErr("55006"), Transient},
		{"08006 connection failure", pgErr("08006"), Transient},
		{"42704 undefined object (a dropped slot at START_REPLICATION)", pgErr("42704"), Transient},

		// Neither marked nor PostgreSQL's.
		{"network error", netErr, Transient},
		{"wrapped network error", fmt.Errorf("connect: %w", netErr), Transient},
		{"io.EOF", io.EOF, Transient},
		{"unexpected EOF", io.ErrUnexpectedEOF, Transient},
		{"context canceled", context.Canceled, Transient},
		{"deadline exceeded", context.DeadlineExceeded, Transient},
		// Kafka's vocabulary is sink.Classify's; fault does not guess.
		{"sarama KError unmarked", sarama.ErrTopicAuthorizationFailed, Transient},
		{"sarama KError wrapped", fmt.Errorf("produce: %w", sarama.ErrMessageSizeTooLarge), Transient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := KindOf(tt.err); got != tt.want {
				t.Errorf("KindOf(%v) = %s, want %s", tt.err, got, tt.want)
			}
		})
	}
}

func TestWrap(t *testing.T) {
	for _, k := range []Kind{Transient, Fatal, Poison, Refused} {
		t.Run(k.String(), func(t *testing.T) {
			if err := k.Wrap(nil); err != nil {
				t.Errorf("Wrap(nil) = %v, want nil", err)
			}
			inner := fmt.Errorf("slot %s: %w", "outbox_relay", io.EOF)
			err := k.Wrap(inner)
			if err.Error() != inner.Error() {
				t.Errorf("Wrap changed the message: %q, want %q", err.Error(), inner.Error())
			}
			if !errors.Is(err, io.EOF) {
				t.Error("Wrap(err) does not unwrap to err's chain")
			}
			var e *Error
			if !errors.As(fmt.Errorf("outer: %w", err), &e) || e.Err != inner || e.Kind != k {
				t.Errorf("errors.As(*Error) = %+v, want Kind %s around %v", e, k, inner)
			}
		})
	}
}

func TestIsPrivilege(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"42501", pgErr("42501"), true},
		{"wrapped 42501", fmt.Errorf("take lease: %w", pgErr("42501")), true},
		{"42501 under a mark", Fatal.Wrap(fmt.Errorf("x: %w", pgErr("42501"))), true},
		{"28P01", pgErr("28P01"), false},
		{"plain error", errors.New("permission denied"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsPrivilege(tt.err); got != tt.want {
				t.Errorf("IsPrivilege(%v) = %v, want %v", tt.err, got, tt.want)
			}
			// Every privilege error is fatal: the hint is extra, not the decision.
			if tt.want && KindOf(tt.err) != Fatal {
				t.Errorf("KindOf(%v) = %s, want fatal", tt.err, KindOf(tt.err))
			}
		})
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{Transient: "transient", Fatal: "fatal", Poison: "poison", Refused: "refused", Kind(42): "unknown"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}
