package pgsetup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/report"
)

// FailoverFacts is what the server says about phantom events: events the
// relay publishes that a failover can then lose, because the standby that
// is promoted never had their commit. `check` and `status` read them with
// ReadFailover and judge them with FailoverChecks. JSON names are stable
// (docs/commands.md).
type FailoverFacts struct {
	VersionNum int  `json:"server_version_num"`
	SlotExists bool `json:"slot_exists"`
	// SlotFailover is the failover flag of the relay's slot (17+).
	SlotFailover bool `json:"slot_failover"`
	// SynchronizedStandbySlots is the server's setting; nil before 17.
	SynchronizedStandbySlots *string `json:"synchronized_standby_slots"`
	// SyncSlots are the slots the setting names, StandbySlots those of
	// postgres.standby_slots, each as the server has it.
	SyncSlots    []StandbySlot `json:"synchronized_slots,omitempty"`
	StandbySlots []StandbySlot `json:"standby_slots,omitempty"`
	// PhysicalSlots are the server's physical slots, active ones first:
	// the names a fix can offer.
	PhysicalSlots []string `json:"physical_slots"`
	// Standbys counts the walsenders of physical replication: streaming
	// standbys, with or without a slot.
	Standbys int    `json:"standbys"`
	Error    string `json:"error,omitempty"`
}

// RowQuerier runs queries of one row and of many: a *pgx.Conn.
type RowQuerier interface {
	Querier
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadFailover reads the failover facts of slot and of the standby slots
// of postgres.standby_slots (standbySlots). A failed read is recorded in
// Error, never returned. It blocks for a few queries.
func ReadFailover(ctx context.Context, q RowQuerier, slot string, standbySlots []string) FailoverFacts {
	f, err := readFailover(ctx, q, slot, standbySlots)
	if err != nil {
		f.Error = err.Error()
	}
	return f
}

func readFailover(ctx context.Context, q RowQuerier, slot string, standbySlots []string) (FailoverFacts, error) {
	var f FailoverFacts
	if err := q.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&f.VersionNum); err != nil {
		return f, fmt.Errorf("read server_version_num: %w", err)
	}
	flag := "false"
	if f.VersionNum >= failoverVersion {
		flag = "failover"
		var setting string
		if err := q.QueryRow(ctx, "SELECT current_setting('synchronized_standby_slots')").Scan(&setting); err != nil {
			return f, fmt.Errorf("read synchronized_standby_slots: %w", err)
		}
		f.SynchronizedStandbySlots = &setting
	}
	err := q.QueryRow(ctx, "SELECT "+flag+" FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&f.SlotFailover)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return f, fmt.Errorf("read slot %q: %w", slot, err)
	default:
		f.SlotExists = true
	}
	if err := q.QueryRow(ctx, `SELECT coalesce(array_agg(slot_name::text ORDER BY active DESC, slot_name), '{}')
		FROM pg_replication_slots WHERE slot_type = 'physical'`).Scan(&f.PhysicalSlots); err != nil {
		return f, fmt.Errorf("read the physical slots: %w", err)
	}
	// A logical walsender always holds its slot: the others stream WAL.
	if err := q.QueryRow(ctx, `SELECT count(*)::int FROM pg_stat_replication r
		WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical')`).Scan(&f.Standbys); err != nil {
		return f, fmt.Errorf("read pg_stat_replication: %w", err)
	}
	if f.SynchronizedStandbySlots != nil {
		if names := splitSetting(*f.SynchronizedStandbySlots); len(names) > 0 {
			if f.SyncSlots, err = ReadStandbySlots(ctx, q, names); err != nil {
				return f, err
			}
		}
	}
	if len(standbySlots) > 0 {
		if f.StandbySlots, err = ReadStandbySlots(ctx, q, standbySlots); err != nil {
			return f, err
		}
	}
	return f, nil
}

// FailoverOptions are the settings FailoverChecks judges the facts against.
type FailoverOptions struct {
	Slot         string   // postgres.slot
	SlotFailover bool     // postgres.slot_failover
	StandbySlots []string // postgres.standby_slots
	// Advise adds the check "failover" when neither protection is on,
	// saying whether phantom events are possible and how to prevent them
	// (`check` does; `status` reports only what is configured).
	Advise bool
}

// Names of the failover checks (stable: docs/commands.md).
const (
	CheckFailover              = "failover"
	CheckFailoverSlot          = "failover.slot"
	CheckFailoverSyncSlots     = "failover.synchronized_standby_slots"
	CheckFailoverStandbySlots  = "failover.standby_slots"
	keyStandbySlots            = "postgres.standby_slots"
	keySynchronizedStandbySlot = "synchronized_standby_slots"
)

