package replication

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/fault"
)

// pgoutput's messages option exists from PostgreSQL 14 and works with
// proto_version 1; an older server must start without it.
func TestPluginArgs(t *testing.T) {
	pub := `publication_names '"outbox_pub"'`
	tests := []struct {
		version  string // server_version as the server reports it
		messages bool
		want     []string
	}{
		{"15.18 (Debian 15.18-0+deb12u1)", true, []string{"proto_version '1'", pub, "messages 'true'"}},
		{"14.0", true, []string{"proto_version '1'", pub, "messages 'true'"}},
		{"17beta1", true, []string{"proto_version '1'", pub, "messages 'true'"}},
		{"13.12", true, []string{"proto_version '1'", pub}},
		{"9.6.24", true, []string{"proto_version '1'", pub}},
		{"", true, []string{"proto_version '1'", pub}}, // unknown: the safe choice
		{"15.4", false, []string{"proto_version '1'", pub}},
	}
	for _, tt := range tests {
		got, _, _, _ := pluginArgs("outbox_pub", tt.version, tt.messages, StreamingOff)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("pluginArgs(%q, %v) = %q, want %q", tt.version, tt.messages, got, tt.want)
		}
	}
}

// Streaming (protocol 2) is asked for on PostgreSQL 14+ unless off; "on"
// refuses an older server with the key named.
func TestPluginArgsStreaming(t *testing.T) {
	pub := `publication_names '"outbox_pub"'`
	tests := []struct {
		version, streaming string
		want               []string
		streamed           bool
		err                string
	}{
		{"15.18 (Debian 15.18-0+deb12u1)", StreamingAuto, []string{"proto_version '2'", pub, "streaming 'on'", "messages 'true'"}, true, ""},
		{"18.1", StreamingOn, []string{"proto_version '2'", pub, "streaming 'on'", "messages 'true'"}, true, ""},
		{"14.19", StreamingOff, []string{"proto_version '1'", pub, "messages 'true'"}, false, ""},
		{"13.12", StreamingAuto, []string{"proto_version '1'", pub}, false, ""},
		{"13.12", StreamingOn, nil, false, "postgres.streaming is on, but PostgreSQL \"13.12\" cannot stream"},
		{"", StreamingOn, nil, false, "set postgres.streaming to auto or off"},
	}
	for _, tt := range tests {
		got, _, streamed, err := pluginArgs("outbox_pub", tt.version, true, tt.streaming)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s %s: err %v, want %q", tt.version, tt.streaming, err, tt.err)
			}
			continue
		}
		if err != nil || streamed != tt.streamed || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s %s: %q streamed=%v err=%v, want %q streamed=%v", tt.version, tt.streaming, got, streamed, err, tt.want, tt.streamed)
		}
	}
}

func TestHeartbeatConfigValidate(t *testing.T) {
	tests := []struct {
		interval time.Duration
		ok       bool
	}{
		{0, true}, {time.Second, true}, {100 * time.Millisecond, true}, {time.Minute, true},
		{-time.Second, false}, {99 * time.Millisecond, false}, {time.Minute + 1, false},
	}
	for _, tt := range tests {
		err := HeartbeatConfig{Interval: tt.interval}.Validate("heartbeat.")
		if (err == nil) != tt.ok {
			t.Errorf("interval %s: err = %v, want ok %v", tt.interval, err, tt.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "heartbeat.interval: ") {
			t.Errorf("interval %s: %q does not name heartbeat.interval", tt.interval, err)
		}
	}
	if d := DefaultHeartbeatConfig().Interval; d != time.Second {
		t.Errorf("default heartbeat.interval = %s, want 1s", d)
	}
}

func TestHeartbeatPrefix(t *testing.T) {
	if got := HeartbeatPrefix("outbox_relay"); got != "outbox-relay/outbox_relay" {
		t.Errorf("HeartbeatPrefix = %q", got)
	}
}

// A refused heartbeat names the grant that fixes it.
func TestHeartbeatErrorHint(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{&pgconn.PgError{Code: "42501", Message: "permission denied for function pg_logical_emit_message"},
			"GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO"},
		{&pgconn.PgError{Code: "25006", Message: "cannot execute pg_logical_emit_message() during recovery"}, "primary"},
		{errors.New("connection reset"), ""},
	}
	for _, tt := range tests {
		hint := heartbeatHint(tt.err)
		if tt.want == "" && hint != "" || !strings.Contains(hint, tt.want) {
			t.Errorf("heartbeatHint(%v) = %q, want it to contain %q", tt.err, hint, tt.want)
		}
	}
}

// messages.prefix needs pgoutput's messages option: PostgreSQL 14 or later.
func TestCheckMessageEvents(t *testing.T) {
	tests := []struct {
		prefix, version string
		err             string
	}{
		{"orders", "14.0", ""},
		{"orders", "15.18 (Debian 15.18-0+deb12u1)", ""},
		{"orders", "18.1", ""},
		{"", "13.12", ""}, // off: any server
		{"orders", "13.12", `messages.prefix is set, but PostgreSQL "13.12" cannot stream logical decoding messages (pgoutput's messages option needs PostgreSQL 14 or later)`},
		{"orders", "9.6.24", "upgrade PostgreSQL, or unset messages.prefix"},
		{"orders", "", "needs PostgreSQL 14 or later"},
	}
	for _, tt := range tests {
		err := checkMessageEvents(tt.prefix, tt.version)
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("(%q, %q): %v", tt.prefix, tt.version, err)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("(%q, %q): %v, want %q", tt.prefix, tt.version, err, tt.err)
		case err != nil && fault.KindOf(err) != fault.Fatal:
			t.Errorf("(%q, %q): %v is not fatal", tt.prefix, tt.version, err)
		}
	}
}
