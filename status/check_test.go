package status

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/retention"
)

var at = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func i64(n int64) *int64        { return &n }
func i32(n int32) *int32        { return &n }
func f64(n float64) *float64    { return &n }
func tm(t time.Time) *time.Time { return &t }

// healthy is the facts of a relay leading and streaming, everything ok.
func healthy() Facts {
	return Facts{
		At: at, Table: "public.outbox", Slot: "outbox_relay",
		Leader:   &LeaderFacts{Enabled: true, LeaseTTLSeconds: 10, Found: true, Holder: "h-1", Epoch: 3, RenewedAge: 0.5, RenewedAt: tm(at)},
		SlotInfo: &SlotFacts{Exists: true, ActivePID: i32(42), ConfirmedFlush: "0/100", LagBytes: i64(100), RetainedBytes: i64(1000), WALStatus: "reserved", Registered: true, RegisteredAt: tm(at.Add(-time.Hour))},
		Delivery: &DeliveryFacts{StateFound: true, FloorXID: 700, DeliveredXID: 900, DeliveredAt: tm(at.Add(-7 * time.Second)), LagSecondsBound: f64(7),
			SampleIntervalSeconds: 5, Undelivered: i64(3), PreSlotRows: i64(0), PreSlotSQL: "SELECT 1"},
		DLQ:       &DLQFacts{},
		Oldest:    &OldestFacts{CreatedAt: tm(at.Add(-time.Hour)), AgeSeconds: 3600},
		Retention: &RetentionFacts{KeepSeconds: f64(7 * 24 * 3600), LastRunAt: tm(at.Add(-30 * time.Second)), LastDeleted: 12},
	}
}

func find(r Report, name string) (report.Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return report.Check{}, false
}

