package preflight

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/leader"
	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/pgsetup"
	"github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/sink"
)

func opts() Options {
	k := sink.DefaultConfig()
	k.Brokers = []string{"k1:9092"}
	k.AutoCreateTopics = true
	return Options{Table: outboxschema.Table{Schema: "public", Name: "outbox"}, Publication: "outbox_pub", Slot: "outbox_relay",
		CreatePublication: true, LeaderEnabled: true, HeartbeatInterval: time.Second, RetentionKeep: 168 * time.Hour,
		Kafka: k, DeadLetterTopic: "outbox.dlq"}
}

// healthy is what a ready server and cluster answer.
func healthy() Facts {
	o := opts()
	f := Facts{Options: o}
	yes := true
	f.PG = PGFacts{Addr: "db:5432", Role: "relay", Replication: true, Version: "15.4", VersionNum: 150004, WalLevel: "logical",
		MaxSlots: 10, UsedSlots: 1, MaxSenders: 10, ActiveSenders: 1, MaxSlotWALKeep: "10GB", SchemaUsage: true,
		TableExists: true, OwnsTable: true, CanCreateInDB: true, EmitMessage: &yes,
		Fence:       &leader.FenceRights{OK: true, Role: "relay"},
		Publication: PubFacts{Exists: true, Insert: true, HasTable: true},
		Slot:        SlotFacts{Exists: true, Plugin: "pgoutput", SlotType: "logical", Database: "app", CurrentDB: "app", WALStatus: "reserved"},
		Routes:      []RouteRead{{Table: "public.outbox", Values: []RouteValue{{AggregateType: ptr("order"), Rows: 5}}}}}
	for _, n := range Needs(o) {
		f.PG.Privs = append(f.PG.Privs, PrivFact{Need: n, Exists: true, Have: true})
	}
	auto := true
	f.Kafka = KafkaFacts{BrokerAutoCreate: &auto, ACL: ACLFacts{Skipped: "the brokers have no authorizer: ACLs are not enforced"},
		Topics: []TopicFact{{Name: "outbox.event.order", Exists: true, Partitions: 3}, {Name: "outbox.dlq", DeadLetter: true, Exists: true, Partitions: 1}}}
	return f
}

func find(t *testing.T, r Report, name string) report.Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return report.Check{}
}

