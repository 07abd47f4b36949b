// Package fault decides what the relay does about an error: retry it,
// stop, dead-letter the event, or halt until an operator acts. Code that
// knows better marks an error with a Kind (Fatal.Wrap(err)); KindOf reads
// that mark first, then PostgreSQL's SQLSTATE. Kafka's errors are named and
// mapped to a Kind by sink.Classify, in sink's own vocabulary.
package fault

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Kind says what to do about an error.
type Kind int

const (
	// Transient errors go away by themselves (a restart, a leader
	// election, a network blip): retry with backoff, for ever. The zero
	// Kind: retrying an unknown error is visible and loses nothing.
	Transient Kind = iota
	// Fatal errors need an operator (bad credentials, missing privileges,
	// a misconfigured server or slot): the relay stops with a hint.
	Fatal
	// Poison errors are about one event and come back on every attempt:
	// the event is dead-lettered, or the relay halts (on_poison).
	Poison
	// Refused errors are about the relay's rights, not the event (Kafka
	// ACLs): dead-lettering would empty the outbox into the DLQ, so the
	// relay halts until the rights are granted.
	Refused
)

func (k Kind) String() string {
	switch k {
	case Transient:
		return "transient"
	case Fatal:
		return "fatal"
	case Poison:
		return "poison"
	case Refused:
		return "refused"
	}
	return "unknown"
}

// Error is err marked with a Kind. Its text is err's own.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Wrap marks err as of kind k; nil stays nil. The mark survives wrapping
// with %w and takes precedence over whatever err carries underneath.
func (k Kind) Wrap(err error) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: k, Err: err}
}

// SQLSTATEs the relay cannot retry its way out of.
const (
	codeInvalidPassword       = "28P01"
	codeInvalidAuthorization  = "28000"
	codeInsufficientPrivilege = "42501" // e.g. no REPLICATION attribute, no GRANT on a table
	codeInvalidCatalogName    = "3D000" // database does not exist
	// A row update the database rejects the same way on every try: a
	// trigger's RAISE EXCEPTION, a CHECK or NOT NULL constraint (a trigger
	// may set NEW's columns).
	codeRaiseException   = "P0001"
	codeCheckViolation   = "23514"
	codeNotNullViolation = "23502"
)

// KindOf says what to do about err: the outermost mark in its chain, else
// the kind of a PostgreSQL error in it, else Transient (also for nil).
func KindOf(err error) Kind {
	var marked *Error
	if errors.As(err, &marked) {
		return marked.Kind
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeInvalidPassword, codeInvalidAuthorization, codeInsufficientPrivilege, codeInvalidCatalogName,
			codeRaiseException, codeCheckViolation, codeNotNullViolation:
			return Fatal
		}
	}
	return Transient
}

// IsPrivilege reports whether err is PostgreSQL's insufficient_privilege.
// It is Fatal (KindOf); callers use this to name the GRANT that fixes it,
// which only they know.
func IsPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeInsufficientPrivilege
}
