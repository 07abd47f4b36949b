package outboxschema_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outboxschema"
	"github.com/outbox-relay/outbox-relay/outboxschema/headernametest"
)

// verdict is CheckHeaderName's answer as a headernametest.Verdict.
func verdict(t *testing.T, name string, extra ...string) headernametest.Verdict {
	t.Helper()
	err := outboxschema.CheckHeaderName(name, extra...)
	if err == nil {
		return headernametest.OK
	}
	var he *outboxschema.HeaderNameError
	if !errors.As(err, &he) || he.Name != name {
		t.Fatalf("CheckHeaderName(%q) = %v (%T), want a *HeaderNameError naming it", name, err, err)
	}
	if (he.Reserved == "") == (he.Problem == "") {
		t.Fatalf("CheckHeaderName(%q): Reserved %q, Problem %q: want exactly one", name, he.Reserved, he.Problem)
	}
	if he.Reserved != "" {
		return headernametest.Reserved
	}
	return headernametest.Bad
}

func TestCheckHeaderName(t *testing.T) {
	t.Parallel()
	for _, c := range headernametest.Cases {
		if got := verdict(t, c.Name); got != c.Verdict {
			t.Errorf("CheckHeaderName(%q): %s, want %s", c.Name, got, c.Verdict)
		}
		// ReservedHeader is the reserved half of the rule.
		if outboxschema.ReservedHeader(c.Name) && c.Verdict == headernametest.OK {
			t.Errorf("ReservedHeader(%q) is true, but the rule publishes it", c.Name)
		}
		if c.Verdict == headernametest.Reserved && !outboxschema.ReservedHeader(c.Name) {
			t.Errorf("ReservedHeader(%q) is false, but the rule reserves it", c.Name)
		}
	}
	// The extra reserved names (compat: debezium's id) are compared the
	// same way.
	for name, want := range map[string]headernametest.Verdict{"id": headernametest.Reserved, "ID": headernametest.Reserved,
		"id ": headernametest.Bad, "ids": headernametest.OK} {
		if got := verdict(t, name, "id"); got != want {
			t.Errorf("CheckHeaderName(%q, \"id\"): %s, want %s", name, got, want)
		}
	}
}

// The error quotes the name so that what makes it bad is visible, says
// what is wrong, and stays short for a huge name.
func TestHeaderNameErrorText(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, want string }{
		{"", `header name "" is empty`},
		{"event_id ", `header name "event_id " ends with whitespace (U+0020)`},
		{"event_id\t", `header name "event_id\t" contains the control or invisible character U+0009`},
		{"event\u200bid", `header name "event\u200bid" contains the control or invisible character U+200B`},
		{"   ", `header name "   " is only whitespace`},
		{"\u3000x", `header name "\u3000x" starts with whitespace (U+3000)`},
		{"a\xffb", `header name "a\xffb" is not valid UTF-8`},
		{"pg_lſn", `header name "pg_lſn" is reserved: the relay sets event_id, event_type, aggregate_type, aggregate_id, pg_lsn, outbox_id, outbox_replayed_from, outbox_replay and every dlq.* header itself (names compared ignoring case)`},
	}
	for _, tt := range tests {
		if got := outboxschema.CheckHeaderName(tt.name).Error(); got != tt.want {
			t.Errorf("CheckHeaderName(%q):\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
	if got := outboxschema.CheckHeaderName("id", "id").Error(); !strings.Contains(got, "outbox_replay, id and every dlq.*") {
		t.Errorf("an extra reserved name is not listed: %s", got)
	}
	long := strings.Repeat("x", 5000) + " "
	if got := outboxschema.CheckHeaderName(long).Error(); len(got) > 200 || !strings.Contains(got, "(5001 bytes)") {
		t.Errorf("a long name's error is %d bytes: %.120s", len(got), got)
	}
}

// A good name costs no allocation: the decoder judges each distinct key
// once, but outbox.Write judges every key of every event.
func TestCheckHeaderNameDoesNotAllocate(t *testing.T) {
	for _, name := range []string{"tenant_id", "événement", "x-trace id"} {
		if n := testing.AllocsPerRun(100, func() { _ = outboxschema.CheckHeaderName(name, "id") }); n != 0 {
			t.Errorf("CheckHeaderName(%q) allocates %v times", name, n)
		}
	}
}
