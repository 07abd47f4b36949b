//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/preflight"
	checkreport "github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// runCheck runs `outbox-relay check --json` with the env's flags, the
// database URL replaced by dbURL when not empty, plus extra; it returns the
// parsed report and the raw output.
func (e *env) runCheck(t *testing.T, dbURL string, extra ...string) (preflight.Report, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := append([]string{"check", "--json"}, e.flags()...)
	if dbURL != "" {
		for i := range args {
			if args[i] == "--postgres-url" {
				args[i+1] = dbURL
			}
		}
	}
	code, out, err := testkit.Run(ctx, os.Environ(), relayBin, append(args, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	var r preflight.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("check --json: exit %d, not JSON: %v\n%s", code, err, out)
	}
	if r.ExitCode != code {
		t.Fatalf("check exited %d, its report says %d\n%s", code, r.ExitCode, out)
	}
	return r, out
}

func checkNamed(t *testing.T, r preflight.Report, name string) checkreport.Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, r.Checks)
	return checkreport.Check{}
}

func noFailures(t *testing.T, r preflight.Report, except ...string) {
	t.Helper()
	for _, c := range r.Checks {
		if c.Verdict == preflight.Fail && !contains(except, c.Name) {
			t.Errorf("check %s failed: %s -> %s", c.Name, c.Value, c.Fix)
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// `outbox-relay check` passes on the test services with the test's outbox
// (warnings allowed: the test server keeps max_slot_wal_keep_size -1), and
// a dedicated role given exactly the `--print-grants` block passes every
// privilege check; without REPLICATION it fails naming ALTER ROLE.
func TestCheck(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "check")
	r, out := e.runCheck(t, "")
	noFailures(t, r)
	if r.ExitCode != checkreport.ExitOK && r.ExitCode != checkreport.ExitWarn {
		t.Errorf("exit %d on healthy services:\n%s", r.ExitCode, out)
	}
	for _, name := range []string{"server_version", "wal_level", "replication_slots", "wal_senders", "role.replication",
		"privileges.outbox", "privileges.slot_registry", "privileges.leader", "privileges.delivery", "privileges.fence",
		"publication", "slot", "kafka", "kafka.topics", "kafka.acls"} {
		if c := checkNamed(t, r, name); c.Verdict == preflight.Fail {
			t.Errorf("%s: %+v", name, c)
		}
	}
	pu, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := pu.User.Password(); pw == "" || strings.Contains(out, pw) {
		t.Errorf("check printed the database password:\n%s", out)
	}

	// A dedicated role with the printed grants, then without REPLICATION.
	ctx := context.Background()
	role := "e2e_check_Role" // mixed case: the block must quote it
	code, grants, err := testkit.Run(ctx, os.Environ(), relayBin, append([]string{"check", "--print-grants", role}, e.flags()...)...)
	if err != nil || code != 0 {
		t.Fatalf("--print-grants: exit %d %v\n%s", code, err, grants)
	}
	mustExec(t, e, `DROP ROLE IF EXISTS "`+role+`"`)
	mustExec(t, e, `CREATE ROLE "`+role+`" LOGIN PASSWORD 'check-pw-9'`)
	t.Cleanup(func() {
		e.DB.Exec(ctx, `DROP OWNED BY "`+role+`"`)
		e.DB.Exec(ctx, `DROP ROLE IF EXISTS "`+role+`"`)
	})
	if _, err := e.DB.Exec(ctx, grants); err != nil {
		t.Fatalf("the printed grant block does not run: %v\n%s", err, grants)
	}
	u := *pu
	u.User = url.UserPassword(role, "check-pw-9")
	r, out = e.runCheck(t, u.String())
	noFailures(t, r)
	if strings.Contains(out, "check-pw-9") {
		t.Errorf("check printed the role's password:\n%s", out)
	}

	mustExec(t, e, `ALTER ROLE "`+role+`" NOREPLICATION`)
	r, out = e.runCheck(t, u.String())
	c := checkNamed(t, r, "role.replication")
	if c.Verdict != preflight.Fail || !strings.Contains(c.Fix, `ALTER ROLE "`+role+`" REPLICATION`) || r.ExitCode != checkreport.ExitBad {
		t.Errorf("role without REPLICATION: %+v, exit %d\n%s", c, r.ExitCode, out)
	}
	noFailures(t, r, "role.replication")

	// A missing privilege is named with its GRANT.
	mustExec(t, e, `REVOKE INSERT ON `+e.Schema+`.outbox_relay_slots FROM "`+role+`"`)
	r, out = e.runCheck(t, u.String())
	c = checkNamed(t, r, "privileges.slot_registry")
	if c.Verdict != preflight.Fail || !strings.Contains(c.Fix, `GRANT INSERT ON "`) || !strings.Contains(c.Fix, `TO "`+role+`"`) {
		t.Errorf("registry without INSERT: %+v\n%s", c, out)
	}
}

// A missing publication with postgres.create_publication off fails naming
// the CREATE PUBLICATION to run.
func TestCheckMissingPublication(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "checkpub")
	mustExec(t, e, "SELECT pg_drop_replication_slot($1)", e.Slot)
	mustExec(t, e, "DELETE FROM "+e.Schema+".outbox_relay_slots WHERE slot_name = $1", e.Slot)
	mustExec(t, e, `DROP PUBLICATION "`+e.Pub+`"`)
	r, out := e.runCheck(t, "", "--create-publication=false")
	c := checkNamed(t, r, "publication")
	if c.Verdict != preflight.Fail || !strings.Contains(c.Fix, `CREATE PUBLICATION "`+e.Pub+`" FOR TABLE `) ||
		!strings.Contains(c.Fix, "publish = 'insert'") || r.ExitCode != checkreport.ExitBad {
		t.Errorf("missing publication, creation off: %+v, exit %d\n%s", c, r.ExitCode, out)
	}
	noFailures(t, r, "publication")
	// With creation on, the relay creates it at start: not a failure.
	r, out = e.runCheck(t, "")
	if c := checkNamed(t, r, "publication"); c.Verdict != preflight.OK {
		t.Errorf("missing publication, creation on: %+v\n%s", c, out)
	}
}

// wal_level = replica fails naming ALTER SYSTEM and the restart.
func TestCheckWalLevelReplica(t *testing.T) {
	e := newEnv(t, "checkwal")
	ctx := context.Background()
	mustExec(t, e, "SELECT pg_drop_replication_slot($1)", e.Slot)
	mustExec(t, e, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'e2e\\_%' AND NOT active")
	var others int
	if err := e.DB.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'").Scan(&others); err != nil || others > 0 {
		t.Fatalf("%d logical slots on the test server (%v): PostgreSQL would not restart at wal_level replica", others, err)
	}
	mustExec(t, e, "ALTER SYSTEM SET wal_level = replica")
	restored := false
	restore := func() {
		if !restored {
			restored = true
			e.DB.Exec(ctx, "ALTER SYSTEM RESET wal_level")
			svc(t, "pg-restart", "fast")
		}
	}
	t.Cleanup(restore)
	svc(t, "pg-restart", "fast")
	e.DB.Reset()
	r, out := e.runCheck(t, "")
	c := checkNamed(t, r, "wal_level")
	if c.Verdict != preflight.Fail || !strings.Contains(c.Value, "replica") ||
		!strings.Contains(c.Fix, "ALTER SYSTEM SET wal_level = logical") || !strings.Contains(c.Fix, "restart PostgreSQL") || r.ExitCode != checkreport.ExitBad {
		t.Errorf("wal_level replica: %+v, exit %d\n%s", c, r.ExitCode, out)
	}
	restore()
	e.DB.Reset()
}

// A healthy start and a clean stop log no warning, and durations carry
// their unit.
func TestHealthyStartNoWarning(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	e := newEnv(t, "nowarn")
	r := e.startRelay()
	e.insertRow(t, "order", "o-1", "created", `{"n":1}`, `{}`)
	waitFor(t, 30*time.Second, "the event published", func() bool { return r.metric("outbox_relay_events_published_total") >= 1 })
	if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	log := r.log()
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
			t.Errorf("healthy run logged: %s", line)
		}
	}
	if !strings.Contains(log, `"keep":"168h0m0s"`) {
		t.Errorf("retention's keep is not a duration string:\n%s", testkit.Tail(log, 3000))
	}
}

