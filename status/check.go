package status

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/retention"
)

// Verdicts of status's checks, from best to worst (report's: status says
// Bad for the worst, check says Fail).
const (
	OK   = report.OK
	Warn = report.Warn
	Bad  = report.Bad
)

// Report is the whole answer: the worst verdict with its exit code, the
// checks in a fixed order (each fix is written "do" in JSON: MarshalJSON)
// and the facts they were made from.
type Report struct {
	report.Outcome
	Checks []report.Check
	Facts  Facts
}

// Thresholds of the checks that are not a state but a number.
const (
	LagBytesWarn = 256 << 20 // slot.lag_bytes warn at 256 MiB of WAL not confirmed
	LagBytesBad  = 4 << 30   // and bad at 4 GiB
	// LagSecondsOK is the seed alert's 30 s plus the bound's resolution
	// (two sample intervals): a healthy relay stays under it.
	LagSecondsOK  = 30*time.Second + 2*SampleInterval
	LagSecondsBad = 5 * time.Minute
	// OldestSlack is how much older than retention.keep the oldest row may
	// be before oldest_row warns (retention runs every retention.interval
	// in bounded batches).
	OldestSlack = 10 * time.Minute
)

// Evaluate turns facts into checks in a fixed order and their outcome
// (report.Judge). Pure: the unit tests drive it.
func Evaluate(f Facts) Report {
	var cs []report.Check
	add := func(name string, v report.Verdict, value, fix string) {
		cs = append(cs, report.Check{Name: name, Verdict: v, Value: value, Fix: fix})
	}
	t, _ := outboxschema.ParseTable(f.Table)
	migrate := func(obj string, n int) string {
		return fmt.Sprintf("run `outbox-relay migrate` with this config (migration %04d creates %s)", n, obj)
	}
	switch {
	case f.ConnectError != "":
		add("postgres", Bad, "cannot read PostgreSQL: "+f.ConnectError, "check postgres.url (host, port, user, password, sslmode) and that the server is up; status reads nothing else")
	case f.Event != nil:
		cs = append(cs, eventCheck(f, t))
	default:
		cs = append(cs, leaderCheck(f.Leader, t, migrate))
		cs = append(cs, slotChecks(f, t, migrate)...)
		if f.Failover != nil {
			cs = append(cs, pgsetup.FailoverChecks(*f.Failover, pgsetup.FailoverOptions{Slot: f.Slot, SlotFailover: f.SlotFailover, StandbySlots: f.StandbySlots}, Bad)...)
		}
		if f.Mapped {
			cs = append(cs, report.Check{Name: "delivery", Verdict: OK,
				Value: "not checked: the outbox tables are read through a column mapping (compat, columns or tables) and have no delivery horizon, dead-letter columns or created_at; see slot.lag_bytes and the relay's outbox_relay_lag_seconds"})
		} else {
			cs = append(cs, deliveryChecks(f, t, migrate)...)
		}
	}
	return Report{Outcome: report.Judge(cs), Checks: cs, Facts: f}
}

const startRelay = "start a relay: `outbox-relay run` with this config"

func leaderCheck(l *LeaderFacts, t outboxschema.Table, migrate func(string, int) string) report.Check {
	c := report.Check{Name: "leader"}
	ttl := secs(l.LeaseTTLSeconds)
	switch {
	case !l.Enabled:
		c.Verdict, c.Value = OK, "leader election off (leader.enabled false): one relay runs alone; see slot.active"
	case l.Error != "":
		c.Verdict, c.Value, c.Fix = Bad, "unknown: "+l.Error, "grant the status role SELECT on "+t.Sibling(outboxschema.LeaseTable).String()
	case l.TableMissing:
		c.Verdict, c.Value, c.Fix = Bad, "no lease table "+t.Sibling(outboxschema.LeaseTable).String(), migrate("it", 4)
	case !l.Found:
		c.Verdict, c.Value, c.Fix = Bad, "no leader: no lease row for the slot (no relay has led it, or the row was deleted)", startRelay
	case l.RenewedAge > l.LeaseTTLSeconds:
		c.Verdict = Bad
		c.Value = fmt.Sprintf("no leader: %s (epoch %d) last renewed %s ago, lease_ttl %s", l.Holder, l.Epoch, secs(l.RenewedAge), ttl)
		c.Fix = fmt.Sprintf("the leader stopped renewing: is %s running and can it reach PostgreSQL? A standby takes over by itself; with none, %s", l.Holder, startRelay)
	case l.RenewedAge > l.LeaseTTLSeconds/2:
		c.Verdict = Warn
		c.Value = fmt.Sprintf("%s epoch %d renewed %s ago, over half of lease_ttl %s", l.Holder, l.Epoch, secs(l.RenewedAge), ttl)
		c.Fix = fmt.Sprintf("the leader renews late (PostgreSQL load or network): check %s's log; past lease_ttl a standby fences it", l.Holder)
	default:
		c.Verdict = OK
		c.Value = fmt.Sprintf("%s epoch %d renewed %s ago (lease_ttl %s)", l.Holder, l.Epoch, secs(l.RenewedAge), ttl)
	}
	return c
}

