//go:build e2e

package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// newEnvPub is newEnv with the publication named pub(suffix), where suffix
// makes the name unique on the shared server (publications are per
// database, not per schema).
func newEnvPub(t *testing.T, name string, pub func(suffix string) string) *env {
	t.Helper()
	e := newEnv(t, name, func(o *testkit.Outbox) { o.Pub = pub(o.Slot[len("e2e_"+name+"_"):]) })
	o, ctx := e.Outbox, context.Background()
	var n int
	if err := o.DB.QueryRow(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = $1", o.Pub).Scan(&n); err != nil || n != 1 {
		t.Fatalf("migrate did not create publication %q (count %d, %v)", o.Pub, n, err)
	}
	return e
}

// Item 3 of issue 10: a publication name the config accepts works end to
// end. migrate creates it quoted, so START_REPLICATION must name it quoted
// too: publication_names 'OutboxPub' unquoted makes the server look up
// outboxpub (on PostgreSQL 15 the stream fails for ever; on 18 every change
// is filtered while the slot advances).
func TestPublicationNamesAreQuotedEndToEnd(t *testing.T) {
	t.Parallel() // own outbox, relay and topics; no service fault, no shared proxy
	for _, tt := range []struct {
		name string
		pub  func(string) string
	}{
		{"upper", func(s string) string { return "OutboxPub_" + s }},
		{"hostile", func(s string) string { return `Out"box 'Pub, ` + s + ` $$` }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnvPub(t, "pub"+tt.name, tt.pub)
			r := e.startRelay()
			w := e.newWriter(10)
			if err := w.run(context.Background(), 300, 10, 20, 0, ""); err != nil {
				t.Fatal(err)
			}
			ws := w.written()
			rs := consume(t, e.topics(), len(ws), 60*time.Second, 2*time.Second)
			requireClean(t, check(t, ws, rs, e.partitions(t)), false)
			if err := e.WaitConfirmed(context.Background(), w.LastLSN(), 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if code := r.stop(syscall.SIGTERM, 30*time.Second); code != 0 {
				t.Fatalf("SIGTERM exit code %d, want 0", code)
			}
		})
	}
}