// checksNamed returns every check of r named name (kafka.topic and
// kafka.route repeat, one line per topic or routing value).
func checksNamed(r preflight.Report, name string) []checkreport.Check {
	var out []checkreport.Check
	for _, c := range r.Checks {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// topicLine returns the kafka.topic line naming topic as missing, if any.
func topicLine(r preflight.Report, topic string) (checkreport.Check, bool) {
	for _, c := range checksNamed(r, "kafka.topic") {
		if strings.HasPrefix(c.Value, topic+" does not exist") {
			return c, true
		}
	}
	return checkreport.Check{}, false
}

// With kafka.auto_create_topics off, check reads the routing values of the
// rows in the outbox, renders their topics and fails naming each missing
// one with the rows' value and the fix; it creates no topic itself (the
// test broker auto-creates on metadata requests); once the topic exists it
// passes.
func TestCheckMissingTopics(t *testing.T) {
	t.Parallel() // own outbox and topics; no service fault, no shared proxy
	e := newEnv(t, "checktopics")
	present, missing, dlq := e.Prefix+".order", e.Prefix+".ordr", e.Prefix+".dlq"
	if err := testkit.CreateTopics(brokers, 1, nil, present, dlq); err != nil {
		t.Fatal(err)
	}
	e.insertRow(t, "order", "o-1", "created", `{"n":1}`, `{}`)
	e.insertRow(t, "order", "o-2", "created", `{"n":2}`, `{}`)
	e.insertRow(t, "ordr", "o-3", "created", `{"n":3}`, `{}`)
	e.insertRow(t, "ordr", "o-4", "paid", `{"n":4}`, `{}`)
	args := []string{"--kafka-auto-create-topics=false", "--dlq-topic", dlq}

	r, out := e.runCheck(t, "", args...)
	c, ok := topicLine(r, missing)
	if !ok || c.Verdict != preflight.Fail || r.ExitCode != checkreport.ExitBad {
		t.Fatalf("missing %s: line %+v (found %v), exit %d\n%s", missing, c, ok, r.ExitCode, out)
	}
	for _, w := range []string{`aggregate_type "ordr"`, "2 rows", e.Table, "kafka.auto_create_topics is false"} {
		if !strings.Contains(c.Value, w) {
			t.Errorf("kafka.topic value lacks %q: %s", w, c.Value)
		}
	}
	for _, w := range []string{"--create --topic " + missing, "kafka.auto_create_topics: true", "fix the rows' aggregate_type"} {
		if !strings.Contains(c.Fix, w) {
			t.Errorf("kafka.topic fix lacks %q: %s", w, c.Fix)
		}
	}
	if lines := checksNamed(r, "kafka.topic"); len(lines) != 1 {
		t.Errorf("want one kafka.topic line (%s), got %+v", missing, lines)
	}
	noFailures(t, r, "kafka.topic")
	if tps, err := testkit.Topics(brokers, missing); err != nil || len(tps) != 0 {
		t.Fatalf("topics %v (%v): check created %s", tps, err, missing)
	}

	// The text report names it on one line, the fix on the next.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, text, err := testkit.Run(ctx, os.Environ(), relayBin, append(append([]string{"check"}, e.flags()...), args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("check, exit %d:\n%s", code, text)
	if code != checkreport.ExitBad || !strings.Contains(text, "FAIL  "+missing+" does not exist") ||
		!strings.Contains(text, "-> create topic "+missing+" (kafka-topics.sh") {
		t.Errorf("text report: exit %d\n%s", code, text)
	}

	// Once the topic exists, it passes.
	if err := testkit.CreateTopics(brokers, 1, nil, missing); err != nil {
		t.Fatal(err)
	}
	r, out = e.runCheck(t, "", args...)
	noFailures(t, r)
	if lines := checksNamed(r, "kafka.topic"); len(lines) != 0 || (r.ExitCode != checkreport.ExitOK && r.ExitCode != checkreport.ExitWarn) {
		t.Errorf("after creating %s: kafka.topic %+v, exit %d\n%s", missing, lines, r.ExitCode, out)
	}
	if c := checkNamed(t, r, "kafka.topics"); !strings.Contains(c.Value, "every topic exists") || !strings.Contains(c.Value, "2 routing values (aggregate_type) in 4 rows") {
		t.Errorf("kafka.topics: %+v", c)
	}
}

// A mapped table: check reads the mapped routing columns (quoted), renders
// {event_type} too, names each missing topic by the mapped columns' values
// and reports a value that can never be a topic name.
func TestCheckMissingTopicsMapped(t *testing.T) {
	t.Parallel()
	e := newMappedEnv(t, "checkmapped", `CREATE TABLE {schema}."Events" (
		id bigserial PRIMARY KEY, tenant text NOT NULL, "Stream" text, kind text NOT NULL, body jsonb NOT NULL)`,
		func(e *env) []string {
			return append(e.baseArgs(), "--table", e.Schema+".Events", "--topic-template", e.Prefix+".{aggregate_type}.{event_type}",
				"--columns-key", "tenant", "--columns-payload", "body", "--columns-route-by", "Stream", "--columns-type", "kind",
				"--columns-headers", "none", "--dlq-topic", e.Prefix+".dlq", "--kafka-auto-create-topics=false")
		})
	if err := testkit.CreateTopics(brokers, 1, nil, e.Prefix+".order.Created", e.Prefix+".dlq"); err != nil {
		t.Fatal(err)
	}
	for _, row := range [][2]string{{"order", "Created"}, {"ordr", "Created"}, {"bad topic", "Created"}} {
		mustExec(t, e, `INSERT INTO `+e.Schema+`."Events" (tenant, "Stream", kind, body) VALUES ('t1', $1, $2, '{}')`, row[0], row[1])
	}
	r, out := e.runCheck(t, "")
	missing := e.Prefix + ".ordr.Created"
	c, ok := topicLine(r, missing)
	if !ok || c.Verdict != preflight.Fail || !strings.Contains(c.Value, `Stream "ordr", kind "Created"`) ||
		!strings.Contains(c.Fix, "fix the rows' Stream or kind") || r.ExitCode != checkreport.ExitBad {
		t.Errorf("missing %s: %+v (found %v), exit %d\n%s", missing, c, ok, r.ExitCode, out)
	}
	bad := checksNamed(r, "kafka.route")
	if len(bad) != 1 || bad[0].Verdict != preflight.Warn || !strings.Contains(bad[0].Value, `Stream "bad topic"`) ||
		!strings.Contains(bad[0].Value, "invalid_topic") {
		t.Errorf("kafka.route: %+v\n%s", bad, out)
	}
	noFailures(t, r, "kafka.topic")
}