func TestEvaluate(t *testing.T) {
	tests := []struct {
		name    string
		change  func(f *Facts)
		check   string
		verdict report.Verdict
		value   string // substring of the value
		do      string // substring of the advice
		exit    int
	}{
		{"healthy", func(*Facts) {}, "leader", OK, "h-1 epoch 3 renewed 500ms ago", "", report.ExitOK},
		{"leader off", func(f *Facts) { f.Leader = &LeaderFacts{} }, "leader", OK, "leader election off", "", report.ExitOK},
		{"no lease table", func(f *Facts) { f.Leader.TableMissing = true }, "leader", Bad, "no lease table public.outbox_relay_leader", "outbox-relay migrate", report.ExitBad},
		{"no lease row", func(f *Facts) { f.Leader.Found = false }, "leader", Bad, "no leader", "start a relay", report.ExitBad},
		{"lease at ttl", func(f *Facts) { f.Leader.RenewedAge = 10 }, "leader", Warn, "over half of lease_ttl", "renews late", report.ExitWarn},
		{"lease past half ttl", func(f *Facts) { f.Leader.RenewedAge = 5.1 }, "leader", Warn, "renewed 5.1s ago", "", report.ExitWarn},
		{"lease at half ttl", func(f *Facts) { f.Leader.RenewedAge = 5 }, "leader", OK, "", "", report.ExitOK},
		{"lease expired", func(f *Facts) { f.Leader.RenewedAge = 10.5 }, "leader", Bad, "no leader: h-1 (epoch 3) last renewed 10.5s ago", "stopped renewing", report.ExitBad},

		{"slot reserved", func(*Facts) {}, "slot", OK, "wal_status reserved, confirmed_flush_lsn 0/100, safe_wal_size unlimited", "", report.ExitOK},
		{"slot extended", func(f *Facts) { f.SlotInfo.WALStatus = "extended" }, "slot", Warn, "extended", "max_slot_wal_keep_size", report.ExitWarn},
		{"slot unreserved", func(f *Facts) { f.SlotInfo.WALStatus = "unreserved" }, "slot", Bad, "unreserved", "outbox-relay replay --since 2026-01-02T03:03:58Z", report.ExitBad},
		{"slot lost", func(f *Facts) { f.SlotInfo.WALStatus = "lost" }, "slot", Bad, "lost", "pg_drop_replication_slot('outbox_relay')", report.ExitBad},
		{"safe wal size below retained", func(f *Facts) { f.SlotInfo.SafeWALSize = i64(999) }, "slot", Warn, "safe_wal_size 999 B", "left before max_slot_wal_keep_size", report.ExitWarn},
		{"safe wal size roomy", func(f *Facts) { f.SlotInfo.SafeWALSize = i64(1 << 30) }, "slot", OK, "safe_wal_size 1.0 GiB", "", report.ExitOK},
		{"slot dropped", func(f *Facts) { f.SlotInfo = &SlotFacts{Registered: true, RegisteredAt: tm(at)} }, "slot", Bad, "was dropped",
			"DELETE FROM public.outbox_relay_slots WHERE slot_name = 'outbox_relay';`, `outbox-relay migrate`; then republish what it never streamed: `outbox-relay replay --since", report.ExitBad},
		{"slot never made", func(f *Facts) { f.SlotInfo = &SlotFacts{} }, "slot", Bad, "does not exist", "outbox-relay migrate", report.ExitBad},
		{"slot dropped, no horizon", func(f *Facts) {
			f.SlotInfo = &SlotFacts{Registered: true, RegisteredAt: tm(at)}
			f.Delivery.DeliveredAt = nil
		}, "slot", Bad, "",
			"replay --since TIME", report.ExitBad},
		{"slot inactive", func(f *Facts) { f.SlotInfo.ActivePID = nil }, "slot.active", Bad, "no relay is streaming", "outbox-relay run", report.ExitBad},
		{"slot active", func(*Facts) {}, "slot.active", OK, "pid 42", "", report.ExitOK},
		{"lag bytes under warn", func(f *Facts) { f.SlotInfo.LagBytes = i64(LagBytesWarn - 1) }, "slot.lag_bytes", OK, "256.0 MiB", "", report.ExitOK},
		{"lag bytes warn", func(f *Facts) { f.SlotInfo.LagBytes = i64(LagBytesWarn) }, "slot.lag_bytes", Warn, "256.0 MiB", "behind", report.ExitWarn},
		{"lag bytes bad", func(f *Facts) { f.SlotInfo.LagBytes = i64(LagBytesBad) }, "slot.lag_bytes", Bad, "4.0 GiB", "stuck", report.ExitBad},
		{"lag seconds ok", func(*Facts) {}, "slot.lag_seconds", OK, "<= 7s (upper bound: now - the delivered horizon's sample, taken every 5s)", "", report.ExitOK},
		{"lag seconds at ok limit", func(f *Facts) { f.Delivery.LagSecondsBound = f64(40) }, "slot.lag_seconds", OK, "<= 40s", "", report.ExitOK},
		{"lag seconds warn", func(f *Facts) { f.Delivery.LagSecondsBound = f64(41) }, "slot.lag_seconds", Warn, "<= 41s", "30 s alert", report.ExitWarn},
		{"lag seconds at bad limit", func(f *Facts) { f.Delivery.LagSecondsBound = f64(300) }, "slot.lag_seconds", Warn, "", "", report.ExitWarn},
		{"lag seconds bad", func(f *Facts) { f.Delivery.LagSecondsBound = f64(301) }, "slot.lag_seconds", Bad, "<= 5m1s", "for minutes", report.ExitBad},
		{"old horizon, nothing waits", func(f *Facts) { f.Delivery.LagSecondsBound = f64(3000); f.Delivery.Undelivered = i64(0) }, "slot.lag_seconds", OK, "nothing waits", "", report.ExitOK},
		{"old horizon, no rows waiting, message events on", func(f *Facts) {
			f.Delivery.LagSecondsBound = f64(3000)
			f.Delivery.Undelivered = i64(0)
			f.MessagesPrefix = "orders-outbox"
		}, "slot.lag_seconds", Bad, "<= 50m", "for minutes", report.ExitBad},
		{"undelivered with message events", func(f *Facts) { f.Delivery.Undelivered = i64(0); f.MessagesPrefix = "orders-outbox" }, "undelivered", OK,
			`0 rows not proven delivered (a bound, not exact: the slot did not confirm past the count within 3s; over-counts rows delivered since the horizon's sample, about two samples of writes; misses rows of transactions open since before it); message events (messages.prefix "orders-outbox") are in no table and not counted: see slot.lag_bytes and slot.lag_seconds`, "", report.ExitOK},
		{"no horizon", func(f *Facts) { f.Delivery.LagSecondsBound = nil }, "slot.lag_seconds", Warn, "no delivered horizon yet", "outbox-relay run", report.ExitWarn},
		{"no delivery table", func(f *Facts) { f.Delivery = &DeliveryFacts{TableMissing: true} }, "slot.lag_seconds", Bad, "no delivery table", "migration 0005", report.ExitBad},
		{"unregistered", func(f *Facts) { f.SlotInfo.Registered = false }, "slot.registry", Warn, "not in public.outbox_relay_slots", "registers the slot", report.ExitWarn},
		{"no registry", func(f *Facts) { f.SlotInfo.Registered, f.SlotInfo.RegistryMissing = false, true }, "slot.registry", Bad, "no slot registry", "migration 0002", report.ExitBad},

		{"undelivered in flight", func(*Facts) {}, "undelivered", OK, "3 rows not proven delivered (a bound, not exact:", "", report.ExitOK},
		{"undelivered exact, caught up", func(f *Facts) { f.Delivery.Undelivered, f.Delivery.UndeliveredExact = i64(0), true }, "undelivered", OK,
			"0 rows not proven delivered (exact: the slot confirmed past the count's snapshot)", "", report.ExitOK},
		{"undelivered exact, rows below the floor", func(f *Facts) { f.Delivery.UndeliveredExact = true }, "undelivered", Warn,
			"3 rows not proven delivered (exact:", "pre_slot_rows", report.ExitWarn},
		{"undelivered capped", func(f *Facts) { f.Delivery.Undelivered, f.Delivery.UndeliveredCapped = i64(100000), true }, "undelivered", OK, ">= 100000", "", report.ExitOK},
		{"undelivered, nobody streams", func(f *Facts) { f.SlotInfo.ActivePID = nil }, "undelivered", Bad, "3 rows", "nothing delivers them", report.ExitBad},
		{"undelivered, slot missing", func(f *Facts) { f.SlotInfo = &SlotFacts{} }, "undelivered", Bad, "", "nothing delivers them", report.ExitBad},
		{"undelivered, stale horizon", func(f *Facts) { f.Delivery.LagSecondsBound = f64(60) }, "undelivered", Warn, "", "slot.lag_seconds", report.ExitWarn},
		{"nothing undelivered, nobody streams", func(f *Facts) { f.SlotInfo.ActivePID = nil; f.Delivery.Undelivered = i64(0) }, "undelivered", OK, "0 rows", "", report.ExitBad},
		{"undelivered without horizon", func(f *Facts) { f.Delivery.LagSecondsBound = nil }, "undelivered", Warn, "no delivered horizon yet, so every row without published_at is counted", "", report.ExitWarn},

		{"dlq empty", func(*Facts) {}, "dlq", OK, "0 dead-lettered", "", report.ExitOK},
		{"dlq one", func(f *Facts) { f.DLQ.Unresolved = 1 }, "dlq", Warn, "1 dead-lettered rows unresolved", "outbox-relay dlq list", report.ExitWarn},
		{"dlq columns missing", func(f *Facts) { f.DLQ.ColumnsMissing = true }, "dlq", Bad, "no dead-letter columns", "migration 0003", report.ExitBad},

		{"oldest within keep", func(f *Facts) { f.Oldest.AgeSeconds = 7*24*3600 + OldestSlack.Seconds() }, "oldest_row", OK, "", "", report.ExitOK},
		{"oldest past keep", func(f *Facts) { f.Oldest.AgeSeconds = 7*24*3600 + OldestSlack.Seconds() + 1 }, "oldest_row", Warn, "older than retention.keep 168h0m0s", "proven delivered", report.ExitWarn},
		{"oldest, keep for ever", func(f *Facts) { f.Oldest.AgeSeconds = 1e9; f.Retention.KeepSeconds = f64(0) }, "oldest_row", OK, "", "", report.ExitOK},
		{"oldest, keep unknown", func(f *Facts) { f.Oldest.AgeSeconds = 1e9; f.Retention.KeepSeconds = nil }, "oldest_row", OK, "", "", report.ExitOK},
		{"empty outbox", func(f *Facts) { f.Oldest = &OldestFacts{Empty: true} }, "oldest_row", OK, "empty", "", report.ExitOK},

		{"retention ran", func(*Facts) {}, "retention", OK, "keep 168h0m0s, last run 30s ago deleted 12 rows", "", report.ExitOK},
		{"retention keep unknown", func(f *Facts) { f.Retention.KeepSeconds = nil; f.Retention.LastRunAt = nil }, "retention", OK, "retention.keep not known to this build, never ran", "", report.ExitOK},
		{"retention paused", func(f *Facts) { f.Retention.PausedReason = "the replication slot does not exist" }, "retention", Warn, "paused: the replication slot does not exist", "fix the slot", report.ExitWarn},
		{"retention no state", func(f *Facts) { f.Delivery.StateFound = false }, "retention", Warn, "no delivery state", "first sample", report.ExitWarn},
		{"pre-slot none", func(*Facts) {}, "retention.pre_slot_rows", OK, "0 rows", "", report.ExitOK},
		{"pre-slot rows", func(f *Facts) {
			f.Delivery.PreSlotRows, f.Delivery.PreSlotMinID, f.Delivery.PreSlotMaxID = i64(5), 1, 9
		},
			"retention.pre_slot_rows", Warn, "5 rows (ids 1..9)", "`outbox-relay replay --from-id 1 --to-id 9`", report.ExitWarn},
		{"pre-slot not counted", func(f *Facts) { f.Delivery.PreSlotRows, f.Delivery.PreSlotError = nil, "took longer than 2s" }, "retention.pre_slot_rows", Warn, "not counted", "with $1 = 700", report.ExitWarn},

		{"postgres down", func(f *Facts) { *f = Facts{Table: "public.outbox", Slot: "s", ConnectError: "connection refused"} }, "postgres", Bad, "connection refused", "postgres.url", report.ExitBad},

		{"standby slots streaming", func(f *Facts) {
			f.StandbySlots = []string{"standby_1"}
			f.Failover = &pgsetup.FailoverFacts{VersionNum: 160004, StandbySlots: []pgsetup.StandbySlot{{Name: "standby_1", Exists: true, Type: "physical", Active: true, RestartLSN: "0/100", LagBytes: i64(0)}}}
		}, pgsetup.CheckFailoverStandbySlots, OK, `slot "standby_1" active, restart_lsn 0/100, 0 bytes behind`, "", report.ExitOK},
		{"standby down", func(f *Facts) {
			f.StandbySlots = []string{"standby_1"}
			f.Failover = &pgsetup.FailoverFacts{VersionNum: 160004, StandbySlots: []pgsetup.StandbySlot{{Name: "standby_1", Exists: true, Type: "physical"}}}
		}, pgsetup.CheckFailoverStandbySlots, Warn, "inactive", "primary_slot_name = 'standby_1'", report.ExitWarn},
		{"failover slot, setting names a missing slot", func(f *Facts) {
			f.SlotFailover = true
			set := "gone"
			f.Failover = &pgsetup.FailoverFacts{VersionNum: 170008, SlotExists: true, SlotFailover: true, SynchronizedStandbySlots: &set, SyncSlots: []pgsetup.StandbySlot{{Name: "gone"}}}
		}, pgsetup.CheckFailoverSyncSlots, Bad, `slot "gone" does not exist`, "pg_create_physical_replication_slot('gone')", report.ExitBad},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := healthy()
			tt.change(&f)
			r := Evaluate(f)
			c, ok := find(r, tt.check)
			if !ok {
				t.Fatalf("no check %q in %+v", tt.check, r.Checks)
			}
			if c.Verdict != tt.verdict || !strings.Contains(c.Value, tt.value) || !strings.Contains(c.Fix, tt.do) {
				t.Errorf("got %+v\nwant verdict %s, value ~ %q, do ~ %q", c, tt.verdict, tt.value, tt.do)
			}
			if (c.Verdict == OK) != (c.Fix == "") {
				t.Errorf("%s: advice %q with verdict %s: every check not ok says what to do, an ok one nothing", c.Name, c.Fix, c.Verdict)
			}
			if r.ExitCode != tt.exit {
				t.Errorf("exit %d, want %d; checks %+v", r.ExitCode, tt.exit, r.Checks)
			}
		})
	}
}

