package pgsetup

import "testing"

func TestCreatePublicationSQLQuotesTheName(t *testing.T) {
	for pub, want := range map[string]string{
		"outbox_pub": `CREATE PUBLICATION "outbox_pub" FOR TABLE "public"."outbox" WITH (publish = 'insert')`,
		"OutboxPub":  `CREATE PUBLICATION "OutboxPub" FOR TABLE "public"."outbox" WITH (publish = 'insert')`,
		`Out"box 'P`: `CREATE PUBLICATION "Out""box 'P" FOR TABLE "public"."outbox" WITH (publish = 'insert')`,
	} {
		if got := CreatePublicationSQL(pub, "public.outbox"); got != want {
			t.Errorf("CreatePublicationSQL(%q) = %s, want %s", pub, got, want)
		}
	}
}

func TestPublishViaRootSQL(t *testing.T) {
	if got := PublishViaRootSQL("pub"); got != `ALTER PUBLICATION "pub" SET (publish = 'insert', publish_via_partition_root = true)` {
		t.Errorf("PublishViaRootSQL: %s", got)
	}
}
