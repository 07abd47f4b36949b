package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/internal/metric"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// HeartbeatConfig is the heartbeat part of the relay's configuration
// (heartbeat.*).
type HeartbeatConfig struct {
	// Interval is how often the leader writes a heartbeat into the WAL
	// (pg_logical_emit_message) to time outbox_relay_lag_seconds; 0 turns
	// heartbeats off.
	Interval time.Duration `yaml:"interval"`
}

// DefaultHeartbeatConfig returns the defaults documented in the README.
func DefaultHeartbeatConfig() HeartbeatConfig { return HeartbeatConfig{Interval: time.Second} }

// Validate names the key under prefix (e.g. "heartbeat.").
func (c HeartbeatConfig) Validate(prefix string) error {
	if c.Interval != 0 && (c.Interval < 100*time.Millisecond || c.Interval > time.Minute) {
		return fmt.Errorf("%sinterval: %s is out of range: use 100ms..1m, or 0 to turn heartbeats off (default 1s)", prefix, c.Interval)
	}
	return nil
}

// HeartbeatPrefix is the pg_logical_emit_message prefix of the heartbeats
// of slot: other applications' messages, and other relays' (other slots),
// have other prefixes. Pure: any goroutine, never blocks.
func HeartbeatPrefix(slot string) string { return "outbox-relay/" + slot }

// messagesMinVersion is the first PostgreSQL major version whose pgoutput
// takes the messages option (with any proto_version).
const messagesMinVersion = 14

// pluginArgs returns pgoutput's options for a server reporting version
// (its server_version parameter), asking for Messages when messages is set
// and the server has the option, and for streaming of in-progress
// transactions (protocol 2) as streaming (Config.Streaming) says. ok is
// false when Messages were wanted but the server is too old (or its
// version unknown); streamed tells whether streaming is on. An error
// means streaming "on" on a server without it.
func pluginArgs(publication, version string, messages bool, streaming string) (args []string, ok, streamed bool, err error) {
	major := majorVersion(version)
	streamed = major >= streamingMinVersion && (streaming == StreamingOn || streaming == StreamingAuto)
	if streaming == StreamingOn && !streamed {
		return nil, false, false, fault.Fatal.Wrap(fmt.Errorf(
			"postgres.streaming is on, but PostgreSQL %q cannot stream in-progress transactions (it needs 14 or later): set postgres.streaming to auto or off", version))
	}
	proto := "proto_version '1'"
	if streamed {
		proto = "proto_version '2'"
	}
	args = []string{proto, outboxschema.PublicationNamesOption(publication)}
	if streamed {
		args = append(args, "streaming 'on'")
	}
	if !messages {
		return args, true, streamed, nil
	}
	if major < messagesMinVersion {
		return args, false, streamed, nil
	}
	return append(args, "messages 'true'"), true, streamed, nil
}

// checkMessageEvents refuses messages.prefix (prefix, "" when off) on a
// server (its server_version) whose pgoutput cannot send logical decoding
// messages: no message event would ever be published.
func checkMessageEvents(prefix, version string) error {
	if prefix == "" || majorVersion(version) >= messagesMinVersion {
		return nil
	}
	return fault.Fatal.Wrap(fmt.Errorf("messages.prefix is set, but PostgreSQL %q cannot stream logical decoding messages "+
		"(pgoutput's messages option needs PostgreSQL 14 or later), so no message event would ever be published: "+
		"upgrade PostgreSQL, or unset messages.prefix and write events into the outbox table (outbox.Write)", version))
}

// streamingMinVersion is the first PostgreSQL whose pgoutput streams
// in-progress transactions (protocol version 2).
const streamingMinVersion = 14

// majorVersion reads the leading number of a server_version such as
// "15.18 (Debian ...)", "17beta1" or "9.6.24" (the major is then 9, older
// than anything with messages); 0 when there is none.
func majorVersion(v string) int {
	n := 0
	for i := 0; i < len(v) && v[i] >= '0' && v[i] <= '9' && n < 1000; i++ {
		n = n*10 + int(v[i]-'0')
	}
	return n
}

// HeartbeatMetrics count heartbeats. They live as long as the process:
// build them once with NewHeartbeatMetrics and give them to every term's
// Heartbeater. Safe for concurrent use.
type HeartbeatMetrics struct{ counts }

// NewHeartbeatMetrics registers the counters on reg (nil: unregistered).
// Any goroutine; does not block.
func NewHeartbeatMetrics(reg prometheus.Registerer) *HeartbeatMetrics {
	return &HeartbeatMetrics{newCounts(reg,
		metric.Counter("outbox_relay_heartbeats_total",
			"Heartbeats written into the WAL by the leader (pg_logical_emit_message) to time outbox_relay_lag_seconds."),
		metric.Counter("outbox_relay_heartbeat_errors_total",
			"Failed heartbeat writes (connection or query errors, a refused pg_logical_emit_message); while they fail, outbox_relay_lag_seconds cannot see events not yet read."))}
}