// replayAdvice names the replay command for events a slot never streamed.
func replayAdvice(d *DeliveryFacts) string {
	if d != nil && d.DeliveredAt != nil {
		return fmt.Sprintf("`outbox-relay replay --since %s` (the delivery horizon: every event committed before it was delivered; go earlier if transactions run longer; consumers deduplicate on event_id)",
			d.DeliveredAt.UTC().Format(time.RFC3339))
	}
	return "`outbox-relay replay --since TIME` with TIME when the relay last ran healthy (consumers deduplicate on event_id)"
}

func slotChecks(f Facts, t outboxschema.Table, migrate func(string, int) string) []report.Check {
	s, slot := f.SlotInfo, f.Slot
	reg := t.Sibling(outboxschema.SlotRegistry).String()
	recreate := fmt.Sprintf("recreate the slot: `SELECT pg_drop_replication_slot('%s');` if it still exists, `DELETE FROM %s WHERE slot_name = '%s';`, `outbox-relay migrate`; then republish what it never streamed: %s",
		slot, reg, slot, replayAdvice(f.Delivery))
	main := report.Check{Name: "slot"}
	switch {
	case s.Error != "" && !s.Exists:
		main.Verdict, main.Value, main.Fix = Bad, "unknown: "+s.Error, "grant the status role pg_monitor (or SELECT on pg_replication_slots)"
	case !s.Exists && s.Registered:
		main.Verdict, main.Value, main.Fix = Bad, fmt.Sprintf("slot %q does not exist but was created at %s: it was dropped", slot, s.RegisteredAt.UTC().Format(time.RFC3339)), recreate
	case !s.Exists:
		main.Verdict, main.Value = Bad, fmt.Sprintf("slot %q does not exist", slot)
		main.Fix = "run `outbox-relay migrate` (or start the relay): it creates the slot; events written before it exists are not streamed: " + replayAdvice(f.Delivery)
	default:
		main.Value = fmt.Sprintf("%q wal_status %s, confirmed_flush_lsn %s, safe_wal_size %s", slot, s.WALStatus, s.ConfirmedFlush, safeSize(s.SafeWALSize))
		switch s.WALStatus {
		case "reserved":
			main.Verdict = OK
		case "extended":
			main.Verdict = Warn
			main.Fix = "the slot holds more WAL than max_wal_size: the relay is behind (see slot.lag_bytes); let it catch up or raise max_slot_wal_keep_size"
		case "unreserved":
			main.Verdict = Bad
			main.Fix = "the slot is about to lose WAL: get a relay streaming now (see slot.active) or raise max_slot_wal_keep_size; once wal_status is lost: " + recreate
		case "lost":
			main.Verdict = Bad
			main.Fix = "the slot is invalidated: PostgreSQL removed WAL it needed; " + recreate
		default:
			main.Verdict, main.Fix = Warn, "unexpected wal_status "+s.WALStatus+": check pg_replication_slots"
		}
		if main.Verdict == OK && s.SafeWALSize != nil && s.RetainedBytes != nil && *s.SafeWALSize < *s.RetainedBytes {
			main.Verdict = Warn
			main.Fix = fmt.Sprintf("the slot retains %s and has %s left before max_slot_wal_keep_size invalidates it: let the relay catch up or raise the limit",
				bytesStr(*s.RetainedBytes), bytesStr(*s.SafeWALSize))
		}
	}
	cs := []report.Check{main}
	if s.Exists {
		if s.ActivePID != nil {
			cs = append(cs, report.Check{Name: "slot.active", Verdict: OK, Value: fmt.Sprintf("streaming to backend pid %d", *s.ActivePID)})
		} else {
			cs = append(cs, report.Check{Name: "slot.active", Verdict: Bad, Value: "no relay is streaming from the slot", Fix: startRelay})
		}
		lb := report.Check{Name: "slot.lag_bytes", Verdict: OK, Value: "unknown (no confirmed_flush_lsn)"}
		if s.LagBytes != nil {
			lb.Value = bytesStr(*s.LagBytes) + " of WAL not confirmed"
			switch {
			case *s.LagBytes >= LagBytesBad:
				lb.Verdict, lb.Fix = Bad, "the relay is far behind or stuck: see slot.active and the relay's log (Kafka reachable?); the slot keeps the WAL meanwhile"
			case *s.LagBytes >= LagBytesWarn:
				lb.Verdict, lb.Fix = Warn, "the relay is behind: see slot.active and outbox_relay_slot_lag_bytes"
			}
		}
		cs = append(cs, lb)
	}
	if !f.Mapped {
		cs = append(cs, lagSecondsCheck(f, migrate))
	}
	rc := report.Check{Name: "slot.registry"}
	switch {
	case s.RegistryMissing:
		rc.Verdict, rc.Value, rc.Fix = Bad, "no slot registry "+reg, migrate("it", 2)
	case s.Registered:
		rc.Verdict, rc.Value = OK, "registered in "+reg+" at "+s.RegisteredAt.UTC().Format(time.RFC3339)
	case s.Error != "":
		rc.Verdict, rc.Value, rc.Fix = Bad, "unknown: "+s.Error, "grant the status role SELECT on "+reg
	default:
		rc.Verdict, rc.Value = Warn, "slot "+slot+" is not in "+reg+": a drop would go unnoticed and retention pauses"
		rc.Fix = "run `outbox-relay migrate` or start the relay: either registers the slot"
	}
	return append(cs, rc)
}