// FailoverChecks judges f: whether an event the relay publishes can be
// missing from the history of a standby promoted later (a phantom event),
// and whether the protection configured works. bad is the caller's worst
// verdict (check's Fail, status's Bad). Pure.
func FailoverChecks(f FailoverFacts, o FailoverOptions, bad report.Verdict) []report.Check {
	var cs []report.Check
	add := func(name string, v report.Verdict, value, fix string) {
		cs = append(cs, report.Check{Name: name, Verdict: v, Value: value, Fix: fix})
	}
	if f.Error != "" {
		if o.SlotFailover || len(o.StandbySlots) > 0 || o.Advise {
			add(CheckFailover, bad, "unknown: "+f.Error, "grant the role pg_monitor (or SELECT on pg_replication_slots and pg_stat_replication)")
		}
		return cs
	}
	v17 := f.VersionNum >= failoverVersion
	standbySlotsFix := fmt.Sprintf("postgres.standby_slots: [%s] (OUTBOX_RELAY_STANDBY_SLOTS=%s): the relay publishes a transaction only once those standbys flushed it",
		slotList(f.PhysicalSlots, ", "), slotList(f.PhysicalSlots, ","))
	syncFix := fmt.Sprintf("ALTER SYSTEM SET synchronized_standby_slots = '%s'; SELECT pg_reload_conf();", slotList(f.PhysicalSlots, ","))
	switch {
	case o.SlotFailover && !v17:
		add(CheckFailoverSlot, bad, fmt.Sprintf("postgres.slot_failover is on, but failover slots need PostgreSQL 17 (server_version_num %d): the relay refuses to start", f.VersionNum),
			"set postgres.slot_failover: false; against phantom events set "+standbySlotsFix)
	case o.SlotFailover:
		switch {
		case !f.SlotExists:
			add(CheckFailoverSlot, report.OK, fmt.Sprintf("slot %s does not exist yet: `outbox-relay migrate` or the relay's first start creates it as a failover slot", o.Slot), "")
		case !f.SlotFailover:
			add(CheckFailoverSlot, report.Warn, fmt.Sprintf("slot %s is not a failover slot: no standby keeps a copy, a failover loses it", o.Slot),
				fmt.Sprintf("start the relay with postgres.slot_failover (it runs ALTER_REPLICATION_SLOT %s (FAILOVER true)), or run that on a replication connection: psql \"<postgres.url> replication=database\" -c 'ALTER_REPLICATION_SLOT %s (FAILOVER true)'", o.Slot, o.Slot))
		default:
			add(CheckFailoverSlot, report.OK, fmt.Sprintf("slot %s is a failover slot: standbys with sync_replication_slots keep a copy", o.Slot), "")
		}
		cs = append(cs, syncSlotsCheck(f, o, bad, syncFix))
	}
	if len(o.StandbySlots) > 0 {
		cs = append(cs, slotsCheck(CheckFailoverStandbySlots, keyStandbySlots, f.StandbySlots, bad,
			"the relay publishes nothing before each standby has flushed it"))
	}
	if o.Advise && !o.SlotFailover && len(o.StandbySlots) == 0 {
		risk := "phantom events are possible: the relay can publish a transaction before a standby has it; if the primary fails then, the promoted standby's history lacks it while Kafka has it (and its id may be used again)"
		fix := "set " + standbySlotsFix
		if v17 {
			fix = "either set postgres.slot_failover: true (OUTBOX_RELAY_SLOT_FAILOVER=true) and on this server " + syncFix + " (the server then decodes nothing a standby lacks), or " + fix
		}
		fix += " (docs/failover.md)"
		if f.Standbys == 0 && len(f.PhysicalSlots) == 0 {
			add(CheckFailover, report.OK, "no standby streams from this server; once one does, "+risk+": "+fix, "")
		} else {
			add(CheckFailover, report.Warn, fmt.Sprintf("%d standby(s) stream from this server (physical slots: %s) while postgres.slot_failover is off and postgres.standby_slots unset: %s",
				f.Standbys, slotList(f.PhysicalSlots, ", "), risk), fix)
		}
	}
	return cs
}

// syncSlotsCheck judges synchronized_standby_slots for a failover slot.
func syncSlotsCheck(f FailoverFacts, o FailoverOptions, bad report.Verdict, syncFix string) report.Check {
	if len(f.SyncSlots) == 0 {
		c := report.Check{Name: CheckFailoverSyncSlots}
		if len(o.StandbySlots) > 0 {
			c.Verdict, c.Value = report.OK, "empty: postgres.standby_slots keeps the relay from publishing what the standbys lack instead"
			return c
		}
		c.Verdict = report.Warn
		c.Value = "empty: the relay can receive and publish transactions no standby has yet; after a failover they are not in the promoted standby's history (phantom events), and its synced slot may be behind them"
		c.Fix = syncFix + " (the physical slots of the standbys that may be promoted), or set postgres.standby_slots (docs/failover.md)"
		return c
	}
	return slotsCheck(CheckFailoverSyncSlots, keySynchronizedStandbySlot, f.SyncSlots, bad,
		"the server decodes nothing for the relay before each standby has it")
}

// slotsCheck judges the standby slots a setting (key) names: each must be
// an active physical slot; a missing, logical or invalidated one is bad
// (the relay stalls until it is fixed, or refuses to start), an inactive
// one a warning (the relay waits while that standby is down and behind).
func slotsCheck(name, key string, slots []StandbySlot, bad report.Verdict, ok string) report.Check {
	c := report.Check{Name: name, Verdict: report.OK}
	var vals, fixes []string
	for _, s := range slots {
		vals = append(vals, s.Describe())
		p := s.Problem()
		if p == "" {
			continue
		}
		v := bad
		if p == SlotInactive {
			v = report.Warn
		}
		if v == bad || c.Verdict == report.OK {
			c.Verdict = v
		}
		fixes = append(fixes, s.Name+": "+StandbyFix(key, s.Name, p))
	}
	c.Value = strings.Join(vals, "; ")
	switch c.Verdict {
	case report.OK:
		c.Value += ": " + ok
	case report.Warn:
		c.Value += ": while that standby is down and behind the relay publishes nothing"
	default:
		c.Value += ": the relay publishes nothing until this is fixed"
	}
	c.Fix = strings.Join(fixes, "; ")
	return c
}

// slotList joins names for a fix, or names the placeholder.
func slotList(names []string, sep string) string {
	if len(names) == 0 {
		return "<physical slot of each standby>"
	}
	return strings.Join(names, sep)
}
