package migrations

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

func TestCreatePartitionedOutboxSQL(t *testing.T) {
	tbl := outboxschema.Table{Schema: "s", Name: "outbox"}
	if sql := CreatePartitionedOutboxSQL(tbl); !strings.Contains(sql, "PRIMARY KEY (id, created_at)") || !strings.Contains(sql, "PARTITION BY RANGE (created_at)") ||
		!strings.Contains(sql, `"s"."outbox_default" PARTITION OF "s"."outbox" DEFAULT`) ||
		!strings.Contains(sql, "event_id       UUID        DEFAULT gen_random_uuid()") || !strings.Contains(sql, "dlq_replay_of  BIGINT") {
		t.Errorf("CreatePartitionedOutboxSQL: %s", sql)
	}
}