func lagSecondsCheck(f Facts, migrate func(string, int) string) report.Check {
	d := f.Delivery
	c := report.Check{Name: "slot.lag_seconds"}
	res := fmt.Sprintf("upper bound: now - the delivered horizon's sample, taken every %s", secs(d.SampleIntervalSeconds))
	switch {
	case d.Error != "":
		c.Verdict, c.Value, c.Fix = Bad, "unknown: "+d.Error, "grant the status role SELECT on the outbox and its outbox_relay_* tables"
	case d.TableMissing:
		c.Verdict, c.Value, c.Fix = Bad, "unknown: no delivery table", migrate("outbox_relay_delivery", 5)
	case d.LagSecondsBound == nil:
		c.Verdict, c.Value = Warn, "unknown: no delivered horizon yet"
		c.Fix = "the leader samples every " + secs(d.SampleIntervalSeconds) + " and proves a sample once the slot confirms past it: " + startRelay + " and wait"
	default:
		lag := time.Duration(*d.LagSecondsBound * float64(time.Second))
		c.Value = "<= " + secs(*d.LagSecondsBound) + " (" + res + ")"
		// Message events are in no table: with them, no row count can say
		// that nothing waits.
		waiting := d.Undelivered == nil || *d.Undelivered > 0 || f.MessagesPrefix != ""
		switch {
		case lag <= LagSecondsOK:
			c.Verdict = OK
		case !waiting:
			c.Verdict, c.Value = OK, c.Value+"; no row written since it: nothing waits"
		case lag <= LagSecondsBad:
			c.Verdict, c.Fix = Warn, "events wait longer than the 30 s alert: see slot.active, leader and the relay's log (is Kafka reachable?)"
		default:
			c.Verdict, c.Fix = Bad, "events wait for minutes: see slot.active, leader and the relay's log (is Kafka reachable?); "+startRelay+" if none runs"
		}
	}
	return c
}

