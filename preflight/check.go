package preflight

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/report"
)

// Verdicts of check's checks (report's: check says Fail for the worst,
// status says Bad). Skip: the check could not be made (a prerequisite
// failed, or the broker does not say); it changes no exit code.
const (
	OK   = report.OK
	Warn = report.Warn
	Fail = report.Fail
	Skip = report.Skip
)

// Supported PostgreSQL major versions (logical decoding messages, pgoutput
// options and the catalog columns the relay reads).
const (
	MinPGVersion = 14
	MaxPGVersion = 18
)

// Report is the whole answer: the worst verdict with its exit code, the
// table and slot checked, and the checks in a fixed order.
type Report struct {
	report.Outcome
	Table  string         `json:"table"`
	Slot   string         `json:"slot"`
	Checks []report.Check `json:"checks"`
}

// Evaluate judges the facts: the checks in a fixed order, PostgreSQL's
// then Kafka's, and their outcome (report.Judge). Pure.
func Evaluate(f Facts) Report {
	o := f.Options
	var cs []report.Check
	add := func(name string, v report.Verdict, value, fix string) {
		cs = append(cs, report.Check{Name: name, Verdict: v, Value: value, Fix: fix})
	}
	pgChecks(f.PG, o, add)
	headerChecks(o, f.PG.HeaderNames, add)
	kafkaChecks(f, add)
	registryChecks(f.Registry, o, add)
	return Report{Outcome: report.Judge(cs), Table: o.Table.String(), Slot: o.Slot, Checks: cs}
}

type addFunc func(name string, v report.Verdict, value, fix string)