func TestEvaluate(t *testing.T) {
	tests := []struct {
		name    string
		change  func(f *Facts)
		check   string
		verdict report.Verdict
		exit    int
		fix     []string // substrings of the check's fix
	}{
		{"healthy", func(*Facts) {}, "wal_level", OK, report.ExitOK, nil},
		{"no inheritance child", func(*Facts) {}, "inheritance", OK, report.ExitOK, nil},
		{"an inheritance child", func(f *Facts) {
			in := pgsetup.Inheritance{Table: f.Options.Table, Columns: []string{`"id"`, `"payload"`},
				Children: []pgsetup.Child{{Table: outboxschema.Table{Schema: "public", Name: "outbox_legacy"}, Parent: f.Options.Table}}}
			f.PG.Inheritance = []InheritFact{{Table: "public.outbox", Children: in.Names(), Problem: in.Problem(), Fix: in.Fix()}}
		}, "inheritance", Fail, report.ExitBad, []string{
			`INSERT INTO "public"."outbox" ("id", "payload") SELECT "id", "payload" FROM ONLY "public"."outbox_legacy";`,
			`ALTER TABLE "public"."outbox_legacy" NO INHERIT "public"."outbox";`}},
		{"wal_level replica", func(f *Facts) { f.PG.WalLevel = "replica" }, "wal_level", Fail, report.ExitBad,
			[]string{"ALTER SYSTEM SET wal_level = logical", "restart PostgreSQL"}},
		{"PostgreSQL 13", func(f *Facts) { f.PG.VersionNum, f.PG.Version = 130011, "13.11" }, "server_version", Warn, report.ExitWarn, []string{"14..18"}},
		{"PostgreSQL 13 with messages.prefix", func(f *Facts) {
			f.PG.VersionNum, f.PG.Version = 130011, "13.11"
			f.Options.MessagesPrefix = "orders-outbox"
		}, "server_version", Fail, report.ExitBad, []string{"upgrade PostgreSQL, or unset messages.prefix"}},
		{"PostgreSQL 14 with messages.prefix", func(f *Facts) { f.PG.VersionNum = 140000; f.Options.MessagesPrefix = "orders-outbox" }, "server_version", OK, report.ExitOK, nil},
		{"PostgreSQL 18", func(f *Facts) { f.PG.VersionNum = 180000 }, "server_version", OK, report.ExitOK, nil},
		{"PostgreSQL 19", func(f *Facts) { f.PG.VersionNum = 190000 }, "server_version", Warn, report.ExitWarn, nil},
		{"no free slot, slot missing", func(f *Facts) { f.PG.Slot = SlotFacts{}; f.PG.UsedSlots = 10 }, "replication_slots", Fail, report.ExitBad,
			[]string{"max_replication_slots = 12"}},
		{"no free slot, slot exists", func(f *Facts) { f.PG.UsedSlots = 10 }, "replication_slots", Warn, report.ExitWarn,
			[]string{"max_replication_slots = 11", "temporary slot"}},
		{"one free slot, slot exists", func(f *Facts) { f.PG.UsedSlots = 9 }, "replication_slots", OK, report.ExitOK, nil},
		{"one free slot, slot missing", func(f *Facts) { f.PG.Slot = SlotFacts{}; f.PG.UsedSlots = 9 }, "replication_slots", Warn, report.ExitWarn,
			[]string{"max_replication_slots = 11"}},
		{"two free slots, slot missing", func(f *Facts) { f.PG.Slot = SlotFacts{}; f.PG.UsedSlots = 8 }, "replication_slots", OK, report.ExitOK, nil},
		{"no wal sender", func(f *Facts) { f.PG.ActiveSenders = 10 }, "wal_senders", Fail, report.ExitBad, []string{"max_wal_senders = 12"}},
		{"unlimited slot WAL", func(f *Facts) { f.PG.MaxSlotWALKeep = "-1" }, "max_slot_wal_keep_size", Warn, report.ExitWarn,
			[]string{"ALTER SYSTEM SET max_slot_wal_keep_size", "pg_reload_conf"}},
		{"no REPLICATION", func(f *Facts) { f.PG.Replication = false; f.PG.Role = "App Relay" }, "role.replication", Fail, report.ExitBad,
			[]string{`ALTER ROLE "App Relay" REPLICATION`}},
		{"superuser", func(f *Facts) { f.PG.Replication, f.PG.Super = false, true }, "role.replication", OK, report.ExitOK, nil},
		{"no UPDATE of the marks", func(f *Facts) {
			for i := range f.PG.Privs {
				if f.PG.Privs[i].Check == CheckPrivOutbox && f.PG.Privs[i].Privilege == "UPDATE" {
					f.PG.Privs[i].Have = false
				}
			}
		}, CheckPrivOutbox, Fail, report.ExitBad, []string{`GRANT UPDATE ("attempt_count", "last_error", "dead_lettered_at") ON "public"."outbox" TO "relay";`}},
		{"no registry INSERT", func(f *Facts) {
			for i := range f.PG.Privs {
				if f.PG.Privs[i].Check == CheckPrivRegistry && f.PG.Privs[i].Privilege == "INSERT" {
					f.PG.Privs[i].Have = false
				}
			}
		}, CheckPrivRegistry, Fail, report.ExitBad, []string{`GRANT INSERT ON "public"."outbox_relay_slots" TO "relay";`}},
		{"no lease table", func(f *Facts) {
			for i := range f.PG.Privs {
				if f.PG.Privs[i].Check == CheckPrivLeader {
					f.PG.Privs[i].Exists = false
				}
			}
		}, CheckPrivLeader, Fail, report.ExitBad, []string{"outbox-relay migrate"}},
		{"cannot fence", func(f *Facts) {
			f.PG.Fence = &leader.FenceRights{Problem: "this standby cannot fence a stalled leader", Role: "relay"}
		}, "privileges.fence", Fail, report.ExitBad, []string{`GRANT pg_signal_backend TO "relay"`}},
		{"no heartbeat EXECUTE", func(f *Facts) { no := false; f.PG.EmitMessage = &no }, "privileges.heartbeat", Warn, report.ExitWarn,
			[]string{"GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO"}},
		{"no heartbeat EXECUTE on 17", func(f *Facts) {
			no := false
			f.PG.EmitMessage, f.PG.VersionNum, f.PG.Version = &no, 170002, "17.2"
		}, "privileges.heartbeat", Warn, report.ExitWarn, []string{"GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text, boolean) TO"}},
		{"publication missing, creation off", func(f *Facts) {
			f.Options.CreatePublication = false
			f.PG.Publication, f.PG.Slot = PubFacts{}, SlotFacts{}
		}, "publication", Fail, report.ExitBad,
			[]string{`CREATE PUBLICATION "outbox_pub" FOR TABLE "public"."outbox" WITH (publish = 'insert'`}},
		{"publication missing, relay creates it", func(f *Facts) { f.PG.Publication, f.PG.Slot = PubFacts{}, SlotFacts{} }, "publication", OK, report.ExitOK, nil},
		{"publication missing, slot exists", func(f *Facts) { f.PG.Publication = PubFacts{} }, "publication", Fail, report.ExitBad, nil},
		{"publication publishes updates", func(f *Facts) { f.PG.Publication.Update = true }, "publication", Warn, report.ExitWarn,
			[]string{`ALTER PUBLICATION "outbox_pub" SET (publish = 'insert')`}},
		{"publication lacks the table", func(f *Facts) { f.PG.Publication.HasTable = false }, "publication", Fail, report.ExitBad,
			[]string{`ALTER PUBLICATION "outbox_pub" ADD TABLE "public"."outbox"`}},
		{"publication has a column list", func(f *Facts) {
			f.PG.Publication.Shape = []pgsetup.Problem{{Kind: pgsetup.KindColumnList, What: "publication \"outbox_pub\" streams only the columns (id) of public.outbox",
				Fix: `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`}}
		}, "publication", Fail, report.ExitBad, []string{`ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox";`}},
		{"publication has a column list and a row filter", func(f *Facts) {
			f.PG.Publication.Shape = []pgsetup.Problem{
				{Kind: pgsetup.KindColumnList, What: "column list", Fix: `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`},
				{Kind: pgsetup.KindRowFilter, What: "row filter", Fix: `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`}}
		}, "publication", Fail, report.ExitBad, []string{`ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox";`}},
		{"publication publishes updates and has a row filter", func(f *Facts) {
			f.PG.Publication.Update = true
			f.PG.Publication.Shape = []pgsetup.Problem{{Kind: pgsetup.KindRowFilter, What: "row filter", Fix: `ALTER PUBLICATION "outbox_pub" SET TABLE "public"."outbox"`}}
		}, "publication", Fail, report.ExitBad, []string{`SET TABLE "public"."outbox"`}},
		{"partitioned, not via root", func(f *Facts) { f.PG.Partitioned = true }, "publication", Fail, report.ExitBad,
			[]string{"publish_via_partition_root = true"}},
		{"slot test_decoding", func(f *Facts) { f.PG.Slot.Plugin = "test_decoding" }, "slot", Fail, report.ExitBad, []string{"pg_drop_replication_slot('outbox_relay')"}},
		{"slot extended", func(f *Facts) { f.PG.Slot.WALStatus = "extended" }, "slot", Warn, report.ExitWarn, nil},
		{"slot lost", func(f *Facts) { f.PG.Slot.WALStatus = "lost" }, "slot", Fail, report.ExitBad, nil},
		{"slot dropped", func(f *Facts) { f.PG.Slot = SlotFacts{Registered: true} }, "slot", Fail, report.ExitBad, []string{"outbox-relay status"}},
		{"postgres down", func(f *Facts) { f.PG = PGFacts{Addr: "db:5432", ConnectError: "connection refused"} }, "postgres", Fail, report.ExitBad,
			[]string{"postgres.url"}},
		{"kafka down", func(f *Facts) { f.Kafka = KafkaFacts{ConnectError: "dial tcp: refused"} }, "kafka", Fail, report.ExitBad, []string{"kafka.brokers"}},
		{"no SASL", func(*Facts) {}, "kafka.sasl", OK, report.ExitOK, nil},
		{"OAUTHBEARER accepted", func(f *Facts) {
			f.Options.Kafka.SASL.Mechanism = "OAUTHBEARER"
			f.Kafka.SASL = SASLFacts{Mechanism: "OAUTHBEARER", TokenSource: "file"}
		}, "kafka.sasl", OK, report.ExitOK, nil},
		{"OAUTHBEARER without a token", func(f *Facts) {
			f.Options.Kafka.SASL.Mechanism = "OAUTHBEARER"
			f.Kafka = KafkaFacts{ConnectError: "no OAUTHBEARER token: HTTP 503", SASL: SASLFacts{Mechanism: "OAUTHBEARER", TokenSource: "client_credentials", TokenError: "HTTP 503"}}
		}, "kafka.sasl", Fail, report.ExitBad, []string{"kafka.sasl.oauth.*"}},
		{"OAUTHBEARER refused", func(f *Facts) {
			f.Options.Kafka.SASL.Mechanism = "OAUTHBEARER"
			f.Kafka = KafkaFacts{ConnectError: "SASL Authentication failed", SASL: SASLFacts{Mechanism: "OAUTHBEARER", TokenSource: "static", Refused: true}}
		}, "kafka.sasl", Fail, report.ExitBad, []string{"kafka.sasl.oauth.*", "unexpired"}},
		{"SCRAM refused", func(f *Facts) {
			f.Options.Kafka.SASL.Mechanism, f.Options.Kafka.SASL.Username = "SCRAM-SHA-512", "relay"
			f.Kafka = KafkaFacts{ConnectError: "SASL Authentication failed", SASL: SASLFacts{Mechanism: "SCRAM-SHA-512", Refused: true}}
		}, "kafka.sasl", Fail, report.ExitBad, []string{"kafka.sasl.password"}},
		{"topic missing, no auto-create", func(f *Facts) {
			f.Options.Kafka.AutoCreateTopics = false
			f.Kafka.Topics[1].Exists = false
		}, "kafka.topic", Fail, report.ExitBad, []string{"--topic outbox.dlq", "kafka.auto_create_topics: true"}},
		{"topic missing, broker creates it", func(f *Facts) { f.Kafka.Topics[1].Exists = false }, "kafka.topic", OK, report.ExitOK, nil},
		{"topic missing, broker auto-create off", func(f *Facts) { no := false; f.Kafka.BrokerAutoCreate = &no; f.Kafka.Topics[1].Exists = false },
			"kafka.topic", Fail, report.ExitBad, []string{"auto.create.topics.enable=true"}},
		{"topic missing, broker setting unknown", func(f *Facts) { f.Kafka.BrokerAutoCreate = nil; f.Kafka.Topics[0].Exists = false },
			"kafka.topic", Warn, report.ExitWarn, []string{"--topic outbox.event.order"}},
		{"rows not readable", func(f *Facts) {
			f.PG.Routes[0] = RouteRead{Table: "public.outbox", Err: "permission denied", SQL: "SELECT 1"}
		},
			"kafka.topics", Warn, report.ExitWarn, []string{"SELECT 1;"}},
		{"ACLs deny the dead-letter topic", func(f *Facts) {
			f.Kafka.ACL = ACLFacts{Principal: "User:relay", Acls: []sarama.ResourceAcls{{
				Resource: sarama.Resource{ResourceType: sarama.AclResourceTopic, ResourceName: "outbox.event.", ResourcePatternType: sarama.AclPatternPrefixed},
				Acls:     []*sarama.Acl{{Principal: "User:relay", Host: "*", Operation: sarama.AclOperationWrite, PermissionType: sarama.AclPermissionAllow}}}}}
		}, "kafka.acls", Fail, report.ExitBad, []string{"--allow-principal User:relay --operation Write"}},
		{"17, no protection, a standby", func(f *Facts) {
			f.PG.VersionNum = 170008
			f.PG.Failover = pgsetup.FailoverFacts{VersionNum: 170008, SlotExists: true, PhysicalSlots: []string{"standby_1"}, Standbys: 1}
		}, pgsetup.CheckFailover, Warn, report.ExitWarn, []string{"postgres.slot_failover: true", "synchronized_standby_slots = 'standby_1'", "postgres.standby_slots: [standby_1]"}},
		{"no standby: no warning", func(f *Facts) { f.PG.Failover = pgsetup.FailoverFacts{VersionNum: 170008} }, pgsetup.CheckFailover, OK, report.ExitOK, nil},
		{"standby slot missing", func(f *Facts) {
			f.Options.StandbySlots = []string{"standby_1"}
			f.PG.Failover = pgsetup.FailoverFacts{VersionNum: 150004, StandbySlots: []pgsetup.StandbySlot{{Name: "standby_1"}}}
		}, pgsetup.CheckFailoverStandbySlots, Fail, report.ExitBad, []string{"pg_create_physical_replication_slot('standby_1')"}},
		{"failover slot, setting empty", func(f *Facts) {
			f.Options.SlotFailover = true
			empty := ""
			f.PG.Failover = pgsetup.FailoverFacts{VersionNum: 170008, SlotExists: true, SlotFailover: true, SynchronizedStandbySlots: &empty, PhysicalSlots: []string{"standby_1"}}
		}, pgsetup.CheckFailoverSyncSlots, Warn, report.ExitWarn, []string{"ALTER SYSTEM SET synchronized_standby_slots = 'standby_1'; SELECT pg_reload_conf();"}},
		{"ACLs not describable", func(f *Facts) { f.Kafka.ACL = ACLFacts{Skipped: "not authorized to describe ACLs"} }, "kafka.acls", Skip, report.ExitOK, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := healthy()
			tt.change(&f)
			r := Evaluate(f)
			c := find(t, r, tt.check)
			if c.Verdict != tt.verdict || r.ExitCode != tt.exit {
				t.Fatalf("%s = %s (exit %d), want %s (exit %d): %+v", tt.check, c.Verdict, r.ExitCode, tt.verdict, tt.exit, r.Checks)
			}
			if c.Verdict != OK && c.Verdict != Skip && c.Fix == "" {
				t.Errorf("%s is %s without a fix", c.Name, c.Verdict)
			}
			for _, w := range tt.fix {
				if !strings.Contains(c.Fix, w) {
					t.Errorf("fix %q lacks %q", c.Fix, w)
				}
			}
		})
	}
}