func deliveryChecks(f Facts, t outboxschema.Table, migrate func(string, int) string) []report.Check {
	d, slot := f.Delivery, f.SlotInfo
	streaming := slot != nil && slot.Exists && slot.ActivePID != nil
	var cs []report.Check
	deliveryUnknown := func(name string) (report.Check, bool) {
		switch {
		case d.TableMissing:
			return report.Check{Name: name, Verdict: Bad, Value: "unknown: no delivery table", Fix: migrate("outbox_relay_delivery", 5)}, true
		case d.Error != "":
			return report.Check{Name: name, Verdict: Bad, Value: "unknown: " + d.Error, Fix: "grant the status role SELECT on the outbox and its outbox_relay_* tables"}, true
		}
		return report.Check{}, false
	}

	u, unknown := deliveryUnknown("undelivered")
	if !unknown {
		u.Name = "undelivered"
		n := *d.Undelivered
		switch {
		case d.UndeliveredExact:
			u.Value = count(n, d.UndeliveredCapped) + " rows not proven delivered (exact: the slot confirmed past the count's snapshot)"
		case d.LagSecondsBound == nil:
			u.Value = count(n, d.UndeliveredCapped) + " rows not proven delivered (a bound, not exact: the slot did not confirm past the count within " +
				secs(retention.ProofWait.Seconds()) + "; no delivered horizon yet, so every row without published_at is counted)"
		default:
			u.Value = count(n, d.UndeliveredCapped) + " rows not proven delivered (a bound, not exact: the slot did not confirm past the count within " +
				secs(retention.ProofWait.Seconds()) + "; over-counts rows delivered since the horizon's sample, about two samples of writes; misses rows of transactions open since before it)"
		}
		lagOK := d.LagSecondsBound != nil && time.Duration(*d.LagSecondsBound*float64(time.Second)) <= LagSecondsOK
		switch {
		case n == 0:
			u.Verdict = OK
		case d.UndeliveredExact:
			// The slot is past them: written below its floor (before the
			// slot existed), it never streams them.
			u.Verdict, u.Fix = Warn, "they were written before the slot's floor and the slot never streams them: see pre_slot_rows"
		case !streaming:
			u.Verdict, u.Fix = Bad, "nothing delivers them: no relay streams from the slot; "+startRelay
		case !lagOK:
			u.Verdict, u.Fix = Warn, "they wait longer than the 30 s alert: see slot.lag_seconds"
		default:
			u.Verdict, u.Value = OK, u.Value+"; in flight"
		}
		if f.MessagesPrefix != "" {
			u.Value += "; message events (messages.prefix " + strconv.Quote(f.MessagesPrefix) + ") are in no table and not counted: see slot.lag_bytes and slot.lag_seconds"
		}
	}
	cs = append(cs, u)

	q := f.DLQ
	dc := report.Check{Name: "dlq"}
	switch {
	case q.Error != "":
		dc.Verdict, dc.Value, dc.Fix = Bad, "unknown: "+q.Error, "grant the status role SELECT on "+t.String()
	case q.ColumnsMissing:
		dc.Verdict, dc.Value, dc.Fix = Bad, "unknown: "+t.String()+" has no dead-letter columns", migrate("them", 3)
	case q.Unresolved == 0:
		dc.Verdict, dc.Value = OK, "0 dead-lettered rows unresolved"
	default:
		dc.Verdict, dc.Value = Warn, fmt.Sprintf("%d dead-lettered rows unresolved", q.Unresolved)
		dc.Fix = "`outbox-relay dlq list`; fix each cause, then `outbox-relay dlq replay --id N` (or `dlq resolve --id N` to drop it)"
	}
	cs = append(cs, dc)

	o, r := f.Oldest, f.Retention
	oc := report.Check{Name: "oldest_row", Verdict: OK}
	switch {
	case o.Error != "":
		oc.Verdict, oc.Value, oc.Fix = Bad, "unknown: "+o.Error, "grant the status role SELECT on "+t.String()
	case o.Empty:
		oc.Value = "the outbox is empty"
	default:
		oc.Value = fmt.Sprintf("created %s ago (%s)", secs(o.AgeSeconds), o.CreatedAt.UTC().Format(time.RFC3339))
		if r.KeepSeconds != nil && *r.KeepSeconds > 0 && o.AgeSeconds > *r.KeepSeconds+OldestSlack.Seconds() {
			oc.Verdict = Warn
			oc.Value += ", older than retention.keep " + secs(*r.KeepSeconds)
			oc.Fix = "retention deletes only rows proven delivered: see retention, retention.pre_slot_rows and undelivered"
		}
	}
	cs = append(cs, oc)

	rc, unknown := deliveryUnknown("retention")
	if !unknown {
		rc.Name, rc.Verdict = "retention", OK
		keep := "retention.keep not known to this build"
		switch {
		case r.KeepSeconds == nil:
		case *r.KeepSeconds == 0:
			keep = "retention.keep 0: rows kept for ever"
		default:
			keep = "keep " + secs(*r.KeepSeconds)
		}
		run := "never ran"
		if r.LastRunAt != nil {
			run = fmt.Sprintf("last run %s ago deleted %d rows", secs(f.At.Sub(*r.LastRunAt).Seconds()), r.LastDeleted)
		}
		rc.Value = keep + ", " + run
		switch {
		case !d.StateFound:
			rc.Verdict, rc.Value = Warn, keep+": no delivery state for the slot yet, nothing can be deleted"
			rc.Fix = "the leader creates it on its first sample: " + startRelay
		case r.PausedReason != "":
			rc.Verdict, rc.Value = Warn, keep+", paused: "+r.PausedReason
			rc.Fix = "fix the slot (see slot); retention resumes by itself once it is healthy"
		}
	}
	cs = append(cs, rc)

	if !unknown && d.StateFound {
		pc := report.Check{Name: "retention.pre_slot_rows"}
		switch {
		case d.PreSlotError != "":
			pc.Verdict, pc.Value = Warn, "not counted: "+d.PreSlotError
			pc.Fix = fmt.Sprintf("count them off-peak: %s  -- with $1 = %d", report.OneLine(d.PreSlotSQL), d.FloorXID)
		case *d.PreSlotRows == 0:
			pc.Verdict, pc.Value = OK, "0 rows predate the slot unpublished"
		default:
			pc.Verdict = Warn
			pc.Value = fmt.Sprintf("%d rows (ids %d..%d) without published_at predate the slot (xid below its floor %d): never proven delivered, never deleted",
				*d.PreSlotRows, d.PreSlotMinID, d.PreSlotMaxID, d.FloorXID)
			pc.Fix = fmt.Sprintf("publish them and set published_at: `outbox-relay replay --from-id %d --to-id %d` (consumers deduplicate on event_id)", d.PreSlotMinID, d.PreSlotMaxID)
		}
		cs = append(cs, pc)
	}
	return cs
}

