package main

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/report"
	"github.com/outbox-relay/outbox-relay/status"
)

// closedURL is a PostgreSQL URL with a password on a port nothing listens on.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "postgres://relay:pw-never-shown-42@" + addr + "/outbox?connect_timeout=2"
}

func TestStatusCommand(t *testing.T) {
	url := closedURL(t)
	env := func(string) string { return "" }
	tests := []struct {
		name string
		args []string
		exit int
		out  string // substring of stdout
		err  string // substring of stderr
	}{
		{"unreachable, text", []string{"status", "--postgres-url", url, "--kafka-brokers", "k:9092"}, report.ExitBad, "postgres  BAD  cannot read PostgreSQL", ""},
		{"unreachable, json", []string{"status", "--json", "--postgres-url", url, "--kafka-brokers", "k:9092"}, report.ExitBad, `"verdict": "bad"`, ""},
		{"unreachable, --id", []string{"status", "--id", "7", "--postgres-url", url, "--kafka-brokers", "k:9092"}, report.ExitBad, "postgres", ""},
		{"negative id", []string{"status", "--id", "-1", "--postgres-url", url, "--kafka-brokers", "k:9092"}, exitConfig, "", "--id must be"},
		{"unknown flag", []string{"status", "--bogus"}, exitConfig, "", "flag provided but not defined"},
		{"help", []string{"status", "-h"}, exitOK, "usage: outbox-relay status", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := realMain(tt.args, env, &stdout, &stderr)
			if code != tt.exit || !strings.Contains(stdout.String(), tt.out) || !strings.Contains(stderr.String(), tt.err) {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.exit, stdout.String(), stderr.String())
			}
			if strings.Contains(stdout.String()+stderr.String(), "pw-never-shown-42") {
				t.Errorf("the password was printed:\n%s%s", stdout.String(), stderr.String())
			}
			if strings.Contains(strings.Join(tt.args, " "), "--json") {
				var r status.Report
				if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || r.ExitCode != code || r.Facts.ConnectError == "" {
					t.Errorf("json %+v, %v", r, err)
				}
			}
		})
	}
}

func TestNoSecret(t *testing.T) {
	for _, tt := range []struct{ url, msg, want string }{
		{"postgres://u:hunter2@h/db", "auth failed for hunter2", "auth failed for xxxxx"},
		{"host=h user=u password=hunter2", "x hunter2 y", "x xxxxx y"},
		{"postgres://u@h/db", "no password here", "no password here"},
		{"::not a url::", "kept", "kept"},
	} {
		if got := noSecret(tt.msg, tt.url); got != tt.want {
			t.Errorf("noSecret(%q, %q) = %q, want %q", tt.msg, tt.url, got, tt.want)
		}
	}
}