// The grant block quotes every identifier, so odd names paste as they are.
func TestGrantsOddNames(t *testing.T) {
	o := opts()
	o.Table = outboxschema.Table{Schema: "Events", Name: "Outbox$1"}
	o.Publication = `Pub "x"`
	o.RetentionArchive = true
	g := Grants(o, `Relay "Role"`)
	for _, want := range []string{
		`ALTER ROLE "Relay ""Role""" LOGIN REPLICATION;`,
		`GRANT USAGE ON SCHEMA "Events" TO "Relay ""Role""";`,
		`GRANT SELECT ("id", "dead_lettered_at"), UPDATE ("attempt_count", "last_error", "dead_lettered_at"), SELECT, DELETE ON "Events"."Outbox$1" TO "Relay ""Role""";`,
		`GRANT INSERT ON "Events"."Outbox$1_archive" TO "Relay ""Role""";`,
		`GRANT SELECT, INSERT ON "Events"."outbox_relay_slots" TO "Relay ""Role""";`,
		`GRANT SELECT, INSERT, UPDATE ON "Events"."outbox_relay_leader" TO "Relay ""Role""";`,
		`GRANT SELECT, INSERT, UPDATE ON "Events"."outbox_relay_delivery" TO "Relay ""Role""";`,
		`GRANT pg_signal_backend TO "Relay ""Role""";`,
		`THEN 'pg_logical_emit_message(boolean, text, text, boolean)' ELSE 'pg_logical_emit_message(boolean, text, text)' END, 'Relay "Role"');`,
		`CREATE PUBLICATION "Pub ""x""" FOR TABLE "Events"."Outbox$1" WITH (publish = 'insert'`,
	} {
		if !strings.Contains(g, want) {
			t.Errorf("grant block lacks\n  %s\n%s", want, g)
		}
	}
	o.LeaderEnabled, o.RetentionKeep, o.HeartbeatInterval = false, 0, 0
	g = Grants(o, "relay")
	for _, absent := range []string{"outbox_relay_leader", "pg_signal_backend", "DELETE", "pg_logical_emit_message"} {
		if strings.Contains(g, absent) {
			t.Errorf("leader, retention and heartbeat off, yet the block names %s:\n%s", absent, g)
		}
	}
}

