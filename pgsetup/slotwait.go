package pgsetup

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/outboxschema"
)

// Creating a logical slot waits until every transaction holding a
// transaction id (xid) when it started has ended, in every database of the
// cluster (the slot's snapshot is built from the running-transactions
// records, which know no databases), and then again for those running when
// the first ones ended. A prepared transaction nobody commits, or a
// session idle in a transaction that wrote, makes it wait for ever, and
// the server says nothing. While the slot is created, a watch on its own
// connection says every few seconds what holds an xid, and what to do.

// Pace of the watch's reports: the first after slotWaitFirst, then every
// slotWaitEvery. The sessions listed are those whose transaction has held
// an xid for at least the time waited so far, up to slotWaitEvery: the
// ones that began before the creation, or have run for a while since.
const (
	slotWaitFirst = 3 * time.Second
	slotWaitEvery = 5 * time.Second
)

// maxListed bounds the transactions one report or check line names.
const maxListed = 10

// XidHolder is one transaction holding an xid: a prepared transaction
// (pg_prepared_xacts) or a session's (pg_stat_activity, backend_xid set).
// A plain value.
type XidHolder struct {
	Prepared bool
	GID      string // the prepared transaction's global id
	PID      int32  // the session's backend pid
	User     string // the prepared transaction's owner, or the session's user
	Database string
	App      string // the session's application_name
	State    string // the session's state (active, idle in transaction, ...)
	Query    string // the session's current or last statement, its first 100 characters
	// Age is how long ago the transaction was prepared, or began; unknown
	// (AgeKnown false) for a session of another role when the reading role
	// lacks pg_read_all_stats.
	Age      time.Duration
	AgeKnown bool
}

// String names the transaction and says how to end it: Describe, then
// Fix.
func (h XidHolder) String() string { return h.Describe() + ": " + h.Fix() }

// Describe names the transaction, with its age.
func (h XidHolder) Describe() string {
	switch {
	case h.Prepared:
		return fmt.Sprintf("prepared transaction %s (database %s, owner %s, prepared %s ago)", outboxschema.QuoteLiteral(h.GID), h.Database, h.User, age(h.Age))
	case !h.AgeKnown:
		return fmt.Sprintf("session pid %d (user %s, database %s; its transaction is hidden from this role: GRANT pg_read_all_stats to it to see more)", h.PID, h.User, h.Database)
	}
	return fmt.Sprintf("session pid %d (user %s, database %s, application %q, %s, transaction open %s, query %q)", h.PID, h.User, h.Database, h.App, h.State, age(h.Age), h.Query)
}

// Fix says how to end the transaction.
func (h XidHolder) Fix() string {
	if h.Prepared {
		gid := outboxschema.QuoteLiteral(h.GID)
		return fmt.Sprintf("COMMIT PREPARED %s or ROLLBACK PREPARED %s, connected to database %s", gid, gid, h.Database)
	}
	return fmt.Sprintf("finish or terminate pid %d: SELECT pg_terminate_backend(%d)", h.PID, h.PID)
}

// age formats d to the second.
func age(d time.Duration) string { return d.Round(time.Second).String() }

