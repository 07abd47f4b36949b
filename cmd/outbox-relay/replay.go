package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rs/zerolog"

	"github.com/outbox-relay/outbox-relay/encode"
	"github.com/outbox-relay/outbox-relay/replay"
)

// replayCommand is `outbox-relay replay` with the relay's own config
// (file, env, flags): it finds the same table and publishes like the relay.
func replayCommand() command {
	a := &replayArgs{}
	return command{usage: "usage: " + replay.Usage, flags: a.flags, args: a.check, ownTable: true, run: a.run}
}

// replayArgs are replay's own flags (package replay binds and checks them).
type replayArgs struct {
	opts func() (replay.Options, error)
	o    replay.Options
}

func (a *replayArgs) flags(fs *flag.FlagSet) { a.opts = replay.Bind(fs) }

func (a *replayArgs) check() (err error) {
	a.o, err = a.opts()
	return err
}

func (a *replayArgs) run(ctx context.Context, cfg Config, _, stderr io.Writer, log zerolog.Logger) int {
	return runReplay(ctx, cfg, a.o, stderr, log)
}

// runReplay republishes the rows o selects, its progress on stderr.
func runReplay(ctx context.Context, cfg Config, o replay.Options, stderr io.Writer, log zerolog.Logger) int {
	deps := replay.Deps{Log: log, Progress: stderr, Terminal: isTerminal(stderr)}
	// The records in their topic's format, as the relay writes them.
	enc, err := encode.New(cfg.Encoding(), log, nil)
	if err != nil {
		fmt.Fprintln(stderr, "replay:", err)
		return exitConfig
	}
	if enc != nil {
		defer enc.Close()
		deps.Encoder = enc
	}
	r, err := replay.New(replayConfig(cfg), o, deps)
	if err != nil {
		fmt.Fprintln(stderr, "replay:", err)
		return exitConfig
	}
	if _, err := r.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "replay failed:\n%v", indent(err))
		return exitFatal
	}
	return exitOK
}

// replayConfig is what replay takes of the relay's configuration c (which
// loadConfig validated whole).
func replayConfig(c Config) replay.Config {
	return replay.Config{PostgresURL: c.Postgres.URL, Table: c.Postgres.Table, Kafka: c.Kafka, Policy: c.Policy(),
		MaxEvents: c.InFlight.MaxEvents, MaxBytes: c.InFlight.MaxBytes, ShutdownTimeout: c.ShutdownTimeout}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
