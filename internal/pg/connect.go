// Package pg opens the relay's connections to PostgreSQL: a normal one
// (Connect) and a replication one (ConnectReplication), both with a bounded
// connect and connection errors that retrying cannot fix marked
// fault.Fatal; IdentifySystem, which server history a URL reaches; and
// Keeper, which keeps one normal connection open for a job that runs again
// and again (heartbeats, lag polls, slot saves, retention).
package pg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/fault"
	"github.com/outbox-relay/outbox-relay/internal/rawconn"
)

// Connect opens a normal (non-replication) connection with the default
// connect timeout unless the URL sets one. Any goroutine; it blocks until
// the server answers, the connect timeout passes or ctx ends. An invalid
// URL, or a run-time parameter the server does not know, is fault.Fatal.
func Connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fault.Fatal.Wrap(errors.New("parse postgres.url: not a valid connection string"))
	}
	withConnectTimeout(&cc.Config)
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, connectError(err)
	}
	return conn, nil
}

// ConnectReplication opens a replication connection (replication=database,
// application_name outbox-relay) to url, its socket wrapped by
// internal/rawconn, and the server's bytes read through wrap (nil:
// directly). Any goroutine; it blocks like Connect. A role without the
// REPLICATION attribute gets an error saying how to grant it (fatal, see
// fault.KindOf).
func ConnectReplication(ctx context.Context, url string, wrap func(io.Reader) io.Reader) (*pgconn.PgConn, error) {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fault.Fatal.Wrap(errors.New("parse postgres.url: not a valid connection string"))
	}
	withConnectTimeout(pc)
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = "outbox-relay"
	dial := pc.DialFunc
	pc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return rawconn.Wrap(c), nil
	}
	if wrap != nil {
		pc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend { return pgproto3.NewFrontend(wrap(r), w) }
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if fault.IsPrivilege(err) { // fatal (fault.KindOf); only here is the missing grant known
		return nil, fmt.Errorf("open replication connection as %q: %w; grant it with ALTER ROLE %s REPLICATION (and allow it in pg_hba.conf for the replication database)",
			pc.User, err, pgx.Identifier{pc.User}.Sanitize())
	}
	if err != nil {
		return nil, fmt.Errorf("open replication connection: %w", connectError(err))
	}
	return conn, nil
}

// connectError makes a connection error that retrying cannot fix fatal: a
// run-time parameter the server does not know, e.g. in options=-c ... of
// postgres.url. 42704 (undefined_object) is fatal only here, at connect:
// fault.KindOf keeps it transient, because START_REPLICATION on a dropped
// slot says 42704 too, and the next session's Prepare explains that one.
func connectError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42704" {
		return fault.Fatal.Wrap(fmt.Errorf("%w; fix the options in postgres.url", err))
	}
	return err
}

// defaultConnectTimeout bounds a connection attempt whose URL sets no
// connect_timeout, so a blackholed server fails fast and is retried instead
// of hanging for the kernel's TCP timeout.
const defaultConnectTimeout = 10 * time.Second

func withConnectTimeout(c *pgconn.Config) {
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = defaultConnectTimeout
	}
}

// Identity is the WAL history a server is on, as IDENTIFY_SYSTEM reports it:
// the cluster's system identifier and its timeline. A promoted replica has
// its primary's system id and a new timeline; another cluster (a restore
// from backup into a new cluster, a wrong URL) has another system id. The
// zero Identity means not known yet.
type Identity struct {
	SystemID string
	Timeline int32
}

func (i Identity) String() string {
	if i == (Identity{}) {
		return "unknown"
	}
	return fmt.Sprintf("system %s timeline %d", i.SystemID, i.Timeline)
}

// IdentifySystem reads the server's system identifier and timeline over a
// replication connection of its own to url, closed before it returns (the
// stream reads them on its own connection instead; setup explains a
// missing slot with them; delivery: exactly_once checks its checkpoint
// against them). Any goroutine; it blocks for a connection and one
// command.
func IdentifySystem(ctx context.Context, url string) (Identity, error) {
	conn, err := ConnectReplication(ctx, url, nil)
	if err != nil {
		return Identity{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Identity{}, err
	}
	return Identity{SystemID: sys.SystemID, Timeline: sys.Timeline}, nil
}