// Heartbeater writes a heartbeat into the WAL every interval on a normal
// connection: pg_logical_emit_message(false, HeartbeatPrefix(slot), <local
// Unix nanos>), non-transactional, so the record has no xid and is decoded
// at its own WAL position through the slot. Each written heartbeat is
// handed to Emitted with its record's end LSN and the local time it
// carries. NewHeartbeater allocates; Run writes until ctx ends, on a
// pg.Keeper: after an error it reconnects with backoff (interval doubling
// up to max(interval, 30s)), logging an outage once (a refusal that will
// not fix itself, at Error with its fix). It never stops the relay and
// never blocks the replication stream. The leader's term runs one.
type Heartbeater struct {
	url, prefix string
	interval    time.Duration
	emitted     func(end pglogrepl.LSN, sent time.Time)
	log         zerolog.Logger
	m           *HeartbeatMetrics
}

// NewHeartbeater allocates; it does not connect. emitted is called from
// Run's goroutine, in emission order, and must not block. m may be nil
// (unregistered counters). Any goroutine; does not block.
func NewHeartbeater(cfg Config, interval time.Duration, emitted func(end pglogrepl.LSN, sent time.Time), log zerolog.Logger, m *HeartbeatMetrics) *Heartbeater {
	if m == nil {
		m = NewHeartbeatMetrics(nil)
	}
	return &Heartbeater{url: cfg.URL, prefix: HeartbeatPrefix(cfg.Slot), interval: interval, emitted: emitted, m: m,
		log: log.With().Str("component", "heartbeat").Logger()} // the caller's logger carries slot
}

// heartbeatQuery writes one heartbeat; text arguments pick the text
// overload of the function.
const heartbeatQuery = "SELECT pg_logical_emit_message(false, $1::text, $2::text)::text"

// Run writes heartbeats until ctx ends, then returns nil. It blocks;
// call it once, from the term's goroutine for it.
func (h *Heartbeater) Run(ctx context.Context) error {
	hinted := ""
	pg.NewKeeper(pg.KeeperConfig{
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pg.Connect(ctx, h.url) },
		Every:   h.interval, Ticked: true,
		Retry: backoff.Policy{Initial: h.interval, Max: max(h.interval, 30*time.Second)},
		Done:  h.m.done, Errors: h.m.errors,
		Failed: func(f pg.Failure) {
			switch hint := heartbeatHint(f.Err); {
			case hint != "" && hint != hinted:
				// Said once, clearly: it will not fix itself.
				hinted = hint
				h.log.Error().Err(f.Err).Msg("heartbeats refused: outbox_relay_lag_seconds shows only events already read (like outbox_relay_oldest_unacked_seconds); " + hint)
			case f.First:
				h.log.Warn().Err(f.Err).Dur("retry_in", f.Wait).Msg("heartbeat failed; retrying (outbox_relay_heartbeat_errors_total)")
			default:
				h.log.Debug().Err(f.Err).Dur("retry_in", f.Wait).Msg("heartbeat failed")
			}
		},
		Recovered: func() {
			h.log.Info().Msg("heartbeats written again")
			hinted = ""
		},
	}).Run(ctx, h.beat)
	return nil
}

// beat writes one heartbeat on conn.
func (h *Heartbeater) beat(ctx context.Context, conn *pgx.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, max(h.interval, 5*time.Second))
	defer cancel()
	sent := time.Now()
	var end string
	if err := conn.QueryRow(qctx, heartbeatQuery, h.prefix, strconv.FormatInt(sent.UnixNano(), 10)).Scan(&end); err != nil {
		return fmt.Errorf("write heartbeat (pg_logical_emit_message): %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(end)
	if err != nil {
		return fmt.Errorf("read heartbeat position %q: %w", end, err)
	}
	h.emitted(lsn, sent)
	return nil
}

// heartbeatHint says what to do about an error that retrying cannot fix;
// "" for the others.
func heartbeatHint(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "42501": // insufficient_privilege: EXECUTE was revoked from PUBLIC
		return "grant it: GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO <the relay's role> " +
			"(PostgreSQL 17+: pg_logical_emit_message(boolean, text, text, boolean)) " +
			"(PUBLIC may execute it by default; someone revoked that), or set heartbeat.interval: 0"
	case "25006": // read_only_sql_transaction: a standby in recovery
		return "postgres.url must reach the primary: a server in recovery writes no WAL"
	}
	return ""
}
