package pgsetup

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
)

func TestFromItem(t *testing.T) {
	tbl := outboxschema.Table{Schema: "s", Name: "Out box"}
	if got := FromItem(tbl, false); got != `ONLY "s"."Out box"` {
		t.Errorf("plain: %s", got)
	}
	if got := FromItem(tbl, true); got != `"s"."Out box"` {
		t.Errorf("partitioned: %s", got)
	}
}

// The fix copies each descendant's own rows (ONLY: a grandchild's rows are
// not copied twice), detaches the direct children, in one transaction.
func TestInheritanceFix(t *testing.T) {
	root := outboxschema.Table{Schema: "public", Name: "outbox"}
	legacy := outboxschema.Table{Schema: "public", Name: "outbox_legacy"}
	old := outboxschema.Table{Schema: "arch", Name: "outbox_2019"}
	in := Inheritance{Table: root, Columns: []string{`"id"`, `"payload"`}, Override: true,
		Children: []Child{{Table: old, Parent: legacy}, {Table: legacy, Parent: root}}}
	if p := in.Problem(); !strings.Contains(p, "inheritance children (arch.outbox_2019, public.outbox_legacy)") || !strings.Contains(p, "never be published") {
		t.Errorf("problem: %s", p)
	}
	fix := in.Fix()
	for _, w := range []string{
		"BEGIN; ",
		`INSERT INTO "public"."outbox" ("id", "payload") OVERRIDING SYSTEM VALUE SELECT "id", "payload" FROM ONLY "arch"."outbox_2019"; `,
		`INSERT INTO "public"."outbox" ("id", "payload") OVERRIDING SYSTEM VALUE SELECT "id", "payload" FROM ONLY "public"."outbox_legacy"; `,
		`ALTER TABLE "public"."outbox_legacy" NO INHERIT "public"."outbox"; COMMIT;`,
	} {
		if !strings.Contains(fix, w) {
			t.Errorf("fix lacks %q:\n%s", w, fix)
		}
	}
	if strings.Contains(fix, `"arch"."outbox_2019" NO INHERIT`) {
		t.Errorf("a grandchild is detached from the outbox it does not inherit directly:\n%s", fix)
	}
	if (Inheritance{Table: root}).Problem() != "" || (Inheritance{Table: root}).Fix() != "" {
		t.Error("no child, yet a problem")
	}
}
