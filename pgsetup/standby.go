package pgsetup

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/fault"
)

// StandbySlot is a slot named in postgres.standby_slots (or in the
// server's synchronized_standby_slots) as pg_replication_slots shows it. For
// a physical slot restart_lsn is the flush position its standby last
// reported: WAL before it is on the standby's disk. A plain value.
type StandbySlot struct {
	Name      string `json:"name"`
	Exists    bool   `json:"exists"`
	Type      string `json:"type,omitempty"` // physical or logical
	Active    bool   `json:"active"`
	WALStatus string `json:"wal_status,omitempty"`
	// RestartLSN is restart_lsn as text ("" while NULL: no standby has
	// reported yet); Flushed is the same parsed (0 then).
	RestartLSN string        `json:"restart_lsn,omitempty"`
	Flushed    pglogrepl.LSN `json:"-"`
	// LagBytes is pg_current_wal_lsn() - restart_lsn: WAL the standby has
	// not flushed; nil when unknown.
	LagBytes *int64 `json:"lag_bytes"`
}

// What keeps a standby slot from moving (StandbySlot.Problem).
const (
	SlotMissing     = "missing"
	SlotLogical     = "logical"
	SlotInvalidated = "invalidated"
	SlotInactive    = "inactive"
)

// Problem says why s cannot follow the primary's WAL: SlotMissing,
// SlotLogical, SlotInvalidated (wal_status lost), SlotInactive (no standby
// streams from it), or "" for an active physical slot. Pure.
func (s StandbySlot) Problem() string {
	switch {
	case !s.Exists:
		return SlotMissing
	case s.Type != "physical":
		return SlotLogical
	case s.WALStatus == "lost":
		return SlotInvalidated
	case !s.Active:
		return SlotInactive
	}
	return ""
}

// Describe is s's state in a few words, for logs and reports. Pure.
func (s StandbySlot) Describe() string {
	state := "active"
	switch s.Problem() {
	case SlotMissing:
		return fmt.Sprintf("slot %q does not exist", s.Name)
	case SlotLogical:
		return fmt.Sprintf("slot %q is a logical slot, not a standby's physical slot", s.Name)
	case SlotInvalidated:
		state = "invalidated (wal_status lost)"
	case SlotInactive:
		state = "inactive (no standby streams from it)"
	}
	v := fmt.Sprintf("slot %q %s, restart_lsn %s", s.Name, state, orNone(s.RestartLSN))
	if s.LagBytes != nil {
		v += fmt.Sprintf(", %d bytes behind", *s.LagBytes)
	}
	return v
}

func orNone(s string) string {
	if s == "" {
		return "none (no standby has reported)"
	}
	return s
}

// StandbyFix says what to do about the standby slot name in key (the
// setting that names it: postgres.standby_slots or
// synchronized_standby_slots) with problem (StandbySlot.Problem). Pure.
func StandbyFix(key, name, problem string) string {
	drop := "remove it from " + key
	if key == "postgres.standby_slots" {
		drop += " (OUTBOX_RELAY_STANDBY_SLOTS) and restart the relay"
	} else {
		drop += " (ALTER SYSTEM SET " + key + " = '...'; SELECT pg_reload_conf();)"
	}
	switch problem {
	case SlotMissing:
		return fmt.Sprintf("create it: SELECT pg_create_physical_replication_slot('%s'); and set primary_slot_name = '%s' on the standby; or %s", name, name, drop)
	case SlotLogical:
		return fmt.Sprintf("name the physical slot of each standby (its primary_slot_name; SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'physical'); %s", drop)
	case SlotInvalidated:
		return fmt.Sprintf("the standby lost WAL it needed: rebuild it (pg_basebackup) on a fresh slot (SELECT pg_drop_replication_slot('%s'); SELECT pg_create_physical_replication_slot('%s');), or %s", name, name, drop)
	case SlotInactive:
		return fmt.Sprintf("start the standby that streams from it (primary_slot_name = '%s'), or %s", name, drop)
	}
	return "the standby is behind: check that it is not stuck (on the primary: SELECT application_name, state, flush_lsn FROM pg_stat_replication) and its disk and network; or " + drop
}

// Querier runs one query of many rows: a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// standbySlotsQuery reads named slots; restart_lsn as text (NULL until a
// standby reports), and the lag only on a primary (pg_current_wal_lsn
// fails in recovery).
const standbySlotsQuery = `SELECT slot_name::text, slot_type, restart_lsn::text, active, wal_status,
	CASE WHEN pg_is_in_recovery() THEN NULL ELSE (pg_current_wal_lsn() - restart_lsn)::bigint END
	FROM pg_replication_slots WHERE slot_name = ANY($1)`

// ReadStandbySlots reads the slots names, in the order given, a missing
// one with Exists false. It blocks for one query.
func ReadStandbySlots(ctx context.Context, q Querier, names []string) ([]StandbySlot, error) {
	rows, err := q.Query(ctx, standbySlotsQuery, names)
	if err != nil {
		return nil, fmt.Errorf("read standby slots %s: %w", strings.Join(names, ", "), err)
	}
	found := make(map[string]StandbySlot, len(names))
	for rows.Next() {
		var (
			s                  StandbySlot
			restart, walStatus *string
		)
		if err := rows.Scan(&s.Name, &s.Type, &restart, &s.Active, &walStatus, &s.LagBytes); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read standby slots %s: %w", strings.Join(names, ", "), err)
		}
		s.Exists = true
		if walStatus != nil {
			s.WALStatus = *walStatus
		}
		if restart != nil {
			s.RestartLSN = *restart
			if s.Flushed, err = pglogrepl.ParseLSN(*restart); err != nil {
				rows.Close()
				return nil, fmt.Errorf("parse restart_lsn %q of standby slot %q: %w", *restart, s.Name, err)
			}
		}
		found[s.Name] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read standby slots %s: %w", strings.Join(names, ", "), err)
	}
	out := make([]StandbySlot, len(names))
	for i, n := range names {
		s, ok := found[n]
		if !ok {
			s = StandbySlot{Name: n}
		}
		out[i] = s
	}
	return out, nil
}

// checkStandbySlots judges postgres.standby_slots at the start of a
// session: a logical slot there is a mistake retrying cannot fix (fatal);
// a missing, invalidated or inactive one makes the relay wait (publishing
// nothing past what every standby flushed) and comes back as a warning.
// A missing one is not refused: after a failover the new primary often
// lacks its new standby's slot for a while, and waiting is what
// synchronized_standby_slots does too.
func checkStandbySlots(slots []StandbySlot) (warns []string, err error) {
	for _, s := range slots {
		switch p := s.Problem(); p {
		case "":
		case SlotLogical:
			return nil, fault.Fatal.Wrap(fmt.Errorf("postgres.standby_slots names %q, a logical slot: it must name the physical slots of the standbys that may be promoted; %s",
				s.Name, StandbyFix("postgres.standby_slots", s.Name, p)))
		default:
			warns = append(warns, fmt.Sprintf("postgres.standby_slots: %s: the relay publishes nothing this standby has not flushed, so it waits until the slot streams again; %s (docs/failover.md)",
				s.Describe(), StandbyFix("postgres.standby_slots", s.Name, p)))
		}
	}
	return warns, nil
}

// splitSetting splits a comma-separated list setting, trimmed, empty
// entries dropped.
func splitSetting(setting string) []string {
	var names []string
	for _, n := range strings.Split(setting, ",") {
		if n = strings.TrimSpace(n); n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}
