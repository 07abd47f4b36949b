// Package replication owns the PostgreSQL side of the relay: it checks the
// server, slot and publication, runs START_REPLICATION on a pgoutput slot,
// hands every XLogData payload to a Handler, and reports the confirmed
// position back in standby status updates. It is the only code that touches
// the replication connection.
package replication

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Config is the replication part of the relay's configuration.
type Config struct {
	// URL is a libpq connection string or URL. It must reach the primary
	// directly (no transaction-pooling proxy): replication needs a session.
	URL string `yaml:"url"`
	// Slot is the logical replication slot; created if missing, never dropped.
	Slot string `yaml:"slot"`
	// Publication names the publication the slot streams.
	Publication string `yaml:"publication"`
	// Table is the outbox table as schema.name (see outboxschema.ParseTable).
	Table string `yaml:"table"`
	// CreatePublication lets the relay create a missing publication.
	CreatePublication bool `yaml:"create_publication"`
	// StatusInterval is how often standby status updates are sent. It must
	// stay below wal_sender_timeout/2, which is checked at start.
	StatusInterval time.Duration `yaml:"status_interval"`
	// ReceiveTimeout: a replication connection from which nothing arrives
	// for this long, although a reply was requested, is closed and
	// reconnected (like PostgreSQL's wal_receiver_timeout). At least three
	// status intervals are always allowed.
	ReceiveTimeout time.Duration `yaml:"receive_timeout"`
	// ReconnectMin and ReconnectMax bound the exponential reconnect backoff.
	ReconnectMin time.Duration `yaml:"reconnect_min"`
	ReconnectMax time.Duration `yaml:"reconnect_max"`
	// LagPollInterval is how often slot lag is read on a normal connection.
	LagPollInterval time.Duration `yaml:"lag_poll_interval"`
}

// DefaultConfig returns the defaults documented in the README.
func DefaultConfig() Config {
	return Config{
		Slot:              "outbox_relay",
		Publication:       "outbox_pub",
		Table:             "public.outbox",
		CreatePublication: true,
		StatusInterval:    time.Second,
		ReceiveTimeout:    30 * time.Second,
		ReconnectMin:      200 * time.Millisecond,
		ReconnectMax:      30 * time.Second,
		LagPollInterval:   5 * time.Second,
	}
}

// Validate reports every invalid field, each named by its config key under
// prefix (e.g. "postgres.").
func (c Config) Validate(prefix string) error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", prefix, key, fmt.Sprintf(format, a...)))
	}
	if c.URL == "" {
		bad("url", "is empty; set it to the outbox database, e.g. postgres://user:password@host:5432/db")
	} else if _, err := pgconn.ParseConfig(c.URL); err != nil {
		// pgconn's parse errors can quote the string; never echo it.
		bad("url", "cannot be parsed as a PostgreSQL connection string or URL")
	}
	if reason := outboxschema.CheckSlotName(c.Slot); reason != "" {
		bad("slot", "%q %s: use 1-63 lower-case letters, digits or underscores, e.g. outbox_relay", c.Slot, reason)
	}
	// Any name PostgreSQL can hold: it is quoted everywhere it is used
	// (outboxschema.QuoteIdent, PublicationNamesOption), so case, spaces
	// and quotes are kept.
	if reason := outboxschema.CheckName(c.Publication); reason != "" {
		bad("publication", "%q %s: use at most 63 bytes of UTF-8 text without NUL, e.g. outbox_pub", c.Publication, reason)
	}
	if _, err := outboxschema.ParseTable(c.Table); err != nil {
		var te *outboxschema.TableError
		if errors.As(err, &te) { // the key is already named by the prefix
			bad("table", "%q: %s", te.Input, te.Reason)
		} else {
			bad("table", "%v", err)
		}
	}
	if c.StatusInterval < 10*time.Millisecond || c.StatusInterval > time.Minute {
		bad("status_interval", "%s is out of range: use 10ms..1m (default 1s)", c.StatusInterval)
	}
	if c.ReceiveTimeout < time.Second {
		bad("receive_timeout", "%s is too short: use at least 1s (default 30s)", c.ReceiveTimeout)
	}
	if c.ReconnectMin <= 0 {
		bad("reconnect_min", "%s must be positive (default 200ms)", c.ReconnectMin)
	} else if c.ReconnectMax < c.ReconnectMin {
		bad("reconnect_max", "%s is below reconnect_min %s: need reconnect_min <= reconnect_max (default 30s)", c.ReconnectMax, c.ReconnectMin)
	}
	if c.LagPollInterval < 100*time.Millisecond {
		bad("lag_poll_interval", "%s is too short: use at least 100ms (default 5s)", c.LagPollInterval)
	}
	return errors.Join(errs...)
}

// RedactURL returns the connection string with any password replaced, for
// logs and errors.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	// A URL that does not parse, or the keyword=value form: mask by pattern.
	s = urlUserinfoRe.ReplaceAllString(s, "${1}xxxxx@")
	return passwordKVRe.ReplaceAllString(s, "${1}xxxxx")
}

var (
	urlUserinfoRe = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)
	passwordKVRe  = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]+)`)
)
