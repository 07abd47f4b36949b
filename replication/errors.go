package replication

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// FatalError marks an error that retrying cannot fix: a misconfigured server,
// a wrong slot, bad credentials, or a handler that refused the data. The
// relay stops on it; everything else is retried with backoff.
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

// Fatal wraps err so IsFatal reports true.
func Fatal(err error) error {
	if err == nil {
		return nil
	}
	return &FatalError{Err: err}
}

// IsFatal reports whether err must stop the relay rather than be retried.
func IsFatal(err error) bool {
	var f *FatalError
	if errors.As(err, &f) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000": // invalid password, invalid authorization
			return true
		case "42501": // insufficient privilege (e.g. no REPLICATION attribute)
			return true
		case "3D000": // database does not exist
			return true
		}
	}
	return false
}