func TestEventReason(t *testing.T) {
	st := retention.State{FloorXID: 100, DeliveredXID: 200}
	pub := tm(at)
	tests := []struct {
		name string
		row  retention.Row
		st   retention.State
		want string
	}{
		{"published", retention.Row{XID: 50, PublishedAt: pub}, st, ReasonPublished},
		{"below floor", retention.Row{XID: 99}, st, ReasonPredates},
		{"at floor", retention.Row{XID: 100}, st, ReasonHorizon},
		{"below delivered", retention.Row{XID: 199}, st, ReasonHorizon},
		{"at delivered", retention.Row{XID: 200}, st, ReasonNewer},
		{"no promotion yet", retention.Row{XID: 150}, retention.State{FloorXID: 100}, ReasonNoHorizon},
		{"no promotion, below floor", retention.Row{XID: 50}, retention.State{FloorXID: 100}, ReasonPredates},
		{"no state", retention.Row{XID: 50}, retention.State{}, ReasonNoHorizon},
		{"before its partition was attached", retention.Row{XID: 150, Unstreamed: true}, st, ReasonUnstreamed},
		{"before attach, published", retention.Row{XID: 150, Unstreamed: true, PublishedAt: pub}, st, ReasonPublished},
	}
	for _, tt := range tests {
		if got := EventReason(tt.row, tt.st); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestEventCheck(t *testing.T) {
	tests := []struct {
		e       EventFacts
		verdict report.Verdict
		value   string
		do      string
		exit    int
	}{
		{EventFacts{ID: 7, Found: true, Delivered: true, Reason: ReasonHorizon, XID: 150}, OK, "delivered: proven by the horizon (xid 150", "", report.ExitOK},
		{EventFacts{ID: 7, Found: true, Delivered: true, Reason: ReasonHorizon, DeadLetteredAt: tm(at)}, OK, "dead-letter topic", "", report.ExitOK},
		{EventFacts{ID: 7, Found: true, Delivered: true, Reason: ReasonPublished, PublishedAt: tm(at)}, OK, "published_at is set", "", report.ExitOK},
		{EventFacts{ID: 7, Found: true, Reason: ReasonNewer, XID: 250}, Warn, "not yet: newer than the delivered horizon", "ask again", report.ExitWarn},
		{EventFacts{ID: 7, Found: true, Reason: ReasonPredates, XID: 50}, Bad, "predates the slot", "`outbox-relay replay --from-id 7 --to-id 7`", report.ExitBad},
		{EventFacts{ID: 7, Found: true, Reason: ReasonNoHorizon}, Warn, "no delivered horizon yet", "outbox-relay run", report.ExitWarn},
		{EventFacts{ID: 7, Reason: ReasonNotFound}, Warn, "no row 7 in public.outbox", "", report.ExitWarn},
		{EventFacts{ID: 7, Reason: ReasonUnreadable, Error: "the delivery table public.outbox_relay_delivery does not exist: run `outbox-relay migrate`"}, Bad, "does not exist", "outbox-relay migrate", report.ExitBad},
	}
	for _, tt := range tests {
		f := Facts{At: at, Table: "public.outbox", Slot: "s", Event: &tt.e}
		r := Evaluate(f)
		if len(r.Checks) != 1 {
			t.Fatalf("--id reports one check, got %+v", r.Checks)
		}
		c := r.Checks[0]
		if c.Name != "event 7" || c.Verdict != tt.verdict || !strings.Contains(c.Value, tt.value) || !strings.Contains(c.Fix, tt.do) || r.ExitCode != tt.exit {
			t.Errorf("%s: got %+v exit %d, want %s ~%q ~%q exit %d", tt.e.Reason, c, r.ExitCode, tt.verdict, tt.value, tt.do, tt.exit)
		}
	}
}

func TestText(t *testing.T) {
	f := healthy()
	f.DLQ.Unresolved = 2
	var b bytes.Buffer
	if err := Text(&b, Evaluate(f)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	want := []string{
		"outbox-relay status: table public.outbox, slot outbox_relay, at 2026-01-02T03:04:05Z",
		"",
		"leader                   OK    h-1 epoch 3 renewed 500ms ago (lease_ttl 10s)",
		`slot                     OK    "outbox_relay" wal_status reserved, confirmed_flush_lsn 0/100, safe_wal_size unlimited (max_slot_wal_keep_size -1: the slot may fill the disk)`,
		"slot.active              OK    streaming to backend pid 42",
		"slot.lag_bytes           OK    100 B of WAL not confirmed",
		"slot.lag_seconds         OK    <= 7s (upper bound: now - the delivered horizon's sample, taken every 5s)",
		"slot.registry            OK    registered in public.outbox_relay_slots at 2026-01-02T02:04:05Z",
		"undelivered              OK    3 rows not proven delivered (a bound, not exact: the slot did not confirm past the count within 3s; over-counts rows delivered since the horizon's sample, about two samples of writes; misses rows of transactions open since before it); in flight",
		"dlq                      WARN  2 dead-lettered rows unresolved",
		"                               -> `outbox-relay dlq list`; fix each cause, then `outbox-relay dlq replay --id N` (or `dlq resolve --id N` to drop it)",
		"oldest_row               OK    created 1h0m0s ago (2026-01-02T02:04:05Z)",
		"retention                OK    keep 168h0m0s, last run 30s ago deleted 12 rows",
		"retention.pre_slot_rows  OK    0 rows predate the slot unpublished",
		"",
		"WARN (exit 4)",
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), b.String())
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d:\n got %q\nwant %q", i, lines[i], want[i])
		}
	}
}