func eventCheck(f Facts, t outboxschema.Table) report.Check {
	e := f.Event
	c := report.Check{Name: fmt.Sprintf("event %d", e.ID)}
	dl := ""
	if e.DeadLetteredAt != nil {
		dl = " (dead-lettered at " + e.DeadLetteredAt.UTC().Format(time.RFC3339) + ": it went to the dead-letter topic; see `outbox-relay dlq list`)"
	}
	switch e.Reason {
	case ReasonUnreadable:
		c.Verdict, c.Value = Bad, "unknown: "+e.Error
		if strings.Contains(e.Error, "migrate") {
			c.Fix = "run `outbox-relay migrate` with this config"
		} else {
			c.Fix = "grant the status role SELECT on " + t.String() + " and its outbox_relay_* tables"
		}
	case ReasonNotFound:
		c.Verdict, c.Value = Warn, fmt.Sprintf("no row %d in %s: never inserted, or deleted by retention (which deletes only delivered rows)", e.ID, t)
	case ReasonPublished:
		c.Verdict, c.Value = OK, "delivered: published_at is set ("+e.PublishedAt.UTC().Format(time.RFC3339)+", by replay or an earlier publisher)"+dl
	case ReasonHorizon:
		c.Verdict, c.Value = OK, fmt.Sprintf("delivered: proven by the horizon (xid %d below delivered_xid)", e.XID)+dl
	case ReasonNewer:
		c.Verdict, c.Value = Warn, fmt.Sprintf("not yet: newer than the delivered horizon (xid %d)", e.XID)
		c.Fix = "wait a few seconds and ask again; if it stays, see `outbox-relay status`"
	case ReasonNoHorizon:
		c.Verdict, c.Value = Warn, "not proven: no delivered horizon yet"
		c.Fix = "the leader samples every " + SampleInterval.String() + ": " + startRelay + " and ask again"
	case ReasonUnstreamed:
		c.Verdict, c.Value = Bad, fmt.Sprintf("not proven: it was written into its partition before the partition was attached to %s (xid %d): the slot never streamed it", t, e.XID)
		c.Fix = fmt.Sprintf("if no earlier publisher sent it: `outbox-relay replay --from-id %d --to-id %d`", e.ID, e.ID)
	case ReasonPredates:
		c.Verdict, c.Value = Bad, fmt.Sprintf("not proven: its transaction predates the slot (xid %d below the floor): the slot never streamed it", e.XID)
		c.Fix = fmt.Sprintf("if no earlier publisher sent it: `outbox-relay replay --from-id %d --to-id %d`", e.ID, e.ID)
	}
	return c
}

func secs(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func bytesStr(n int64) string {
	switch {
	case n >= 1<<30 || n <= -(1<<30):
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20 || n <= -(1<<20):
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 || n <= -(1<<10):
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func safeSize(p *int64) string {
	if p == nil {
		return "unlimited (max_slot_wal_keep_size -1: the slot may fill the disk)"
	}
	return bytesStr(*p)
}

func count(n int64, capped bool) string {
	if capped {
		return fmt.Sprintf(">= %d", n)
	}
	return fmt.Sprint(n)
}
