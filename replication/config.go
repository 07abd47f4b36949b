// Package replication is the stream: before each session it has
// pgsetup.Prepare check the server, slot and publication, then it runs
// START_REPLICATION on the pgoutput slot, hands every XLogData payload to a
// Handler, and reports the confirmed position back in standby status
// updates. It is the only code that touches the streaming replication
// connection. Beside the stream it runs the leader's helpers on normal
// connections: the Heartbeater, the LagPoller and the SlotSaver.
package replication

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
)

// Config is the replication part of the relay's configuration.
type Config struct {
	// The server, the slot, the publication and the outbox tables
	// (postgres.url, slot, publication, table, create_publication,
	// slot_failover, standby_slots): what pgsetup.Prepare checks before
	// each session.
	pgsetup.Config `yaml:",inline"`
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
	// Partition is how `migrate` creates a missing outbox table: none,
	// or partitioned by range of created_at, daily or monthly.
	Partition string `yaml:"partition"`
	// Streaming asks the server to stream transactions larger than its
	// logical_decoding_work_mem before they commit (pgoutput protocol 2,
	// PostgreSQL 14+), instead of spilling them to disk server-side until
	// the commit: "auto" (when the server has it), "on" (refuse an older
	// server) or "off".
	Streaming string `yaml:"streaming"`
}

// Streaming values.
const (
	StreamingAuto = "auto"
	StreamingOn   = "on"
	StreamingOff  = "off"
)

// DefaultConfig returns the defaults documented in the README. Pure.
func DefaultConfig() Config {
	return Config{
		Config: pgsetup.Config{
			Slot:              "outbox_relay",
			Publication:       "outbox_pub",
			Table:             "public.outbox",
			CreatePublication: true,
		},
		StatusInterval:  time.Second,
		ReceiveTimeout:  30 * time.Second,
		ReconnectMin:    200 * time.Millisecond,
		ReconnectMax:    30 * time.Second,
		LagPollInterval: 5 * time.Second,
		Partition:       "none",
		Streaming:       StreamingAuto,
	}
}

// Validate reports every invalid field, the embedded pgsetup.Config's
// too, each named by its config key under prefix (e.g. "postgres."),
// joined. Pure: any goroutine, never blocks.
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
	for i, n := range c.StandbySlots {
		switch reason := outboxschema.CheckSlotName(n); {
		case reason != "":
			bad("standby_slots", "%q %s: name the physical replication slots of the standbys (primary_slot_name on each), e.g. standby_1", n, reason)
		case n == c.Slot:
			bad("standby_slots", "%q is postgres.slot, the relay's own logical slot: name the physical slots of the standbys", n)
		case slices.Contains(c.StandbySlots[:i], n):
			bad("standby_slots", "%q is listed twice", n)
		}
	}
	switch c.Partition {
	case "none", "daily", "monthly":
	default:
		bad("partition", "%q is not none, daily or monthly (default none; used by migrate when it creates the outbox table)", c.Partition)
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
	switch c.Streaming {
	case StreamingAuto, StreamingOn, StreamingOff:
	default:
		bad("streaming", "%q is not one of auto, on, off (default auto)", c.Streaming)
	}
	return errors.Join(errs...)
}

// RedactURL returns the connection string with every secret replaced by
// xxxxx, for logs and errors: the password in a URL's userinfo and the
// values of password and sslpassword (keywords matched in any case), in
// both forms libpq and pgx read. A URL (scheme://...) has its query
// parameters masked and its fragment dropped (libpq would read it as part
// of the value). Keyword/value strings are tokenized as libpq's
// conninfo_parse does: whitespace around '=', 'quoted values' with
// backslash escapes, and backslash-escaped spaces in unquoted values.
// Malformed input is masked at least as far as libpq would read it: an
// unterminated quoted value to the end, a URL's userinfo to its last '@'.
// Pure: any goroutine, never blocks.
func RedactURL(s string) string {
	if uriPrefixRe.MatchString(s) {
		return redactURI(s)
	}
	return redactKeywordValue(s)
}

const redacted = "xxxxx"

var uriPrefixRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// secretKey reports whether a connection parameter holds a secret.
func secretKey(k string) bool {
	return strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword")
}

func redactURI(s string) string {
	if u, err := url.Parse(s); err == nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
		u.RawQuery = redactQuery(u.RawQuery)
		u.Fragment, u.RawFragment = "", ""
		return u.String()
	}
	// Not a URL Go parses: keep the structure libpq reads. The userinfo
	// password runs from the first ':' to the last '@' (a password may
	// hold '@', '/', '?' or spaces unencoded), the query from the first
	// '?' after that, each value up to the next '&'.
	scheme, rest, _ := strings.Cut(s, "://")
	host := rest
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user := rest[:at]
		if c := strings.IndexByte(user, ':'); c >= 0 {
			user = user[:c+1] + redacted
		}
		host = rest[at+1:]
		rest = user + "@"
	} else {
		rest = ""
	}
	if base, query, ok := strings.Cut(host, "?"); ok {
		host = base + "?" + redactQuery(query)
	}
	return scheme + "://" + rest + host
}

// redactQuery masks the secret parameters of a raw URL query, keeping the
// others and their order as written.
func redactQuery(raw string) string {
	if raw == "" {
		return raw
	}
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		k, _, _ := strings.Cut(p, "=")
		dk, err := url.QueryUnescape(k)
		if secretKey(k) || err == nil && secretKey(dk) {
			parts[i] = k + "=" + redacted
		}
	}
	return strings.Join(parts, "&")
}

// isSpace is C's isspace, which libpq's conninfo_parse uses.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// redactKeywordValue copies a keyword/value connection string, replacing the
// values of secret keywords.
func redactKeywordValue(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		if isSpace(s[i]) {
			b.WriteByte(s[i])
			i++
			continue
		}
		// The keyword runs to '=' or whitespace; then optional whitespace
		// and '='. Without '=', libpq stops with an error: go on with the
		// next word, so a later password is still found.
		k := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[k:i]
		b.WriteString(key)
		j := i
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		if j == len(s) || s[j] != '=' {
			continue
		}
		j++
		for j < len(s) && isSpace(s[j]) {
			j++
		}
		b.WriteString(s[i:j])
		i = j
		v := i
		if i < len(s) && s[i] == '\'' {
			// Quoted: to the next unescaped quote; unterminated, to the end.
			for i++; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			i++
		} else {
			for ; i < len(s) && !isSpace(s[i]); i++ {
				if s[i] == '\\' {
					i++ // the escaped character, a space too, belongs to the value
				}
			}
		}
		i = min(i, len(s))
		if secretKey(key) {
			b.WriteString(redacted)
		} else {
			b.WriteString(s[v:i])
		}
	}
	return b.String()
}