func TestJSON(t *testing.T) {
	f := healthy()
	f.SlotInfo.ActivePID = nil
	var b bytes.Buffer
	if err := JSON(&b, Evaluate(f)); err != nil {
		t.Fatal(err)
	}
	// The documented field names, read back untyped as a script would.
	var got struct {
		Verdict  string `json:"verdict"`
		ExitCode int    `json:"exit_code"`
		Checks   []struct {
			Name, Verdict, Value, Do string
		} `json:"checks"`
		Facts map[string]json.RawMessage `json:"facts"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if got.Verdict != "bad" || got.ExitCode != report.ExitBad || len(got.Checks) != 11 || got.Checks[2].Name != "slot.active" || got.Checks[2].Verdict != "bad" || got.Checks[2].Do == "" {
		t.Errorf("report %+v", got)
	}
	for sec, keys := range map[string][]string{
		"leader":           {"enabled", "lease_ttl_seconds", "found", "holder", "epoch", "renewed_age_seconds"},
		"replication_slot": {"exists", "active_pid", "confirmed_flush_lsn", "lag_bytes", "retained_bytes", "wal_status", "safe_wal_size", "registered"},
		"delivery":         {"state_found", "floor_xid", "delivered_xid", "delivered_at", "lag_seconds_bound", "sample_interval_seconds", "undelivered", "undelivered_capped", "undelivered_exact", "pre_slot_rows"},
		"dlq":              {"unresolved"},
		"oldest_row":       {"created_at", "age_seconds"},
		"retention":        {"keep_seconds", "last_run_at", "last_deleted"},
	} {
		var m map[string]any
		if err := json.Unmarshal(got.Facts[sec], &m); err != nil {
			t.Fatalf("facts.%s: %v", sec, err)
		}
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("facts.%s.%s missing in\n%s", sec, k, b.String())
			}
		}
	}
	var slot struct {
		ActivePID *int `json:"active_pid"`
	}
	if err := json.Unmarshal(got.Facts["replication_slot"], &slot); err != nil || slot.ActivePID != nil {
		t.Errorf("active_pid %v (%v), want null", slot.ActivePID, err)
	}
	for _, k := range []string{"at", "table", "slot"} {
		if _, ok := got.Facts[k]; !ok {
			t.Errorf("facts.%s missing", k)
		}
	}
}

// A program decoding `status --json` into a Report gets the checks back,
// each fix from its "do".
func TestJSONRoundTrip(t *testing.T) {
	f := healthy()
	f.SlotInfo.ActivePID = nil
	r := Evaluate(f)
	var b bytes.Buffer
	if err := JSON(&b, r); err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Outcome != r.Outcome || len(got.Checks) != len(r.Checks) || got.Facts.Slot != r.Facts.Slot {
		t.Fatalf("decoded %+v, want %+v", got, r)
	}
	for i := range r.Checks {
		if got.Checks[i] != r.Checks[i] {
			t.Errorf("check %d: decoded %+v, want %+v", i, got.Checks[i], r.Checks[i])
		}
	}
}
