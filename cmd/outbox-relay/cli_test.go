package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// Help and version go to stdout (a user pipes them to less or grep); every
// subcommand's -h lists --config and each flag with its default.
func TestHelpAndVersionOnStdout(t *testing.T) {
	env := func(string) string { return "" }
	tests := []struct {
		args []string
		want []string // in stdout
	}{
		{[]string{"version"}, []string{"outbox-relay "}},
		{[]string{"--version"}, []string{"outbox-relay "}},
		{[]string{"help"}, []string{"usage: outbox-relay", "check"}},
		{[]string{"--help"}, []string{"usage: outbox-relay", "check"}},
		{[]string{"-h"}, []string{"usage: outbox-relay"}},
		{[]string{"run", "-h"}, []string{"--config FILE", "--slot", "(default outbox_relay; env OUTBOX_RELAY_SLOT)", "--status-interval", "(default 1s;",
			"OUTBOX_RELAY_SLOT", "--postgres-url", `(default "";`, "--leader-election", "(default true;"}},
		{[]string{"migrate", "--help"}, []string{"--config FILE", "(default public.outbox;"}},
		{[]string{"status", "-h"}, []string{"usage: outbox-relay status", "--config FILE", "--json", "(default false)", "--id", "(default 0)"}},
		{[]string{"check", "-h"}, []string{"usage: outbox-relay check", "--config FILE", "--json", "--print-grants"}},
		{[]string{"cleanup", "-h"}, []string{"--config FILE", "--dry-run", "(default false)"}},
		{[]string{"replay", "-h"}, []string{"--config FILE", "--since", "--rate"}},
		{[]string{"dlq", "list", "-h"}, []string{"--config FILE", "--limit", "(default 100)"}},
		{[]string{"dlq", "replay", "-h"}, []string{"--config FILE", "--id"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := realMain(tt.args, env, &stdout, &stderr)
			if code != exitOK {
				t.Errorf("exit %d, want 0", code)
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr not empty:\n%s", stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
		})
	}
}

// Every configuration flag's help line says its default.
func TestRunHelpEveryFlagHasDefault(t *testing.T) {
	var stdout, stderr bytes.Buffer
	realMain([]string{"run", "-h"}, func(string) string { return "" }, &stdout, &stderr)
	for _, k := range keys {
		var line string
		for _, l := range strings.Split(stdout.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "--"+k.flag+" ") {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, "(default ") {
			t.Errorf("--%s: no help line with its default: %q", k.flag, line)
		}
	}
}

// kafka.retry_max's help says what happens after sarama's retries: the
// relay requeues and retries for ever, it does not stop.
func TestRetryMaxHelpTellsTheTruth(t *testing.T) {
	for _, k := range keys {
		if k.name == "kafka.retry_max" {
			if !strings.Contains(k.usage, "for ever") || strings.Contains(k.usage, "stops") {
				t.Errorf("kafka.retry_max usage %q: must say the relay retries for ever", k.usage)
			}
			return
		}
	}
	t.Fatal("no kafka.retry_max key")
}

// An unknown command is a usage error: usage on stderr, exit 2.
func TestUnknownCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := realMain([]string{"frobnicate"}, func(string) string { return "" }, &stdout, &stderr); code != exitConfig {
		t.Errorf("exit %d, want %d", code, exitConfig)
	}
	if !strings.Contains(stderr.String(), "unknown command") || stdout.Len() != 0 {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

// Durations in logs carry their unit ("retry_in":"1.5s", not 1500).
func TestLogDurationsHaveUnits(t *testing.T) {
	for _, format := range []string{"json", "console"} {
		var buf bytes.Buffer
		log := newLogger(LogConfig{Level: "info", Format: format}, &buf)
		log.Info().Dur("retry_in", 1500*time.Millisecond).Dur("keep", 168*time.Hour).Msg("x")
		for _, want := range []string{"1.5s", "168h0m0s"} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("%s log lacks %q: %s", format, want, buf.String())
			}
		}
	}
}