func pgChecks(p PGFacts, o Options, add addFunc) {
	t := o.Table
	if p.ConnectError != "" {
		add("postgres", Fail, fmt.Sprintf("database at %s unreachable: %s", p.Addr, p.ConnectError),
			"check postgres.url (host, port, user, password, sslmode) and that PostgreSQL is up; nothing else in PostgreSQL was checked")
		return
	}
	add("postgres", OK, fmt.Sprintf("connected to %s as %s", p.Addr, p.Role), "")
	if p.SettingsErr != "" {
		add("server", Fail, "cannot read the server settings: "+p.SettingsErr, "connect as a role that can read pg_settings and pg_roles")
		return
	}
	role := outboxschema.QuoteIdent(p.Role)
	major := p.VersionNum / 10000
	if o.MessagesPrefix != "" && major < MinPGVersion {
		// The relay refuses to start: pgoutput sends no messages.
		add("server_version", Fail, fmt.Sprintf("PostgreSQL %s: messages.prefix needs PostgreSQL 14 or later (pgoutput's messages option)", p.Version),
			"upgrade PostgreSQL, or unset messages.prefix and write events into the outbox table")
	} else if major >= MinPGVersion && major <= MaxPGVersion {
		add("server_version", OK, "PostgreSQL "+p.Version, "")
	} else {
		add("server_version", Warn, fmt.Sprintf("PostgreSQL %s: supported are %d to %d", p.Version, MinPGVersion, MaxPGVersion),
			fmt.Sprintf("run PostgreSQL %d..%d; other versions are untested", MinPGVersion, MaxPGVersion))
	}
	if p.WalLevel == "logical" {
		add("wal_level", OK, "logical", "")
	} else {
		add("wal_level", Fail, p.WalLevel+": logical replication needs logical",
			"ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL")
	}
	// The leader also needs a free slot for a moment about every second
	// (replication.SlotSaver's temporary slot).
	saverFix := fmt.Sprintf("ALTER SYSTEM SET max_replication_slots = %d; then restart PostgreSQL: the leader creates a temporary slot "+
		"about every second so the server writes the relay's slot position; without one a PostgreSQL restart republishes more events (duplicates, no loss)", p.MaxSlots+1)
	free := p.MaxSlots - p.UsedSlots
	if p.Slot.Exists && free > 0 {
		add("replication_slots", OK, fmt.Sprintf("%d of %d used; the relay's slot exists", p.UsedSlots, p.MaxSlots), "")
	} else if p.Slot.Exists {
		add("replication_slots", Warn, fmt.Sprintf("%d of %d used; the relay's slot exists, none free for the leader's temporary slot", p.UsedSlots, p.MaxSlots), saverFix)
	} else if free > 1 {
		add("replication_slots", OK, fmt.Sprintf("%d of %d used: %d free for the relay's slot", p.UsedSlots, p.MaxSlots, free), "")
	} else if free == 1 {
		add("replication_slots", Warn, fmt.Sprintf("%d of %d used: 1 free for the relay's slot, none for the leader's temporary slot", p.UsedSlots, p.MaxSlots), saverFix)
	} else {
		add("replication_slots", Fail, fmt.Sprintf("%d of %d used: none free for slot %s", p.UsedSlots, p.MaxSlots, o.Slot),
			fmt.Sprintf("ALTER SYSTEM SET max_replication_slots = %d; then restart PostgreSQL (or drop an unused slot: SELECT slot_name, active FROM pg_replication_slots)", p.MaxSlots+2))
	}
	if free := p.MaxSenders - p.ActiveSenders; free > 0 {
		add("wal_senders", OK, fmt.Sprintf("%d of %d in use", p.ActiveSenders, p.MaxSenders), "")
	} else {
		add("wal_senders", Fail, fmt.Sprintf("%d of %d in use: none free for the relay's stream", p.ActiveSenders, p.MaxSenders),
			fmt.Sprintf("ALTER SYSTEM SET max_wal_senders = %d; then restart PostgreSQL", p.MaxSenders+2))
	}
	if p.MaxSlotWALKeep == "-1" {
		add("max_slot_wal_keep_size", Warn, "-1 (unlimited): a stopped or stuck relay keeps WAL until the disk fills",
			"ALTER SYSTEM SET max_slot_wal_keep_size = '50GB' (below the free WAL disk); SELECT pg_reload_conf();")
	} else {
		add("max_slot_wal_keep_size", OK, p.MaxSlotWALKeep, "")
	}

	// The role and its privileges.
	if p.Super || p.Replication {
		v := "REPLICATION"
		if p.Super {
			v = "superuser"
		}
		add("role.replication", OK, fmt.Sprintf("role %s: %s", p.Role, v), "")
	} else {
		add("role.replication", Fail, fmt.Sprintf("role %s lacks REPLICATION: it cannot stream from a slot", p.Role),
			fmt.Sprintf("ALTER ROLE %s REPLICATION; (and allow it in pg_hba.conf for the replication database)", role))
	}
	migrate := "run `outbox-relay migrate` with this config"
	switch {
	case p.TableErr != "":
		add("outbox_table", Fail, "cannot read "+t.String()+": "+p.TableErr, "GRANT USAGE ON SCHEMA "+outboxschema.QuoteIdent(t.Schema)+" TO "+role+";")
	case o.Mappings != nil && len(p.MappingErrs) > 0:
		add("outbox_table", Fail, strings.Join(p.MappingErrs, "; "), "fix the columns.* keys (or tables[].columns) or the table, as each message says")
	case o.Mappings != nil:
		names := make([]string, len(o.Mappings))
		for i, m := range o.Mappings {
			names[i] = m.Table.String()
		}
		add("outbox_table", OK, strings.Join(names, ", ")+": columns fit the mapping (row marks and retention off: not the relay's own table)", "")
	case !p.TableExists:
		add("outbox_table", Fail, t.String()+" does not exist", migrate+", or set postgres.table")
	case len(p.MissingRequired) > 0:
		add("outbox_table", Fail, t.String()+" lacks required column(s) "+strings.Join(p.MissingRequired, ", "), "restore them (see migrations/)")
	case len(p.MissingBookkeep) > 0:
		add("outbox_table", Fail, t.String()+" lacks column(s) "+strings.Join(p.MissingBookkeep, ", "), migrate+" (migration 0003 adds them)")
	default:
		v := t.String()
		if p.Partitioned {
			v += " (partitioned)"
		}
		add("outbox_table", OK, v, "")
	}
	inheritCheck(p, add)
	if p.SchemaUsage {
		add("privileges.schema", OK, "USAGE on schema "+t.Schema, "")
	} else {
		add("privileges.schema", Fail, fmt.Sprintf("role %s lacks USAGE on schema %s", p.Role, t.Schema),
			fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", outboxschema.QuoteIdent(t.Schema), role))
	}
	privChecks(p, o, add)
	if o.RetentionKeep > 0 && p.Partitioned {
		if p.OwnsTable || p.Super {
			add("privileges.partitions", OK, "owner of "+t.String()+": retention may drop old partitions", "")
		} else {
			add("privileges.partitions", Warn, fmt.Sprintf("role %s does not own partitioned %s: retention cannot drop old partitions", p.Role, t),
				fmt.Sprintf("GRANT <owner of %s> TO %s; (or ALTER TABLE %s OWNER TO %s)", t.Quoted(), role, t.Quoted(), role))
		}
	}
	if o.LeaderEnabled {
		switch {
		case p.FenceErr != "":
			add("privileges.fence", Warn, "cannot read the right to fence: "+p.FenceErr, "")
		case p.Fence == nil:
		case !p.Fence.OK:
			add("privileges.fence", Fail, p.Fence.Problem, fmt.Sprintf("GRANT pg_signal_backend TO %s; or run every instance as the same role", role))
		case p.Fence.Super:
			add("privileges.fence", OK, "superuser: may fence any stalled leader", "")
		case p.Fence.SignalBackend:
			add("privileges.fence", OK, "pg_signal_backend: may fence a stalled leader of any non-superuser role", "")
		default:
			add("privileges.fence", OK, fmt.Sprintf("may fence instances running as %s (the same role); other roles need GRANT pg_signal_backend TO %s", p.Role, role), "")
		}
	}
	if o.HeartbeatInterval > 0 {
		fn := EmitMessageFunc(p.VersionNum)
		switch {
		case p.EmitMessage == nil:
			add("privileges.heartbeat", Skip, "could not read EXECUTE on "+fn, "")
		case *p.EmitMessage:
			add("privileges.heartbeat", OK, "EXECUTE on "+fn, "")
		default:
			add("privileges.heartbeat", Warn, "no EXECUTE on "+fn+": outbox_relay_lag_seconds sees only events already read",
				fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", fn, role))
		}
	}
	pubCheck(p, o, add)
	slotCheck(p, o, add)
	xactChecks(p, o, add)
	for _, c := range pgsetup.FailoverChecks(p.Failover, pgsetup.FailoverOptions{Slot: o.Slot, SlotFailover: o.SlotFailover, StandbySlots: o.StandbySlots, Advise: true}, Fail) {
		add(c.Name, c.Verdict, c.Value, c.Fix)
	}
}

// inheritCheck fails while an outbox table has inheritance children: the
// relay refuses to start (their rows are never streamed).
func inheritCheck(p PGFacts, add addFunc) {
	if !p.TableExists && len(p.Inheritance) == 0 {
		return
	}
	bad := false
	for _, in := range p.Inheritance {
		bad = true
		if in.Err != "" {
			add("inheritance", Fail, "cannot read the inheritance children of "+in.Table+": "+in.Err, "grant the role SELECT on pg_inherits (readable by default)")
			continue
		}
		add("inheritance", Fail, in.Problem+": the relay refuses to start", in.Fix)
	}
	if !bad {
		add("inheritance", OK, "no inheritance children: the outbox's rows are all streamed", "")
	}
}

// privChecks reports each privilege check: the missing privileges of each
// table with the GRANT that gives them.
func privChecks(p PGFacts, o Options, add addFunc) {
	var names []string
	by := map[string][]PrivFact{}
	for _, pf := range p.Privs {
		if by[pf.Check] == nil {
			names = append(names, pf.Check)
		}
		by[pf.Check] = append(by[pf.Check], pf)
	}
	for _, name := range names {
		var missing []Need
		var absent, errs, have []string
		for _, pf := range by[name] {
			switch {
			case pf.Err != "":
				errs = append(errs, pf.Err)
			case !pf.Exists:
				if !contains(absent, pf.Table.String()) {
					absent = append(absent, pf.Table.String())
				}
			case !pf.Have:
				missing = append(missing, pf.Need)
			default:
				have = append(have, describe(pf.Need))
			}
		}
		switch {
		case len(absent) > 0:
			fix := "run `outbox-relay migrate` with this config"
			if name == CheckPrivRetention && o.RetentionArchive {
				fix += " (with retention.archive on it creates the archive table)"
			}
			add(name, Fail, strings.Join(absent, ", ")+" does not exist", fix)
		case len(errs) > 0:
			add(name, Fail, "cannot read privileges: "+strings.Join(errs, "; "), "")
		case len(missing) > 0:
			var ds []string
			for _, n := range missing {
				ds = append(ds, describe(n))
			}
			add(name, Fail, fmt.Sprintf("role %s lacks %s (%s)", p.Role, strings.Join(ds, ", "), missing[0].Why),
				strings.Join(grantsByTable(missing, p.Role), " "))
		default:
			add(name, OK, strings.Join(have, ", "), "")
		}
	}
}

func describe(n Need) string {
	s := n.Privilege
	if len(n.Columns) > 0 {
		s += " (" + strings.Join(n.Columns, ", ") + ")"
	}
	return s + " on " + n.Table.String()
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func pubCheck(p PGFacts, o Options, add addFunc) {
	pub := p.Publication
	q := outboxschema.QuoteIdent(o.Publication)
	t := o.Table
	switch {
	case pub.Err != "":
		add("publication", Fail, "cannot read publication "+o.Publication+": "+pub.Err, "")
	case !pub.Exists && p.Slot.Exists:
		add("publication", Fail, fmt.Sprintf("publication %s does not exist, but slot %s does: the relay refuses to start", o.Publication, o.Slot),
			"start the relay once to read its recovery steps, or drop the slot and run `outbox-relay migrate`")
	case !pub.Exists && !o.CreatePublication:
		add("publication", Fail, fmt.Sprintf("publication %s does not exist and postgres.create_publication is false", o.Publication),
			createPublicationSQL(o)+"; (or run `outbox-relay migrate`)")
	case !pub.Exists && !(p.Super || p.OwnsTable && p.CanCreateInDB):
		add("publication", Fail, fmt.Sprintf("publication %s does not exist and role %s cannot create it (it needs to own %s and CREATE on the database)", o.Publication, p.Role, t),
			"run `outbox-relay migrate` as the table owner, or as the owner: "+createPublicationSQL(o)+";")
	case !pub.Exists:
		add("publication", OK, fmt.Sprintf("publication %s does not exist: the relay creates it at start (postgres.create_publication)", o.Publication), "")
	case !pub.Insert:
		add("publication", Fail, fmt.Sprintf("publication %s does not publish inserts", o.Publication), fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert');", q))
	case len(p.PubMissing) > 0:
		add("publication", Fail, fmt.Sprintf("publication %s does not include %s", o.Publication, strings.Join(p.PubMissing, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", q, strings.Join(p.PubMissing, ", ")))
	case !pub.HasTable && o.Mappings == nil:
		add("publication", Fail, fmt.Sprintf("publication %s does not include %s", o.Publication, t), fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s;", q, t.Quoted()))
	case p.Partitioned && !pub.ViaRoot:
		add("publication", Fail, fmt.Sprintf("%s is partitioned but publication %s lacks publish_via_partition_root: its inserts would be skipped", t, o.Publication),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true);", q))
	case len(pub.Shape) > 0:
		var what, fixes []string
		for _, pr := range pub.Shape {
			what = append(what, pr.What)
			if f := pgsetup.Statement(pr.Fix); !contains(fixes, f) {
				fixes = append(fixes, f)
			}
		}
		add("publication", Fail, strings.Join(what, "; "), strings.Join(fixes, " "))
	case pub.Update || pub.Delete || pub.Truncat:
		var extra []string
		for _, e := range []struct {
			on   bool
			name string
		}{{pub.Update, "update"}, {pub.Delete, "delete"}, {pub.Truncat, "truncate"}} {
			if e.on {
				extra = append(extra, e.name)
			}
		}
		add("publication", Warn, fmt.Sprintf("publication %s publishes %s too: the slot decodes every dead-letter mark and retention delete for nothing", o.Publication, strings.Join(extra, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert');", q))
	default:
		add("publication", OK, fmt.Sprintf("%s: inserts of %s only", o.Publication, t), "")
	}
}

func slotCheck(p PGFacts, o Options, add addFunc) {
	s := p.Slot
	lit := outboxschema.QuoteLiteral(o.Slot)
	switch {
	case s.Err != "":
		add("slot", Fail, "cannot read slot "+o.Slot+": "+s.Err, "")
	case !s.Exists && s.Registered:
		add("slot", Fail, fmt.Sprintf("slot %s was created by the relay and is gone (dropped?): events committed meanwhile were not streamed", o.Slot),
			"run `outbox-relay status` for the recovery steps (migrate, run, then `outbox-relay replay --since ...`)")
	case !s.Exists:
		add("slot", OK, fmt.Sprintf("slot %s does not exist yet: `outbox-relay migrate` or the relay's first start creates it", o.Slot), "")
	case s.SlotType != "logical" || s.Plugin != "pgoutput":
		add("slot", Fail, fmt.Sprintf("slot %s is a %s slot with plugin %q; the relay needs a logical pgoutput slot", o.Slot, s.SlotType, s.Plugin),
			fmt.Sprintf("choose another postgres.slot, or SELECT pg_drop_replication_slot(%s); if nothing else uses it", lit))
	case s.Database != s.CurrentDB:
		add("slot", Fail, fmt.Sprintf("slot %s belongs to database %s, not %s", o.Slot, s.Database, s.CurrentDB), "connect postgres.url to that database, or choose another postgres.slot")
	default:
		v := fmt.Sprintf("%s: pgoutput, wal_status %s, safe_wal_size %s", o.Slot, s.WALStatus, safeSize(s.SafeWALSize))
		switch s.WALStatus {
		case "reserved":
			add("slot", OK, v, "")
		case "extended", "unreserved":
			add("slot", Warn, v+": the slot retains more WAL than max_wal_size; it may be invalidated",
				"start the relay (or find why it does not confirm); raise max_slot_wal_keep_size if the disk allows")
		case "lost":
			add("slot", Fail, v+": invalidated, events may be lost", fmt.Sprintf("SELECT pg_drop_replication_slot(%s); then follow `outbox-relay status` (migrate, run, replay --since)", lit))
		default:
			add("slot", OK, v, "")
		}
	}
}

func safeSize(p *int64) string {
	if p == nil {
		return "unlimited"
	}
	n := *p
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d B", n)
}

func kafkaChecks(f Facts, add addFunc) {
	o, k := f.Options, f.Kafka
	plan := planRoutes(o, f.PG.Routes)
	read := routeSummary(o, f.PG.Routes, plan)
	readFix := readFailures(f.PG.Routes)
	readVerdict := OK
	if readFix != "" {
		readVerdict = Warn
	}
	brokers := strings.Join(o.Kafka.Brokers, ",")
	saslCheck(o, k, add)
	if k.ConnectError != "" {
		add("kafka", Fail, "cannot reach "+brokers+": "+k.ConnectError,
			"check kafka.brokers, kafka.tls.* and kafka.sasl.* (the relay connects with the same settings) and that the brokers are up")
		if readVerdict == OK {
			readVerdict = Skip
		}
		add("kafka.topics", readVerdict, strings.TrimSuffix("Kafka unreachable; "+read, "; "), readFix)
		routesChecks(o, plan, add) // judged without Kafka
		add("kafka.acls", Skip, "Kafka unreachable", "")
		return
	}
	add("kafka", OK, "connected to "+brokers, "")

	// The summary: what was read and which topics exist; each missing
	// topic has its own line below.
	var present, missing []string
	for _, t := range k.Topics {
		if t.Exists {
			present = append(present, fmt.Sprintf("%s (%s)", t.Name, plural(int64(t.Partitions), "partition", "partitions")))
		} else {
			missing = append(missing, t.Name)
		}
	}
	var value []string
	switch {
	case len(k.Topics) == 0:
		value = append(value, "no topic to check")
	case len(missing) == 0:
		value = append(value, "every topic exists: "+cut(present, maxLines))
	default:
		value = append(value, fmt.Sprintf("%d of %d topics missing (kafka.topic lines)", len(missing), len(k.Topics)))
		if len(present) > 0 {
			value = append(value, "present: "+cut(present, maxLines))
		}
	}
	if read != "" {
		value = append(value, "routes read: "+read)
	}
	add("kafka.topics", readVerdict, strings.Join(value, "; "), readFix)
	missingTopicChecks(f, plan, missing, add)
	routesChecks(o, plan, add)

	switch {
	case k.ACL.Skipped != "":
		add("kafka.acls", Skip, k.ACL.Skipped, "")
	default:
		var denied []string
		for _, t := range k.Topics {
			for _, op := range []sarama.AclOperation{sarama.AclOperationWrite, sarama.AclOperationDescribe} {
				if !allowed(k.ACL.Acls, k.ACL.Principal, t.Name, op) {
					denied = append(denied, fmt.Sprintf("%s on %s", opName(op), t.Name))
				}
			}
		}
		if len(denied) == 0 {
			add("kafka.acls", OK, k.ACL.Principal+" may WRITE and DESCRIBE every topic checked", "")
		} else {
			add("kafka.acls", Fail, k.ACL.Principal+" lacks "+strings.Join(denied, ", "),
				fmt.Sprintf("kafka-acls.sh --bootstrap-server %s --add --allow-principal %s --operation Write --operation Describe --topic TOPIC (or --resource-pattern-type prefixed)",
					o.Kafka.Brokers[0], k.ACL.Principal))
		}
	}
}

func opName(op sarama.AclOperation) string {
	if op == sarama.AclOperationWrite {
		return "WRITE"
	}
	return "DESCRIBE"
}

// Text writes the report for a terminal (report.Text): a header naming the
// table and the slot, one aligned line per check (name, verdict, value),
// the fix of a check that is not ok on the next line, and the overall
// verdict with the exit code.
func Text(w io.Writer, r Report) error {
	title := fmt.Sprintf("outbox-relay check: table %s, slot %s", r.Table, r.Slot)
	return report.Text(w, title, r.Checks, r.Outcome)
}

// JSON writes the report as one indented JSON object; the field names are
// documented in docs/commands.md and stable.
func JSON(w io.Writer, r Report) error { return report.JSON(w, r) }

// saslCheck reports the SASL mechanism in use and, for OAUTHBEARER, the
// token source, whether it gave a token and whether the broker took it.
// The token itself is never shown.
func saslCheck(o Options, k KafkaFacts, add addFunc) {
	m := o.Kafka.SASL.Mechanism
	if m == "" {
		add("kafka.sasl", OK, "none (kafka.sasl.mechanism is empty)", "")
		return
	}
	who := "user " + o.Kafka.SASL.Username
	fix := "check kafka.sasl.username and kafka.sasl.password (OUTBOX_RELAY_KAFKA_SASL_PASSWORD)"
	if m == sarama.SASLTypeOAuth {
		who = "token source " + k.SASL.TokenSource
		fix = "check kafka.sasl.oauth.* and that the token is valid, unexpired and meant for this cluster"
		if k.SASL.TokenError != "" {
			add("kafka.sasl", Fail, "OAUTHBEARER, "+who+": no token: "+k.SASL.TokenError, fix)
			return
		}
		if !k.SASL.TokenExpiry.IsZero() {
			who += fmt.Sprintf(" (the token expires in %s)", time.Until(k.SASL.TokenExpiry).Round(time.Second))
		}
	}
	switch {
	case k.SASL.Refused:
		add("kafka.sasl", Fail, m+", "+who+": the broker refused it", fix)
	case k.ConnectError != "":
		add("kafka.sasl", Skip, m+", "+who+": Kafka unreachable", "")
	case m == sarama.SASLTypeOAuth:
		add("kafka.sasl", OK, m+", "+who+": a token was obtained and the broker accepted it", "")
	default:
		add("kafka.sasl", OK, m+", "+who+": the broker accepted it", "")
	}
}
