package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/internal/pg"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/retention"
)

// logRetention logs the effective retention at start, and warns when
// retention.keep is too short to debug or replay anything.
func logRetention(cfg Config, log zerolog.Logger) {
	log.Info().Dur("keep", cfg.Retention.Keep).Dur("interval", cfg.Retention.Interval).Int("batch_size", cfg.Retention.BatchSize).
		Bool("archive", cfg.Retention.Archive).Msg("retention: " + cfg.Retention.Describe())
	if cfg.Retention.ShortKeep() {
		log.Warn().Dur("keep", cfg.Retention.Keep).Msg(retention.ShortKeepWarning)
	}
}

// preparePartitioned is migrate's part for a partitioned outbox and the
// archive: the publication publishes through the root (unless a slot
// already streams it: then pgsetup.Prepare says what to do), and the
// archive table exists when retention.archive is on.
func preparePartitioned(ctx context.Context, conn *pgx.Conn, cfg Config, tbl outboxschema.Table, log zerolog.Logger) error {
	parted, err := retention.IsPartitioned(ctx, conn, tbl)
	if err != nil {
		return err
	}
	if parted {
		var slot bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", cfg.Postgres.Slot).Scan(&slot); err != nil {
			return err
		}
		if !slot {
			if _, err := conn.Exec(ctx, pgsetup.PublishViaRootSQL(cfg.Postgres.Publication)); err != nil {
				return fmt.Errorf("set publish_via_partition_root on publication %q: %w", cfg.Postgres.Publication, err)
			}
		}
	} else if cfg.Postgres.Partition != retention.PartitionNone {
		log.Warn().Str("table", tbl.String()).Str("partition", cfg.Postgres.Partition).
			Msg("postgres.partition applies only when migrate creates the outbox table; the existing table is not partitioned and is left as it is")
	}
	if cfg.Retention.Archive {
		return retention.EnsureArchive(ctx, conn, tbl, log)
	}
	return nil
}

// cleanupCommand is `outbox-relay cleanup [--dry-run]`: one horizon
// sample, then the retention run now (package retention does the work).
func cleanupCommand() command {
	a := &cleanupArgs{}
	return command{usage: "usage: outbox-relay cleanup [--dry-run] [config flags]", flags: a.flags, ownTable: true, run: a.run}
}

// cleanupArgs are cleanup's own flags.
type cleanupArgs struct{ dryRun bool }

func (a *cleanupArgs) flags(fs *flag.FlagSet) {
	fs.BoolVar(&a.dryRun, "dry-run", false, "count what would be removed and why the other old rows stay; change nothing")
}

// run removes (with --dry-run, counts) the delivered rows older than
// retention.keep and writes what it did.
func (a *cleanupArgs) run(ctx context.Context, cfg Config, stdout, stderr io.Writer, log zerolog.Logger) int {
	tbl, _ := outboxschema.ParseTable(cfg.Postgres.Table) // valid: loadConfig checked it
	c, err := retention.New(cfg.Retention, retention.Horizon{Table: tbl, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication}, nil, nil, log)
	if err != nil {
		fmt.Fprintf(stderr, "invalid configuration:\n%v\n", indent(err))
		return exitConfig
	}
	if cfg.Retention.Keep == 0 {
		fmt.Fprintf(stderr, "cleanup refused: %v\n", retention.ErrKeepForever)
		return exitFatal
	}
	conn, err := pg.Connect(ctx, cfg.Postgres.URL)
	if err != nil {
		fmt.Fprintf(stderr, "cleanup: connect to postgres: %v\n", err)
		return exitFatal
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rep, err := c.Once(ctx, conn, a.dryRun)
	var paused *retention.PausedError
	switch {
	case errors.As(err, &paused):
		fmt.Fprintf(stderr, "cleanup refused: %v\n", err)
		return exitFatal
	case err != nil:
		fmt.Fprintf(stderr, "cleanup of %s failed: %v\n", tbl, err)
		return exitFatal
	}
	fmt.Fprint(stdout, rep.Summary(tbl, cfg.Retention, a.dryRun))
	return exitOK
}