func TestACLAllowed(t *testing.T) {
	topic := func(name string, pt sarama.AclResourcePatternType, acls ...*sarama.Acl) sarama.ResourceAcls {
		return sarama.ResourceAcls{Resource: sarama.Resource{ResourceType: sarama.AclResourceTopic, ResourceName: name, ResourcePatternType: pt}, Acls: acls}
	}
	acl := func(p string, op sarama.AclOperation, perm sarama.AclPermissionType) *sarama.Acl {
		return &sarama.Acl{Principal: p, Host: "*", Operation: op, PermissionType: perm}
	}
	allow, deny := sarama.AclPermissionAllow, sarama.AclPermissionDeny
	tests := []struct {
		name string
		acls []sarama.ResourceAcls
		op   sarama.AclOperation
		want bool
	}{
		{"none", nil, sarama.AclOperationWrite, false},
		{"literal write", []sarama.ResourceAcls{topic("t", sarama.AclPatternLiteral, acl("User:r", sarama.AclOperationWrite, allow))}, sarama.AclOperationWrite, true},
		{"write implies describe", []sarama.ResourceAcls{topic("t", sarama.AclPatternLiteral, acl("User:r", sarama.AclOperationWrite, allow))}, sarama.AclOperationDescribe, true},
		{"prefixed all", []sarama.ResourceAcls{topic("t", sarama.AclPatternPrefixed, acl("User:r", sarama.AclOperationAll, allow))}, sarama.AclOperationWrite, true},
		{"wildcard principal and topic", []sarama.ResourceAcls{topic("*", sarama.AclPatternLiteral, acl("User:*", sarama.AclOperationWrite, allow))}, sarama.AclOperationWrite, true},
		{"other principal", []sarama.ResourceAcls{topic("t", sarama.AclPatternLiteral, acl("User:x", sarama.AclOperationWrite, allow))}, sarama.AclOperationWrite, false},
		{"deny wins", []sarama.ResourceAcls{topic("*", sarama.AclPatternLiteral, acl("User:r", sarama.AclOperationAll, allow)),
			topic("t", sarama.AclPatternLiteral, acl("User:r", sarama.AclOperationWrite, deny))}, sarama.AclOperationWrite, false},
		{"other topic", []sarama.ResourceAcls{topic("u", sarama.AclPatternLiteral, acl("User:r", sarama.AclOperationWrite, allow))}, sarama.AclOperationWrite, false},
	}
	for _, tt := range tests {
		if got := allowed(tt.acls, "User:r", "t", tt.op); got != tt.want {
			t.Errorf("%s: allowed = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The JSON field names are documented: keep them.
func TestJSONFields(t *testing.T) {
	var buf bytes.Buffer
	if err := JSON(&buf, Evaluate(healthy())); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"verdict", "exit_code", "table", "slot", "checks"} {
		if _, ok := m[k]; !ok {
			t.Errorf("no %q in %s", k, buf.String())
		}
	}
	c := m["checks"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "verdict", "value"} {
		if _, ok := c[k]; !ok {
			t.Errorf("check lacks %q: %v", k, c)
		}
	}
}

// A connection error never carries the password.
func TestNoSecret(t *testing.T) {
	addr, pw := pgAddr("postgres://relay:s3cr3t-pw@db.example:6543/app")
	if addr != "db.example:6543" || pw != "s3cr3t-pw" {
		t.Fatalf("pgAddr = %q, %q", addr, pw)
	}
	if got := noSecret("password authentication failed: s3cr3t-pw", pw); strings.Contains(got, pw) {
		t.Errorf("noSecret left the password: %q", got)
	}
}
