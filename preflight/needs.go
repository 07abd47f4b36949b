// Package preflight is `outbox-relay check`: before `run`, with the relay's
// own configuration, it reads PostgreSQL and Kafka and says, check by check,
// whether the relay can work and, when not, the exact statement or config
// key that fixes it. It writes nothing. Gather reads, Evaluate judges (pure:
// the unit tests drive it) into checks of package report (check's verdicts
// ok, warn, fail and skip), Text and JSON print the Report; Grants renders
// the GRANT block for a dedicated role.
package preflight

import (
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Options is the part of the relay's configuration the checks depend on.
type Options struct {
	PostgresURL       string // postgres.url; its password is never printed
	Table             outboxschema.Table
	Publication       string
	Slot              string
	CreatePublication bool
	LeaderEnabled     bool
	HeartbeatInterval time.Duration
	RetentionKeep     time.Duration
	RetentionArchive  bool
	Kafka             sink.Config
	DeadLetterTopic   string
	MessagesPrefix    string // messages.prefix; "" when off
	// Registry is set when some topic's serialization needs the Schema
	// Registry; nil otherwise.
	Registry *RegistryOptions
	// Mappings are the outbox tables read through a column mapping
	// (compat, columns, tables; replication.Config.Mappings); nil: Table
	// alone, the relay's own. Their column types are checked instead of the
	// relay's columns, and they need no row-mark or retention privileges.
	Mappings []outboxschema.Mapping
	// SlotFailover and StandbySlots are postgres.slot_failover and
	// postgres.standby_slots: the protections against phantom events
	// checked (pgsetup.FailoverChecks).
	SlotFailover bool
	StandbySlots []string
	// Routes are the outbox tables as the relay routes their rows (one per
	// relay.Outbox); nil: Table, the relay's own way, under
	// Kafka.TopicTemplate.
	Routes []Route
	// PoisonHalts is on_poison: halt: a poison event stops the relay and
	// the dead-letter topic is not used.
	PoisonHalts bool
	// ReservedHeaders are the header names reserved besides the relay's
	// own in its record format (record.ReservedExtra: compat: debezium's
	// id).
	ReservedHeaders []string
}

// Need is one privilege the relay's role needs on a table.
type Need struct {
	Check     string             // the check that reports it
	Table     outboxschema.Table // the object
	Privilege string             // SELECT, INSERT, UPDATE or DELETE
	Columns   []string           // column-level need; nil = the whole table
	Why       string
}

// Check names of the privilege checks (stable: documented in
// docs/commands.md).
const (
	CheckPrivOutbox    = "privileges.outbox"
	CheckPrivRetention = "privileges.retention"
	CheckPrivRegistry  = "privileges.slot_registry"
	CheckPrivLeader    = "privileges.leader"
	CheckPrivDelivery  = "privileges.delivery"
)

// ArchiveTable is where retention.archive moves rows (package retention).
func ArchiveTable(t outboxschema.Table) outboxschema.Table { return t.Sibling(t.Name + "_archive") }

// Needs lists every table privilege the relay needs with this config, in
// the order the checks and the grant block show them. Pure.
func Needs(o Options) []Need {
	t := o.Table
	var ns []Need
	// The dead-letter and halt marks, exactly what the relay checks at
	// start (pgsetup.Prepare), grouped by privilege.
	var order []string
	cols := map[string][]string{}
	for _, p := range pgsetup.MarkPrivileges() {
		if cols[p[0]] == nil {
			order = append(order, p[0])
		}
		cols[p[0]] = append(cols[p[0]], p[1])
	}
	for _, priv := range order {
		if o.Mappings != nil {
			break // a mapped table has no row marks
		}
		ns = append(ns, Need{CheckPrivOutbox, t, priv, cols[priv], "dead-letter and halt marks on poison rows"})
	}
	if o.RetentionKeep > 0 && o.Mappings == nil {
		ns = append(ns,
			Need{CheckPrivRetention, t, "SELECT", nil, "retention reads delivered rows (retention.keep > 0)"},
			Need{CheckPrivRetention, t, "DELETE", nil, "retention deletes delivered rows (retention.keep > 0)"})
		if o.RetentionArchive {
			a := ArchiveTable(t)
			ns = append(ns, Need{CheckPrivRetention, a, "INSERT", nil, "retention.archive moves rows into the archive"})
		}
	}
	reg := t.Sibling(outboxschema.SlotRegistry)
	ns = append(ns,
		Need{CheckPrivRegistry, reg, "SELECT", nil, "slot registry: notices a dropped slot"},
		Need{CheckPrivRegistry, reg, "INSERT", nil, "slot registry: records the slot it creates"})
	if o.LeaderEnabled {
		l := t.Sibling(outboxschema.LeaseTable)
		for _, p := range []string{"SELECT", "INSERT", "UPDATE"} {
			ns = append(ns, Need{CheckPrivLeader, l, p, nil, "leader election lease"})
		}
	}
	if o.Mappings != nil {
		return ns // a mapped table has no delivery horizon
	}
	d := t.Sibling(outboxschema.DeliveryTable)
	for _, p := range []string{"SELECT", "INSERT", "UPDATE"} {
		ns = append(ns, Need{CheckPrivDelivery, d, p, nil, "delivery horizon (leader)"})
	}
	return ns
}

// grantSQL is the GRANT of the needs ns (same table) to role.
func grantSQL(ns []Need, role string) string {
	if len(ns) == 0 {
		return ""
	}
	var parts []string
	for _, n := range ns {
		p := n.Privilege
		if len(n.Columns) > 0 {
			p += " (" + quoteAll(n.Columns) + ")"
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("GRANT %s ON %s TO %s;", strings.Join(parts, ", "), ns[0].Table.Quoted(), outboxschema.QuoteIdent(role))
}

func quoteAll(cols []string) string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = outboxschema.QuoteIdent(c)
	}
	return strings.Join(q, ", ")
}

// grantsByTable groups ns by table, keeping the first appearance order.
func grantsByTable(ns []Need, role string) []string {
	var order []outboxschema.Table
	by := map[outboxschema.Table][]Need{}
	for _, n := range ns {
		if by[n.Table] == nil {
			order = append(order, n.Table)
		}
		by[n.Table] = append(by[n.Table], n)
	}
	var out []string
	for _, t := range order {
		out = append(out, grantSQL(by[t], role))
	}
	return out
}

// EmitMessageFunc is the function heartbeats call, as a GRANT names it on
// a server of versionNum (server_version_num): PostgreSQL 17 added a fourth
// argument (flush boolean DEFAULT false), so the three-argument signature no
// longer exists there.
func EmitMessageFunc(versionNum int) string {
	if versionNum >= 170000 {
		return "pg_logical_emit_message(boolean, text, text, boolean)"
	}
	return "pg_logical_emit_message(boolean, text, text)"
}

// grantEmitMessage is a GRANT of EXECUTE on the heartbeat function to role
// that runs on every supported version: the block connects to nothing, so
// the server picks the signature.
func grantEmitMessage(role string) string {
	lit := "'" + strings.ReplaceAll(role, "'", "''") + "'"
	return "DO $outbox_relay$ BEGIN EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', CASE WHEN " +
		"current_setting('server_version_num')::int >= 170000 THEN '" + EmitMessageFunc(170000) + "' ELSE '" +
		EmitMessageFunc(0) + "' END, " + lit + "); END $outbox_relay$;"
}

// Grants is the ready-to-paste block that gives role everything this
// config's relay needs (`outbox-relay check --print-grants ROLE`). Every
// identifier is quoted. Pure.
func Grants(o Options, role string) string {
	r := outboxschema.QuoteIdent(role)
	t := o.Table
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("-- outbox-relay: privileges of role %s for outbox table %s, publication %s, slot %s.", r, t.Quoted(),
		outboxschema.QuoteIdent(o.Publication), o.Slot)
	w("-- Run as a superuser (or the table owner and a role with CREATEROLE), after `outbox-relay migrate`.")
	w("-- CREATE ROLE %s LOGIN REPLICATION PASSWORD '...';  -- if the role does not exist yet", r)
	w("ALTER ROLE %s LOGIN REPLICATION;", r)
	w("GRANT USAGE ON SCHEMA %s TO %s;", outboxschema.QuoteIdent(t.Schema), r)
	for _, g := range grantsByTable(Needs(o), role) {
		w("%s", g)
	}
	if o.LeaderEnabled {
		w("-- Fencing a stalled leader: either run every instance as %s, or:", r)
		w("GRANT pg_signal_backend TO %s;", r)
	}
	if o.HeartbeatInterval > 0 {
		w("-- Heartbeats (PUBLIC has it by default; needed only if it was revoked). The signature is")
		w("-- %s on PostgreSQL 17+, %s before:", EmitMessageFunc(170000), EmitMessageFunc(0))
		w("%s", grantEmitMessage(role))
	}
	if o.RetentionKeep > 0 {
		w("-- A partitioned outbox: retention drops whole partitions, which only the table owner may do;")
		w("-- then also: GRANT <owner of %s> TO %s;", t.Quoted(), r)
	}
	w("-- The publication is created by `outbox-relay migrate` as the table owner; with this role set")
	w("-- postgres.create_publication: false, or create it yourself:")
	w("-- %s;", createPublicationSQL(o))
	return b.String()
}

// createPublicationSQL is the insert-only publication of the outbox table,
// through its root when the table is partitioned (harmless otherwise).
func createPublicationSQL(o Options) string {
	tables := o.Table.Quoted()
	if o.Mappings != nil {
		q := make([]string, len(o.Mappings))
		for i, m := range o.Mappings {
			q[i] = m.Table.Quoted()
		}
		tables = strings.Join(q, ", ")
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
		outboxschema.QuoteIdent(o.Publication), tables)
}
