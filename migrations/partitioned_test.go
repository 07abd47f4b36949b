package migrations

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

func TestCreatePartitionedOutboxSQL(t *testing.T) {
	tbl := outboxschema.Table{Schema: "s", Name: "outbox"}
	if sql := CreatePartitionedOutboxSQL(tbl); !strings.Contains(sql, "PRIMARY KEY (id, created_at)") || !strings.Contains(sql, "PARTITION BY RANGE (created_at)") ||
		!strings.Contains(sql, `"s"."outbox_default" PARTITION OF "s"."outbox" DEFAULT`) {
		t.Errorf("CreatePartitionedOutboxSQL: %s", sql)
	}
}
