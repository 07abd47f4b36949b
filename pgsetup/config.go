// Package pgsetup prepares PostgreSQL for the relay's stream: it checks the
// server (wal_level, version), the outbox tables (columns, mapped types,
// the privileges of the dead-letter marks), the publication, the slot and
// its registry row, and creates the publication and the slot when they are
// missing and allowed. Every problem an operator must fix comes back
// marked fault.Fatal, saying how to fix it. Package replication calls
// Prepare before each replication session; `outbox-relay migrate` calls it
// to create the slot; `check` and preflight share its lists.
package pgsetup

import "github.com/outbox-relay/outbox-relay/outboxschema"

// Config is what setup needs to know: the server, the slot, the
// publication and the outbox tables. replication.Config embeds it (these
// are postgres.* keys) and validates it; Prepare expects it valid.
type Config struct {
	// URL is a libpq connection string or URL. It must reach the primary
	// directly (no transaction-pooling proxy): replication needs a session.
	URL string `yaml:"url"`
	// Slot is the logical replication slot; created if missing, never dropped.
	Slot string `yaml:"slot"`
	// Publication names the publication the slot streams.
	Publication string `yaml:"publication"`
	// Table is the outbox table as schema.name (see outboxschema.ParseTable).
	Table string `yaml:"table"`
	// Mappings are the outbox tables the relay reads and their column
	// mappings (resolved by relay.Config.Outboxes from compat, columns and
	// tables). nil: Table alone, the relay's own table read its own way
	// (then its dead-letter row marks are checked too).
	Mappings []outboxschema.Mapping `yaml:"-"`
	// CreatePublication lets the relay create a missing publication.
	CreatePublication bool `yaml:"create_publication"`
	// SlotFailover creates the slot as a failover slot (PostgreSQL 17+:
	// CREATE_REPLICATION_SLOT ... (FAILOVER)) and turns it on for an
	// existing one, so standbys with sync_replication_slots keep a copy
	// the relay continues from after a promotion (docs/failover.md). The
	// relay refuses to start with it on an older server.
	SlotFailover bool `yaml:"slot_failover"`
	// StandbySlots are physical replication slots of standbys that may be
	// promoted: the relay publishes a transaction only once each of them
	// has flushed it (restart_lsn at or past its end), the rule PostgreSQL
	// 17+ applies itself with synchronized_standby_slots, so no event in
	// Kafka is missing from a promoted standby's history (package standby,
	// docs/failover.md). Empty: off.
	StandbySlots []string `yaml:"standby_slots"`
}

// Tables returns the outbox tables of cfg: those of Mappings, or Table
// (parsed; the config was validated). Pure: any goroutine, never blocks.
func (c Config) Tables() []outboxschema.Table {
	if len(c.Mappings) == 0 {
		t, _ := outboxschema.ParseTable(c.Table) // validated with the config
		return []outboxschema.Table{t}
	}
	ts := make([]outboxschema.Table, len(c.Mappings))
	for i, m := range c.Mappings {
		ts[i] = m.Table
	}
	return ts
}