// ReadXidHolders reads the transactions holding an xid now, in every
// database of the cluster: the prepared ones, then the sessions', each
// oldest first. The session of conn itself and that of pid exclude (0:
// none) are left out. Any goroutine (conn is the caller's); it blocks for
// two queries.
func ReadXidHolders(ctx context.Context, conn *pgx.Conn, exclude int32) ([]XidHolder, error) {
	rows, err := conn.Query(ctx, `SELECT gid, coalesce(owner::text, ''), coalesce(database::text, ''),
		extract(epoch FROM clock_timestamp() - prepared)::float8
		FROM pg_prepared_xacts ORDER BY prepared`)
	if err != nil {
		return nil, fmt.Errorf("read pg_prepared_xacts: %w", err)
	}
	var hs []XidHolder
	for rows.Next() {
		h := XidHolder{Prepared: true, AgeKnown: true}
		var secs float64
		if err := rows.Scan(&h.GID, &h.User, &h.Database, &secs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read pg_prepared_xacts: %w", err)
		}
		h.Age = time.Duration(secs * float64(time.Second))
		hs = append(hs, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pg_prepared_xacts: %w", err)
	}
	// Without pg_read_all_stats, another role's session shows its xid but
	// not its transaction: xact_start and the rest are NULL.
	rows, err = conn.Query(ctx, `SELECT pid, coalesce(usename::text, ''), coalesce(datname::text, ''),
		coalesce(application_name, ''), coalesce(state, ''), regexp_replace(left(coalesce(query, ''), 100), '\s+', ' ', 'g'),
		extract(epoch FROM clock_timestamp() - xact_start)::float8
		FROM pg_stat_activity
		WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() AND pid <> $1
		ORDER BY xact_start NULLS FIRST`, exclude)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_activity: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var h XidHolder
		var secs *float64
		if err := rows.Scan(&h.PID, &h.User, &h.Database, &h.App, &h.State, &h.Query, &secs); err != nil {
			return nil, fmt.Errorf("read pg_stat_activity: %w", err)
		}
		if secs != nil {
			h.Age, h.AgeKnown = time.Duration(*secs*float64(time.Second)), true
		}
		hs = append(hs, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pg_stat_activity: %w", err)
	}
	return hs, nil
}

// blocking keeps of hs those a slot creation that has waited so long may
// be waiting for: every prepared transaction, and the sessions whose
// transaction has held its xid for min(waited, slotWaitEvery) or more (or
// is hidden). Pure.
func blocking(hs []XidHolder, waited time.Duration) []XidHolder {
	least := min(waited, slotWaitEvery)
	var out []XidHolder
	for _, h := range hs {
		if h.Prepared || !h.AgeKnown || h.Age >= least {
			out = append(out, h)
		}
	}
	return out
}

// ListXidHolders joins what text says of each of hs (e.g.
// XidHolder.String) with "; ", at most maxListed of them, then counts the
// rest. Pure.
func ListXidHolders(hs []XidHolder, text func(XidHolder) string) string {
	var ds []string
	for i, h := range hs {
		if i == maxListed {
			ds = append(ds, fmt.Sprintf("and %d more (SELECT * FROM pg_prepared_xacts; SELECT * FROM pg_stat_activity WHERE backend_xid IS NOT NULL)", len(hs)-maxListed))
			break
		}
		ds = append(ds, text(h))
	}
	return strings.Join(ds, "; ")
}

// waitWhy is what a slot creation waits for, with hs holding an xid now.
func waitWhy(hs []XidHolder) string {
	const rule = "a new logical slot is ready only once every transaction holding an xid when it started has ended, in every database of the cluster"
	if len(hs) == 0 {
		return rule + "; none has held one for long now, so it should end soon (if not: SELECT * FROM pg_prepared_xacts; SELECT * FROM pg_stat_activity WHERE backend_xid IS NOT NULL)"
	}
	return rule + "; holding one now: " + ListXidHolders(hs, XidHolder.String)
}

// slotWatch says, while a slot is being created, what the creation waits
// for: a warning every slotWaitEvery, and, when the creation is given up,
// the last of them for its error.
type slotWatch struct {
	url, slot string
	pid       int32 // the creating walsender, left out of the sessions
	start     time.Time
	log       zerolog.Logger

	mu   sync.Mutex
	last string        // the last report's waitWhy; "" before the first
	at   time.Duration // waited at that report
}

// run reports until ctx ends, on its own connection (pg.Keeper): a failing
// connection or query is logged once and retried, never an error. It
// blocks; call it once, on its own goroutine.
func (w *slotWatch) run(ctx context.Context) {
	if backoff.Sleep(ctx, slotWaitFirst) != nil {
		return
	}
	pg.NewKeeper(pg.KeeperConfig{
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pg.Connect(ctx, w.url) },
		Every:   slotWaitEvery,
		Failed: func(f pg.Failure) {
			if f.First {
				w.log.Warn().Err(f.Err).Str("slot", w.slot).Dur("waited", time.Since(w.start).Round(time.Second)).
					Msg("creating the slot takes long, and what it waits for cannot be read (pg_prepared_xacts, pg_stat_activity); retrying")
			}
		},
	}).Run(ctx, w.report)
}

func (w *slotWatch) report(ctx context.Context, conn *pgx.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, slotWaitEvery)
	defer cancel()
	hs, err := ReadXidHolders(qctx, conn, w.pid)
	if err != nil {
		return err
	}
	waited := time.Since(w.start)
	hs = blocking(hs, waited)
	why := waitWhy(hs)
	w.mu.Lock()
	w.last, w.at = why, waited
	w.mu.Unlock()
	prepared := 0
	for _, h := range hs {
		if h.Prepared {
			prepared++
		}
	}
	w.log.Warn().Str("slot", w.slot).Dur("waited", waited.Round(time.Second)).Int("prepared_xacts", prepared).Int("sessions", len(hs)-prepared).
		Msg(fmt.Sprintf("creating slot %q has waited %s: %s", w.slot, age(waited), why))
	return nil
}

// gaveUp is the error of a creation given up after err (ctx ended): what
// it waited for, as last reported.
func (w *slotWatch) gaveUp(err error) error {
	w.mu.Lock()
	last, at := w.last, w.at
	w.mu.Unlock()
	waited := age(time.Since(w.start))
	if last == "" {
		return fmt.Errorf("create slot %q: gave up after %s, waiting for the transactions holding an xid to end (see pg_prepared_xacts and pg_stat_activity WHERE backend_xid IS NOT NULL): %w", w.slot, waited, err)
	}
	return fmt.Errorf("create slot %q: gave up after %s: %s (as read at %s): %w", w.slot, waited, last, age(at), err)
}
