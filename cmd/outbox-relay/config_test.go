package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/sink"

	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/replication"
)

const (
	testURL     = "postgres://relay:s3cret@db:5432/app"
	testBrokers = "k1:9092,k2:9092"
)

// envOf returns a getenv over m; every other name is unset.
func envOf(m map[string]string) func(string) string {
	return func(name string) string { return m[name] }
}

// requiredEnv is the smallest environment that loads: the two required keys
// plus extra.
func requiredEnv(extra map[string]string) func(string) string {
	m := map[string]string{
		"OUTBOX_RELAY_POSTGRES_URL":  testURL,
		"OUTBOX_RELAY_KAFKA_BROKERS": testBrokers,
	}
	for k, v := range extra {
		m[k] = v
	}
	return envOf(m)
}

// writeTestFile writes content to a fresh file under t.TempDir.
func writeTestFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "outbox-relay.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// yamlConfig renders a config file holding the two required keys and then
// every dotted key of set (values keep their YAML type: "5s" is a string,
// 5 an int, []string a sequence).
func yamlConfig(t *testing.T, set map[string]any) string {
	t.Helper()
	doc := map[string]any{
		"postgres": map[string]any{"url": testURL},
		"kafka":    map[string]any{"brokers": []string{"k1:9092", "k2:9092"}},
	}
	for k, v := range set {
		parent, leaf, nested := strings.Cut(k, ".")
		if !nested {
			doc[k] = v
			continue
		}
		sub, ok := doc[parent].(map[string]any)
		if !ok {
			sub = map[string]any{}
			doc[parent] = sub
		}
		sub[leaf] = v
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return writeTestFile(t, string(b))
}

func TestLoadConfigDefaults(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		getenv func(string) string
	}{
		{"env", nil, requiredEnv(nil)},
		{"flags", []string{"--postgres-url", testURL, "--kafka-brokers=" + testBrokers}, envOf(nil)},
		{"file", []string{"--config", "FILE"}, envOf(nil)},
		{"empty env values are unset", nil, requiredEnv(map[string]string{
			"OUTBOX_RELAY_SLOT": "", "OUTBOX_RELAY_TABLE": "", "OUTBOX_RELAY_STATUS_INTERVAL": "",
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := slices.Clone(tt.args)
			if i := slices.Index(args, "FILE"); i >= 0 {
				args[i] = yamlConfig(t, nil)
			}
			c, err := loadConfig("run", args, tt.getenv)
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			// The documented values, spelled out (not read back from DefaultConfig).
			checks := []struct {
				key       string
				got, want any
			}{
				{"postgres.url", c.Postgres.URL, testURL},
				{"kafka.brokers", c.Kafka.Brokers, []string{"k1:9092", "k2:9092"}},
				{"postgres.slot", c.Postgres.Slot, "outbox_relay"},
				{"postgres.publication", c.Postgres.Publication, "outbox_pub"},
				{"postgres.table", c.Postgres.Table, "public.outbox"},
				{"kafka.topic_template", c.Kafka.TopicTemplate, "outbox.event.{aggregate_type}"},
				{"postgres.status_interval", c.Postgres.StatusInterval, time.Second},
				{"postgres.partition", c.Postgres.Partition, "none"},
				{"retention.keep", c.Retention.Keep, 168 * time.Hour},
				{"retention.interval", c.Retention.Interval, time.Minute},
				{"retention.batch_size", c.Retention.BatchSize, 1000},
				{"retention.archive", c.Retention.Archive, false},
			}
			for _, ch := range checks {
				if !reflect.DeepEqual(ch.got, ch.want) {
					t.Errorf("%s = %#v, want %#v", ch.key, ch.got, ch.want)
				}
			}
			want := DefaultConfig()
			want.Postgres.URL = testURL
			want.Kafka.Brokers = []string{"k1:9092", "k2:9092"}
			if !reflect.DeepEqual(c, want) {
				t.Errorf("config is not DefaultConfig plus the required keys:\n got %+v\nwant %+v", c, want)
			}
		})
	}
}

// TestLoadConfigPrecedence checks file < env < flags, one key at a time.
func TestLoadConfigPrecedence(t *testing.T) {
	tests := []struct {
		key               string
		file              any // YAML value
		env, flag         string
		wantFile, wantEnv any
		wantFlag          any
		get               func(Config) any
		envName, flagName string
	}{
		{key: "postgres.slot", file: "from_file", env: "from_env", flag: "from_flag",
			wantFile: "from_file", wantEnv: "from_env", wantFlag: "from_flag",
			get: func(c Config) any { return c.Postgres.Slot }, envName: "OUTBOX_RELAY_SLOT", flagName: "slot"},
		{key: "kafka.brokers", file: []string{"f1:9092", "f2:9092"}, env: " e1:9092 , e2:9092,,e3:9092 ", flag: "x1:9092",
			wantFile: []string{"f1:9092", "f2:9092"}, wantEnv: []string{"e1:9092", "e2:9092", "e3:9092"}, wantFlag: []string{"x1:9092"},
			get: func(c Config) any { return c.Kafka.Brokers }, envName: "OUTBOX_RELAY_KAFKA_BROKERS", flagName: "kafka-brokers"},
		{key: "postgres.status_interval", file: "2s", env: "3s", flag: "250ms",
			wantFile: 2 * time.Second, wantEnv: 3 * time.Second, wantFlag: 250 * time.Millisecond,
			get: func(c Config) any { return c.Postgres.StatusInterval }, envName: "OUTBOX_RELAY_STATUS_INTERVAL", flagName: "status-interval"},
		{key: "shutdown_timeout", file: "1m", env: "45s", flag: "2s",
			wantFile: time.Minute, wantEnv: 45 * time.Second, wantFlag: 2 * time.Second,
			get: func(c Config) any { return c.ShutdownTimeout }, envName: "OUTBOX_RELAY_SHUTDOWN_TIMEOUT", flagName: "shutdown-timeout"},
		{key: "kafka.retry_max", file: 10, env: "20", flag: "30",
			wantFile: 10, wantEnv: 20, wantFlag: 30,
			get: func(c Config) any { return c.Kafka.RetryMax }, envName: "OUTBOX_RELAY_KAFKA_RETRY_MAX", flagName: "kafka-retry-max"},
		{key: "inflight.max_events", file: 100, env: "200", flag: "300",
			wantFile: 100, wantEnv: 200, wantFlag: 300,
			get: func(c Config) any { return c.InFlight.MaxEvents }, envName: "OUTBOX_RELAY_MAX_INFLIGHT_EVENTS", flagName: "max-inflight-events"},
		{key: "inflight.max_bytes", file: 1 << 20, env: "8589934592", flag: "4096",
			wantFile: int64(1 << 20), wantEnv: int64(8 << 30), wantFlag: int64(4096),
			get: func(c Config) any { return c.InFlight.MaxBytes }, envName: "OUTBOX_RELAY_MAX_INFLIGHT_BYTES", flagName: "max-inflight-bytes"},
		{key: "postgres.create_publication", file: false, env: "true", flag: "false",
			wantFile: false, wantEnv: true, wantFlag: false,
			get: func(c Config) any { return c.Postgres.CreatePublication }, envName: "OUTBOX_RELAY_CREATE_PUBLICATION", flagName: "create-publication"},
		{key: "postgres.slot_failover", file: true, env: "false", flag: "true",
			wantFile: true, wantEnv: false, wantFlag: true,
			get: func(c Config) any { return c.Postgres.SlotFailover }, envName: "OUTBOX_RELAY_SLOT_FAILOVER", flagName: "slot-failover"},
		{key: "postgres.standby_slots", file: []string{"f_1", "f_2"}, env: " e_1 ,, e_2 ", flag: "x_1",
			wantFile: []string{"f_1", "f_2"}, wantEnv: []string{"e_1", "e_2"}, wantFlag: []string{"x_1"},
			get: func(c Config) any { return c.Postgres.StandbySlots }, envName: "OUTBOX_RELAY_STANDBY_SLOTS", flagName: "standby-slots"},
		{key: "metrics_addr", file: "127.0.0.1:1", env: ":2", flag: "",
			wantFile: "127.0.0.1:1", wantEnv: ":2", wantFlag: "",
			get: func(c Config) any { return c.MetricsAddr }, envName: "OUTBOX_RELAY_METRICS_ADDR", flagName: "metrics-addr"},
		{key: "log.level", file: "debug", env: "warn", flag: "trace",
			wantFile: "debug", wantEnv: "warn", wantFlag: "trace",
			get: func(c Config) any { return c.Log.Level }, envName: "OUTBOX_RELAY_LOG_LEVEL", flagName: "log-level"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			path := yamlConfig(t, map[string]any{tt.key: tt.file})
			fileArgs := []string{"--config", path}
			flagArgs := append(slices.Clone(fileArgs), "--"+tt.flagName+"="+tt.flag)
			withEnv := envOf(map[string]string{tt.envName: tt.env})
			steps := []struct {
				name   string
				args   []string
				getenv func(string) string
				want   any
			}{
				{"file", fileArgs, envOf(nil), tt.wantFile},
				{"file+env", fileArgs, withEnv, tt.wantEnv},
				{"file+env+flag", flagArgs, withEnv, tt.wantFlag},
				{"file+flag", flagArgs, envOf(nil), tt.wantFlag},
			}
			for _, s := range steps {
				c, err := loadConfig("run", s.args, s.getenv)
				if err != nil {
					t.Fatalf("%s: loadConfig: %v", s.name, err)
				}
				if got := tt.get(c); !reflect.DeepEqual(got, s.want) {
					t.Errorf("%s: %s = %#v, want %#v", s.name, tt.key, got, s.want)
				}
			}
		})
	}
}

func TestLoadConfigEnvNames(t *testing.T) {
	tests := []struct {
		env   string
		value string
		get   func(Config) any
		want  any
	}{
		{"OUTBOX_RELAY_POSTGRES_URL", "postgres://other@pg:5433/outbox", func(c Config) any { return c.Postgres.URL }, "postgres://other@pg:5433/outbox"},
		{"OUTBOX_RELAY_KAFKA_BROKERS", "a:1,b:2,c:3", func(c Config) any { return c.Kafka.Brokers }, []string{"a:1", "b:2", "c:3"}},
		{"OUTBOX_RELAY_SLOT", "my_slot", func(c Config) any { return c.Postgres.Slot }, "my_slot"},
		{"OUTBOX_RELAY_PUBLICATION", "my_pub", func(c Config) any { return c.Postgres.Publication }, "my_pub"},
		{"OUTBOX_RELAY_TABLE", "events.outbox_v2", func(c Config) any { return c.Postgres.Table }, "events.outbox_v2"},
		{"OUTBOX_RELAY_TOPIC_TEMPLATE", "{aggregate_type}.{event_type}", func(c Config) any { return c.Kafka.TopicTemplate }, "{aggregate_type}.{event_type}"},
		{"OUTBOX_RELAY_KAFKA_AUTO_CREATE_TOPICS", "true", func(c Config) any { return c.Kafka.AutoCreateTopics }, true},
		{"OUTBOX_RELAY_KAFKA_MISSING_TOPIC_TIMEOUT", "15s", func(c Config) any { return c.Kafka.MissingTopicTimeout }, 15 * time.Second},
		{"OUTBOX_RELAY_KAFKA_TOPIC_REFRESH", "30s", func(c Config) any { return c.Kafka.TopicRefresh }, 30 * time.Second},
		{"OUTBOX_RELAY_KAFKA_MAX_TOPICS", "20", func(c Config) any { return c.Kafka.MaxTopics }, 20},
		{"OUTBOX_RELAY_KAFKA_TOPIC_ALLOWLIST", "orders, pay.*,legacy", func(c Config) any { return c.Kafka.TopicAllowlist }, []string{"orders", "pay.*", "legacy"}},
		{"OUTBOX_RELAY_METRICS_ADDR", "127.0.0.1:9999", func(c Config) any { return c.MetricsAddr }, "127.0.0.1:9999"},
		{"OUTBOX_RELAY_STANDBY_SLOTS", "standby_a,standby_b", func(c Config) any { return c.Postgres.StandbySlots }, []string{"standby_a", "standby_b"}},
		{"OUTBOX_RELAY_PARTITION", "daily", func(c Config) any { return c.Postgres.Partition }, "daily"},
		{"OUTBOX_RELAY_RETENTION_KEEP", "0", func(c Config) any { return c.Retention.Keep }, time.Duration(0)},
		{"OUTBOX_RELAY_RETENTION_KEEP", "720h", func(c Config) any { return c.Retention.Keep }, 720 * time.Hour},
		{"OUTBOX_RELAY_RETENTION_INTERVAL", "30s", func(c Config) any { return c.Retention.Interval }, 30 * time.Second},
		{"OUTBOX_RELAY_RETENTION_BATCH_SIZE", "5000", func(c Config) any { return c.Retention.BatchSize }, 5000},
		{"OUTBOX_RELAY_RETENTION_ARCHIVE", "true", func(c Config) any { return c.Retention.Archive }, true},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			c, err := loadConfig("run", nil, requiredEnv(map[string]string{tt.env: tt.value}))
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			if got := tt.get(c); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s=%q: got %#v, want %#v", tt.env, tt.value, got, tt.want)
			}
		})
	}
	// The config file path has an env twin too.
	t.Run("OUTBOX_RELAY_CONFIG", func(t *testing.T) {
		p := yamlConfig(t, map[string]any{"postgres.slot": "file_slot"})
		c, err := loadConfig("run", nil, envOf(map[string]string{"OUTBOX_RELAY_CONFIG": p}))
		if err != nil {
			t.Fatalf("loadConfig: %v", err)
		}
		if c.Postgres.Slot != "file_slot" {
			t.Errorf("slot = %q, want file_slot", c.Postgres.Slot)
		}
	})
}

// invalidCases has, for every key of the keys table, bad values from each
// source. An empty env value is "unset", so some keys have no bad env value.
var invalidCases = []struct {
	key   string
	env   []string
	flag  []string
	file  []any
	never string // must not appear in the error (a secret)
}{
	{key: "postgres.url", env: []string{"postgres://u:s3cret@db:notaport/app"}, flag: []string{"", "host=db port=nope password=s3cret"},
		file: []any{"postgres://u:s3cret@db:notaport/app", ""}, never: "s3cret"},
	{key: "postgres.slot", env: []string{"Bad-Slot", "OutboxRelay", "outbox-relay"}, flag: []string{"", strings.Repeat("s", 64), "Outbox"},
		file: []any{"has space", "outbox-relay"}},
	{key: "postgres.publication", env: []string{strings.Repeat("p", 64)}, flag: []string{"", "pub\xff"}, file: []any{strings.Repeat("é", 32)}},
	{key: "postgres.table", env: []string{"a.b.c"}, flag: []string{"", "public."}, file: []any{"public.out box"}},
	{key: "postgres.partition", env: []string{"weekly", "Daily"}, flag: []string{""}, file: []any{"yearly"}},
	{key: "retention.keep", env: []string{"-1h", "7d"}, flag: []string{"", "-1s"}, file: []any{"-5m", "a week"}},
	{key: "retention.interval", env: []string{"0", "500ms"}, flag: []string{"25h"}, file: []any{"0s", "x"}},
	{key: "retention.batch_size", env: []string{"0", "100001"}, flag: []string{"-1", "many"}, file: []any{0}},
	{key: "retention.archive", env: []string{"maybe"}, flag: []string{"2"}, file: []any{"yes please"}},
	{key: "postgres.create_publication", env: []string{"maybe"}, flag: []string{"2"}, file: []any{"maybe", []string{"x"}}},
	{key: "postgres.slot_failover", env: []string{"maybe"}, flag: []string{"2"}, file: []any{"yes please", []string{"x"}}},
	{key: "postgres.standby_slots", env: []string{"Standby", "a,a", "outbox_relay"}, flag: []string{"standby-1", strings.Repeat("s", 64)},
		file: []any{[]string{"has space"}, []string{"x", "x"}, "outbox_relay"}},
	{key: "postgres.status_interval", env: []string{"abc", "5ms"}, flag: []string{"2m", "1"}, file: []any{"0s", 5, "soon"}},
	{key: "postgres.receive_timeout", env: []string{"500ms", "x"}, flag: []string{"0s"}, file: []any{"10ms"}},
	{key: "postgres.reconnect_min", env: []string{"0s", "-1s"}, flag: []string{"x"}, file: []any{"0s"}},
	{key: "postgres.reconnect_max", env: []string{"1ms"}, flag: []string{"100ms", "y"}, file: []any{"1ns"}},
	{key: "postgres.lag_poll_interval", env: []string{"10ms", "soon"}, flag: []string{"0s"}, file: []any{"99ms", 5}},
	{key: "postgres.streaming", env: []string{"yes", "ON"}, flag: []string{"", "parallel"}, file: []any{"true", 1}},
	{key: "kafka.brokers", env: []string{",", "nohostport", "k1:9092,:9092", "k1:"}, flag: []string{"", "k1:9092,host"},
		file: []any{[]string{}, []string{"nohostport"}, "k1:9092"}},
	{key: "kafka.client_id", flag: []string{""}, file: []any{"", []string{"a"}}},
	{key: "kafka.topic_template", env: []string{"orders.{nope}", "orders.{aggregate_type"}, flag: []string{"", "bad topic"},
		file: []any{"{}", ".."}},
	{key: "kafka.auto_create_topics", env: []string{"maybe", "yes"}, flag: []string{"2"}, file: []any{"on please", []string{"x"}}},
	{key: "kafka.missing_topic_timeout", env: []string{"0s", "soon"}, flag: []string{"25h"}, file: []any{"500ms", 60}},
	{key: "kafka.topic_refresh", env: []string{"0s", "often"}, flag: []string{"25h", "999ms"}, file: []any{"-5m", 300}},
	{key: "kafka.max_topics", env: []string{"0", "-1", "many"}, flag: []string{"100001", "1.5", ""}, file: []any{0, 100001, "unlimited"}},
	{key: "kafka.topic_allowlist", env: []string{"orders,,pay.*", "*", "bad topic"}, flag: []string{"", "a*b", "x/*"},
		file: []any{[]string{""}, []string{"*"}, "orders.*", []string{"a", "b c"}}},
	{key: "kafka.producer", env: []string{"franz"}, flag: []string{"SARAMA"}, file: []any{"fast", 1}},
	{key: "kafka.compression", env: []string{"brotli"}, flag: []string{"", "GZIP"}, file: []any{"lz5"}},
	{key: "kafka.flush_frequency", env: []string{"-1s", "often"}, flag: []string{"-1ns"}, file: []any{"-5ms", 5}},
	{key: "kafka.flush_messages", env: []string{"-1", "x"}, flag: []string{"1.5"}, file: []any{-1, "many"}},
	{key: "kafka.flush_bytes", env: []string{"-1", "1KB"}, flag: []string{"-10"}, file: []any{-1, "lots"}},
	{key: "kafka.max_message_bytes", env: []string{"100", "1MB"}, flag: []string{"0", "-1"}, file: []any{1023, "big"}},
	{key: "kafka.version", env: []string{"banana", "0.10.2.0"}, flag: []string{""}, file: []any{"0.8.2.0", "3.x"}},
	{key: "kafka.retry_backoff_max", env: []string{"1ms", "long"}, flag: []string{"0s"}, file: []any{"9ms", 5}},
	{key: "kafka.retry_max", env: []string{"0", "many"}, flag: []string{"100001", "-1"}, file: []any{0, "lots"}},
	{key: "kafka.sasl.mechanism", env: []string{"GSSAPI"}, flag: []string{"scram"}, file: []any{"oauthbearer"}},
	{key: "kafka.sasl.username", env: []string{"bob"}, flag: []string{"bob"}, file: []any{"bob"}},
	{key: "kafka.sasl.password", env: []string{"s3cret"}, flag: []string{"s3cret"}, file: []any{"s3cret"}, never: "s3cret"},
	{key: "kafka.sasl.oauth.token_source", env: []string{"jwt", "static"}, flag: []string{"file"}, file: []any{"Static", []string{"x"}}},
	{key: "kafka.sasl.oauth.token", env: []string{"s3cret"}, flag: []string{"s3cret"}, file: []any{"s3cret"}, never: "s3cret"},
	{key: "kafka.sasl.oauth.token_file", env: []string{"/nonexistent/token"}, flag: []string{"/t"}, file: []any{"/t"}},
	{key: "kafka.sasl.oauth.token_url", env: []string{"https://idp/token"}, flag: []string{"x"}, file: []any{"x"}},
	{key: "kafka.sasl.oauth.client_id", env: []string{"relay"}, flag: []string{"relay"}, file: []any{"relay"}},
	{key: "kafka.sasl.oauth.client_secret", env: []string{"s3cret"}, flag: []string{"s3cret"}, file: []any{"s3cret"}, never: "s3cret"},
	{key: "kafka.sasl.oauth.scope", env: []string{"kafka"}, flag: []string{"kafka"}, file: []any{"kafka"}},
	{key: "kafka.sasl.oauth.extensions", env: []string{"novalue", "a=b"}, flag: []string{"=x", "a=b"}, file: []any{map[string]string{"a": "b"}, "a=b"}},
	{key: "kafka.sasl.oauth.aws_region", env: []string{"us-east-1"}, flag: []string{"us-east-1"}, file: []any{"us-east-1"}},
	{key: "kafka.sasl.oauth.aws_profile", env: []string{"p"}, flag: []string{"p"}, file: []any{"p"}},
	{key: "kafka.sasl.oauth.aws_role_arn", env: []string{"arn:aws:iam::1:role/r"}, flag: []string{"a"}, file: []any{"a"}},
	{key: "kafka.tls.enabled", env: []string{"maybe"}, flag: []string{"2"}, file: []any{"maybe"}},
	{key: "kafka.tls.ca_file", env: []string{"/nonexistent/ca.pem"}, flag: []string{"/x.pem"}, file: []any{"/x.pem"}},
	{key: "kafka.tls.cert_file", env: []string{"/nonexistent/c.pem"}, flag: []string{"/c.pem"}, file: []any{"/c.pem"}},
	{key: "kafka.tls.key_file", env: []string{"/nonexistent/k.pem"}, flag: []string{"/k.pem"}, file: []any{"/k.pem"}},
	{key: "kafka.tls.server_name", env: []string{"kafka.example"}, flag: []string{"k"}, file: []any{"k"}},
	{key: "kafka.tls.insecure_skip_verify", env: []string{"maybe"}, flag: []string{"2"}, file: []any{"sure"}},
	{key: "inflight.max_events", env: []string{"0", "x"}, flag: []string{"-1"}, file: []any{0, "ten"}},
	{key: "inflight.max_bytes", env: []string{"100", "1e6"}, flag: []string{"1023", "-1"}, file: []any{10, "1MiB"}},
	{key: "on_poison", env: []string{"skip", "DLQ"}, flag: []string{""}, file: []any{"ignore", 1}},
	{key: "dead_letter.topic", env: []string{"dead letters"}, flag: []string{"", "a/b"}, file: []any{"..", []string{"x"}}},
	{key: "dead_letter.max_attempts", env: []string{"0", "x"}, flag: []string{"101", "-1"}, file: []any{0, "five"}},
	{key: "dead_letter.retry_backoff", env: []string{"1ms", "soon"}, flag: []string{"2m"}, file: []any{"0s", 5}},
	{key: "leader.enabled", env: []string{"perhaps"}, flag: []string{"2"}, file: []any{"yes please"}},
	{key: "leader.lease_ttl", env: []string{"1s", "long"}, flag: []string{"6m"}, file: []any{"0s", 10}},
	{key: "leader.renew_interval", env: []string{"10ms", "x"}, flag: []string{"0s"}, file: []any{"1ms"}},
	{key: "leader.poll_interval", env: []string{"1ms", "x"}, flag: []string{"2m"}, file: []any{"0s"}},
	{key: "leader.instance_id", env: []string{"a\tb"}, flag: []string{strings.Repeat("x", 129)}, file: []any{"line\nbreak"}},
	{key: "heartbeat.interval", env: []string{"50ms", "often"}, flag: []string{"-1s", "2m"}, file: []any{"1ns", 5}},
	{key: "messages.prefix", env: []string{"outbox-relay/outbox_relay", "outbox-relay"}, flag: []string{"outbox-relay/other_slot", "a\x00b"}, file: []any{"tab\there", []string{"x"}}},
	{key: "serialization", env: []string{"xml", "AVRO"}, flag: []string{"protobuf3"}, file: []any{"avro4", []string{"avro"}}},
	{key: "serialization_topics", env: []string{"orders=xml", "bad topic!=avro"}, flag: []string{"*=avro", "a*b=avro"}, file: []any{"orders"}},
	{key: "schema_registry.url", env: []string{"ftp://registry", "registry:8081"}, flag: []string{"http://"}, file: []any{"::", []string{"x"}}},
	{key: "schema_registry.username", env: []string{"a:b"}, flag: []string{"a\tb"}, file: []any{[]string{"x"}}},
	{key: "schema_registry.password", env: []string{"s3cret"}, flag: []string{"s3cret"}, file: []any{"s3cret"}},
	{key: "schema_registry.tls.ca_file", env: []string{"/nonexistent/ca.pem"}, flag: []string{"/ca.pem"}, file: []any{"/ca.pem"}},
	{key: "schema_registry.tls.cert_file", env: []string{"/nonexistent/c.pem"}, flag: []string{"/c.pem"}, file: []any{"/c.pem"}},
	{key: "schema_registry.tls.key_file", env: []string{"/nonexistent/k.pem"}, flag: []string{"/k.pem"}, file: []any{"/k.pem"}},
	{key: "schema_registry.tls.insecure_skip_verify", env: []string{"maybe"}, flag: []string{"2"}, file: []any{"sure"}},
	{key: "schema_registry.timeout", env: []string{"-1s", "soon"}, flag: []string{"x"}, file: []any{"-5s"}},
	{key: "schema_registry.subject_strategy", env: []string{"TopicNameStrategy", "topic"}, flag: []string{"record"}, file: []any{"by_topic", 1}},
	{key: "schema_registry.record_name", env: []string{"com.acme.{type}"}, flag: []string{"{aggregate}"}, file: []any{"x.{id}"}},
	{key: "schema_registry.auto_register", env: []string{"maybe"}, flag: []string{"2"}, file: []any{"sure"}},
	{key: "schema_registry.schemas", env: []string{"orders-value=/nonexistent/o.avsc"}, flag: []string{"s=/nonexistent"}, file: []any{"x"}},
	{key: "schema_registry.version_header", env: []string{"schema version"}, flag: []string{"a\tb"}, file: []any{[]string{"x"}}},
	{key: "schema_registry.key", env: []string{"avro", "STRING"}, flag: []string{"bytes"}, file: []any{"json", 1}},
	{key: "schema_registry.cache_ttl", env: []string{"-1m", "later"}, flag: []string{"x"}, file: []any{"-5m"}},
	{key: "envelope", env: []string{"cloud-events", "CloudEvents"}, flag: []string{"ce"}, file: []any{"json", []string{"x"}}},
	{key: "cloudevents.mode", env: []string{"BINARY", "json"}, flag: []string{"batch"}, file: []any{"inline", 1}},
	{key: "cloudevents.source", env: []string{"{schema}:/x", "{nope}"}, flag: []string{"/x/{bad}"}, file: []any{[]string{"x"}}},
	{key: "cloudevents.type", env: []string{"{nope}"}, flag: []string{"{id}"}, file: []any{[]string{"x"}}},
	{key: "pprof", env: []string{"on"}, flag: []string{"2"}, file: []any{"enabled"}},
	{key: "metrics_addr", env: []string{"9187"}, flag: []string{"localhost"}, file: []any{"metrics", []string{":1"}}},
	{key: "log.level", env: []string{"loud", "INFO"}, flag: []string{""}, file: []any{"verbose"}},
	{key: "log.format", env: []string{"xml"}, flag: []string{"", "text"}, file: []any{"logfmt"}},
	{key: "shutdown_timeout", env: []string{"100ms", "forever"}, flag: []string{"0s"}, file: []any{"999ms", 30}},
	{key: "max_unacked_age", env: []string{"999ms", "soon"}, flag: []string{"2h"}, file: []any{"0s", 30}},
	{key: "delivery", env: []string{"exactly-once", "EXACTLY_ONCE"}, flag: []string{"", "at_most_once"}, file: []any{"once", 1}},
	{key: "exactly_once.max_batch_events", env: []string{"0", "x"}, flag: []string{"-1"}, file: []any{0, "many"}},
	{key: "exactly_once.max_batch_interval", env: []string{"0s", "soon"}, flag: []string{"2m"}, file: []any{"100us", 5}},
	{key: "exactly_once.max_batch_idle", env: []string{"-1ms", "later"}, flag: []string{"200ms"}, file: []any{"-5ms", 5}},
	{key: "exactly_once.checkpoint_topic", env: []string{"check points"}, flag: []string{"", "a/b"}, file: []any{"..", []string{"x"}}},
	{key: "exactly_once.transaction_timeout", env: []string{"500ms", "long"}, flag: []string{"16m"}, file: []any{"0s", 60}},
	{key: "exactly_once.transactional_id", env: []string{"a b"}, flag: []string{strings.Repeat("x", 201)}, file: []any{"line\nbreak"}},
	{key: "compat", env: []string{"DEBEZIUM", "kafka-connect"}, flag: []string{"dbz"}, file: []any{"yes", []string{"debezium"}}},
	{key: "columns.id", env: []string{strings.Repeat("i", 64)}, flag: []string{strings.Repeat("i", 64)}, file: []any{[]string{"id"}}},
	{key: "columns.key", env: []string{strings.Repeat("k", 64)}, flag: []string{strings.Repeat("k", 64)}, file: []any{[]string{"k"}}},
	{key: "columns.type", env: []string{strings.Repeat("t", 64)}, flag: []string{strings.Repeat("t", 64)}, file: []any{[]string{"t"}}},
	{key: "columns.payload", env: []string{strings.Repeat("p", 64)}, flag: []string{strings.Repeat("p", 64)}, file: []any{[]string{"p"}}},
	{key: "columns.route_by", env: []string{strings.Repeat("r", 64)}, flag: []string{strings.Repeat("r", 64)}, file: []any{[]string{"r"}}},
	{key: "columns.headers", env: []string{strings.Repeat("h", 64)}, flag: []string{strings.Repeat("h", 64)}, file: []any{[]string{"h"}}},
	{key: "columns.additional", env: []string{"type:envelope", "type", "type:header:event_id"}, flag: []string{"a:partition", "a:header:DLQ.x", "a:header:x,b:header:X"},
		file: []any{[]string{"a:b:c:d"}, "type:header:"}},
}

// onlyKey fails unless err exists and every line of it is about key.
func onlyKey(t *testing.T, err error, key, never string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one naming %s", key)
	}
	msg := err.Error()
	for _, line := range strings.Split(msg, "\n") {
		if !strings.HasPrefix(line, key+":") && !strings.HasPrefix(line, key+" (") {
			t.Errorf("error line %q does not name %s; whole error:\n%s", line, key, msg)
		}
	}
	if never != "" && strings.Contains(msg, never) {
		t.Errorf("error leaks %q:\n%s", never, msg)
	}
}

func TestLoadConfigInvalidValueNamesKey(t *testing.T) {
	covered := map[string]bool{}
	for _, tt := range invalidCases {
		covered[tt.key] = true
	}
	for _, k := range keys {
		if !covered[k.name] {
			t.Errorf("key %s has no invalid-value case", k.name)
		}
	}
	byName := map[string]key{}
	for _, k := range keys {
		byName[k.name] = k
	}
	for _, tt := range invalidCases {
		k, ok := byName[tt.key]
		if !ok {
			t.Errorf("case for unknown key %s", tt.key)
			continue
		}
		t.Run(tt.key, func(t *testing.T) {
			for _, v := range tt.env {
				t.Run("env="+v, func(t *testing.T) {
					_, err := loadConfig("run", nil, requiredEnv(map[string]string{k.env: v}))
					onlyKey(t, err, tt.key, tt.never)
				})
			}
			for _, v := range tt.flag {
				t.Run("flag="+v, func(t *testing.T) {
					_, err := loadConfig("run", []string{"--" + k.flag + "=" + v}, requiredEnv(nil))
					onlyKey(t, err, tt.key, tt.never)
				})
			}
			for _, v := range tt.file {
				var label strings.Builder
				_ = yaml.NewEncoder(&label).Encode(v)
				t.Run("file="+strings.TrimSpace(label.String()), func(t *testing.T) {
					p := yamlConfig(t, map[string]any{tt.key: v})
					_, err := loadConfig("run", []string{"--config", p}, envOf(nil))
					onlyKey(t, err, tt.key, tt.never)
				})
			}
		})
	}
}

func TestLoadConfigReportsEveryProblem(t *testing.T) {
	tests := []struct {
		name   string
		file   string // YAML; "" = no file
		args   []string
		getenv func(string) string
		want   []string // keys that must all be named
	}{
		{
			name:   "nothing set",
			getenv: envOf(nil),
			want:   []string{"postgres.url", "kafka.brokers"},
		},
		{
			name:   "env and flags",
			args:   []string{"--status-interval=abc", "--kafka-compression=brotli", "--log-format=xml"},
			getenv: requiredEnv(map[string]string{"OUTBOX_RELAY_SLOT": "Bad-Slot", "OUTBOX_RELAY_KAFKA_RETRY_MAX": "many", "OUTBOX_RELAY_MAX_INFLIGHT_EVENTS": "0"}),
			want:   []string{"postgres.status_interval", "kafka.compression", "log.format", "postgres.slot", "kafka.retry_max", "inflight.max_events"},
		},
		{
			name: "file type errors, file validation errors, env and flags",
			file: "postgres:\n  url: " + testURL + "\n  status_interval: 5\n  table: a.b.c\n" +
				"kafka:\n  brokers: [k1:9092]\n  flush_bytes: lots\n  version: banana\n" +
				"log:\n  level: loud\nshutdown_timeout: forever\n",
			args:   []string{"--kafka-retry-max=0"},
			getenv: envOf(map[string]string{"OUTBOX_RELAY_PUBLICATION": strings.Repeat("p", 64)}),
			want: []string{"postgres.status_interval", "postgres.table", "kafka.flush_bytes", "kafka.version",
				"log.level", "shutdown_timeout", "kafka.retry_max", "postgres.publication"},
		},
		{
			name:   "unknown top-level key",
			file:   "postgres:\n  url: " + testURL + "\nkafka:\n  brokers: [k1:9092]\nbogus_key: 1\n",
			getenv: envOf(nil),
			want:   []string{"bogus_key"},
		},
		{
			name:   "unknown nested key and a bad env value",
			file:   "postgres:\n  url: " + testURL + "\n  slott: x\nkafka:\n  brokers: [k1:9092]\n",
			getenv: envOf(map[string]string{"OUTBOX_RELAY_LOG_LEVEL": "loud"}),
			want:   []string{"postgres.slott", "log.level"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				args = append([]string{"--config", writeTestFile(t, tt.file)}, args...)
			}
			_, err := loadConfig("run", args, tt.getenv)
			if err == nil {
				t.Fatalf("no error, want one naming %v", tt.want)
			}
			for _, k := range tt.want {
				if !strings.Contains(err.Error(), k) {
					t.Errorf("error does not name %s:\n%v", k, err)
				}
			}
			if got := strings.Count(err.Error(), "\n") + 1; got != len(tt.want) {
				t.Errorf("error has %d lines, want one per key (%d):\n%v", got, len(tt.want), err)
			}
		})
	}
}

func TestLoadConfigFileAndArgsErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		file string // "" = no file written
		args []string
		want string
	}{
		{"missing file", "", []string{"--config", filepath.Join(dir, "missing.yaml")}, "read config file"},
		{"syntax error", "postgres: [\n", nil, "config file"},
		{"unknown flag", "", []string{"--no-such-flag"}, "no-such-flag"},
		{"positional argument", "", []string{"extra"}, "unexpected arguments"},
		{"flag without value", "", []string{"--slot"}, "slot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				args = append([]string{"--config", writeTestFile(t, tt.file)}, args...)
			}
			_, err := loadConfig("run", args, requiredEnv(nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
	t.Run("empty file is all defaults", func(t *testing.T) {
		c, err := loadConfig("run", []string{"--config", writeTestFile(t, "")}, requiredEnv(nil))
		if err != nil {
			t.Fatalf("loadConfig: %v", err)
		}
		if c.Postgres.Slot != "outbox_relay" {
			t.Errorf("slot = %q", c.Postgres.Slot)
		}
	})
}

func TestRealMainExitCodes(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		getenv   func(string) string
		wantCode int
		want     []string // substrings of the output
	}{
		{"run with invalid config", []string{"run", "--slot=Bad-Slot", "--status-interval=abc"},
			requiredEnv(map[string]string{"OUTBOX_RELAY_KAFKA_COMPRESSION": "brotli"}), exitConfig,
			[]string{"invalid configuration", "postgres.slot", "postgres.status_interval", "kafka.compression"}},
		{"upper-case slot", []string{"run", "--slot=OutboxRelay"}, requiredEnv(nil), exitConfig,
			[]string{"invalid configuration", `postgres.slot: "OutboxRelay" has 'O'`, "lower-case letters, digits or underscores"}},
		{"dashed slot", []string{"migrate"}, requiredEnv(map[string]string{"OUTBOX_RELAY_SLOT": "outbox-relay"}), exitConfig,
			[]string{"invalid configuration", `postgres.slot: "outbox-relay" has '-'`}},
		{"run with nothing set", []string{"run"}, envOf(nil), exitConfig,
			[]string{"postgres.url", "kafka.brokers"}},
		{"run with no topic limit", []string{"run", "--kafka-max-topics=0", "--kafka-topic-allowlist=orders,*"},
			requiredEnv(map[string]string{"OUTBOX_RELAY_KAFKA_AUTO_CREATE_TOPICS": "maybe"}), exitConfig,
			[]string{"invalid configuration", "kafka.max_topics", "use a large number", "kafka.topic_allowlist", "kafka.auto_create_topics"}},
		{"migrate with invalid config", []string{"migrate", "--table=a.b.c"}, requiredEnv(nil), exitConfig,
			[]string{"postgres.table"}},
		{"run with unknown flag", []string{"run", "--bogus"}, requiredEnv(nil), exitConfig, []string{"bogus"}},
		{"unknown command", []string{"frobnicate"}, requiredEnv(nil), exitConfig,
			[]string{`unknown command "frobnicate"`, "usage:"}},
		{"no command", nil, requiredEnv(nil), exitConfig, []string{"usage:"}},
		{"version", []string{"version"}, envOf(nil), exitOK, []string{"outbox-relay " + version}},
		{"help", []string{"help"}, envOf(nil), exitOK, []string{"usage:"}},
		{"run -h", []string{"run", "-h"}, envOf(nil), exitOK, nil},
		{"dlq without command", []string{"dlq"}, requiredEnv(nil), exitConfig, []string{"usage: outbox-relay dlq"}},
		{"dlq unknown command", []string{"dlq", "purge"}, requiredEnv(nil), exitConfig, []string{`unknown dlq command "purge"`}},
		{"dlq replay without id", []string{"dlq", "replay"}, requiredEnv(nil), exitConfig, []string{"--id is required"}},
		{"dlq resolve bad id", []string{"dlq", "resolve", "--id", "x"}, requiredEnv(nil), exitConfig, []string{"id"}},
		{"dlq list bad config", []string{"dlq", "list", "--on-poison", "skip"}, requiredEnv(nil), exitConfig, []string{"on_poison"}},
		{"replay without a start", []string{"replay"}, requiredEnv(nil), exitConfig,
			[]string{"one of --since TIME or --from-id N is required", "usage: outbox-relay replay"}},
		{"replay bad time and rate", []string{"replay", "--since", "last week", "--rate", "fast"}, requiredEnv(nil), exitConfig,
			[]string{"--since:", "RFC 3339", "--rate:", "N/s"}},
		{"replay bad flags and config", []string{"replay", "--from-id", "1", "--to-id", "x", "--on-poison", "skip"}, requiredEnv(nil), exitConfig,
			[]string{"--to-id:", "on_poison"}},
		{"replay -h", []string{"replay", "-h"}, envOf(nil), exitOK, []string{"usage: outbox-relay replay --since TIME|--from-id N"}},
		{"help lists replay", []string{"help"}, envOf(nil), exitOK, []string{"replay    --since TIME|--from-id N"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if got := realMain(tt.args, tt.getenv, &buf, &buf); got != tt.wantCode {
				t.Errorf("exit code %d, want %d; output:\n%s", got, tt.wantCode, buf.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("output does not contain %q:\n%s", w, buf.String())
				}
			}
			if strings.Contains(buf.String(), "s3cret") {
				t.Errorf("output leaks the password:\n%s", buf.String())
			}
		})
	}
}

func TestConfigRedacted(t *testing.T) {
	tests := []struct {
		name string
		url  string
		keep []string // parts that must survive redaction
	}{
		{"url", "postgres://u:s3cret@h/db", []string{"u:xxxxx@h/db"}},
		{"url with port and params", "postgresql://relay:s3cret@db.internal:5432/app?sslmode=require", []string{"relay", "db.internal:5432", "sslmode=require"}},
		{"query password", "postgres://relay@h/db?password=s3cret&sslmode=disable", []string{"relay@h", "sslmode=disable"}},
		{"keyword form", "host=h user=relay password=s3cret dbname=db", []string{"host=h", "dbname=db"}},
		{"keyword form quoted", "host=h password='s 3cret' dbname=db", []string{"host=h", "dbname=db"}},
		{"keyword form escaped space", `host=h password=abc\ s3cret dbname=db`, []string{"host=h", "password=xxxxx dbname=db"}},
		{"keyword form sslpassword", `host=h sslmode=require sslpassword='it\'s s3cret' dbname=db`, []string{"host=h", "sslpassword=xxxxx dbname=db"}},
		{"url sslpassword", "postgres://relay@h/db?sslmode=require&sslpassword=s3cret", []string{"relay@h/db?sslmode=require&sslpassword=xxxxx"}},
		{"url both", "postgres://relay:s3cret@h/db?sslpassword=s3cret&password=s3cret", []string{"relay:xxxxx@h/db?sslpassword=xxxxx&password=xxxxx"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadConfig("run", []string{"--postgres-url", tt.url}, requiredEnv(nil))
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			out := c.redacted()
			for _, secret := range []string{"s3cret", "s 3cret"} {
				if strings.Contains(out, secret) {
					t.Errorf("redacted config contains %q:\n%s", secret, out)
				}
			}
			for _, k := range tt.keep {
				if !strings.Contains(out, k) {
					t.Errorf("redacted config lost %q:\n%s", k, out)
				}
			}
			if c.Postgres.URL != tt.url {
				t.Errorf("redacted() changed the config itself: URL = %q", c.Postgres.URL)
			}
			// The redacted form is the config as YAML, so it names the keys.
			if !strings.Contains(out, "status_interval:") || !strings.Contains(out, "brokers:") {
				t.Errorf("redacted config is not the YAML config:\n%s", out)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"postgres://u:s3cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgresql://u:s3cret@h:5432/db?sslmode=disable", "postgresql://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgres://u:s3%40cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u@h/db?password=s3cret", "postgres://u@h/db?password=xxxxx"},
		{"postgres://u:s3cret@h/db?password=s3cret", "postgres://u:xxxxx@h/db?password=xxxxx"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"postgres://h/db", "postgres://h/db"},
		{"host=h user=u password=s3cret dbname=db", "host=h user=u password=xxxxx dbname=db"},
		{"host=h password='s 3cret' dbname=db", "host=h password=xxxxx dbname=db"},
		{`host=h password='it\'s 3cret' dbname=db`, "host=h password=xxxxx dbname=db"},
		{"host=h password = s3cret dbname=db", "host=h password = xxxxx dbname=db"},
		{"host=h PASSWORD=s3cret", "host=h PASSWORD=xxxxx"},
		{"password=s3cret", "password=xxxxx"},
		{"host=h dbname=db", "host=h dbname=db"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := replication.RedactURL(tt.in)
			if got != tt.want {
				t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
			}
			for _, secret := range []string{"s3cret", "3cret", "s3%40cret"} {
				if strings.Contains(got, secret) {
					t.Errorf("RedactURL(%q) = %q still contains %q", tt.in, got, secret)
				}
			}
		})
	}
}

func TestBoolFlagsStandAlone(t *testing.T) {
	for name := range boolKeys {
		var k key
		for _, x := range keys {
			if x.name == name {
				k = x
			}
		}
		if k.name == "" {
			t.Fatalf("boolKeys names unknown key %s", name)
		}
		// A bool flag followed by another flag must not swallow it.
		if _, err := loadConfig("run", []string{"--" + k.flag, "--slot", "s1"}, requiredEnv(nil)); err != nil &&
			strings.Contains(err.Error(), "unexpected arguments") {
			t.Errorf("--%s alone swallowed the next flag: %v", k.flag, err)
		}
	}
}

// The shipped example config must load as it is, given its secret and a CA
// file where it expects one.
func TestExampleConfigLoads(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, selfSignedPEM(t), 0o600)
	c, err := loadConfig("run", []string{"--config", "../../deploy/config.example.yaml", "--kafka-tls-ca-file", ca},
		envOf(map[string]string{"OUTBOX_RELAY_KAFKA_SASL_PASSWORD": "s3cret"}))
	if err != nil {
		t.Fatalf("deploy/config.example.yaml: %v", err)
	}
	if !c.Leader.Enabled || c.OnPoison != "dlq" || c.DeadLetter.Topic != "outbox.dlq" {
		t.Errorf("example config: leader %v, on_poison %q, dlq topic %q", c.Leader.Enabled, c.OnPoison, c.DeadLetter.Topic)
	}
}

// selfSignedPEM returns a throwaway CA certificate in PEM.
func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// Commands that touch PostgreSQL only load without kafka.brokers (the first
// migrate comes before Kafka exists; status works with Kafka down), keep
// no stand-in broker in the loaded config, and still reject a bad one;
// commands that publish or check Kafka still require it.
func TestKafkaBrokersOnlyWhereKafkaIsUsed(t *testing.T) {
	pgOnly := envOf(map[string]string{"OUTBOX_RELAY_POSTGRES_URL": testURL})
	badBroker := envOf(map[string]string{"OUTBOX_RELAY_POSTGRES_URL": testURL, "OUTBOX_RELAY_KAFKA_BROKERS": "nohostport"})
	for _, tt := range []struct {
		cmd         string
		needsBroker bool
	}{
		{"migrate", false}, {"status", false}, {"cleanup", false}, {"dlq list", false}, {"dlq resolve", false},
		{"run", true}, {"replay", true}, {"check", true}, {"dlq replay", true},
	} {
		t.Run(tt.cmd, func(t *testing.T) {
			c, err := loadConfig(tt.cmd, nil, pgOnly)
			switch {
			case tt.needsBroker && (err == nil || !strings.Contains(err.Error(), "kafka.brokers")):
				t.Fatalf("without kafka.brokers: err %v, want one naming kafka.brokers", err)
			case !tt.needsBroker && err != nil:
				t.Fatalf("without kafka.brokers: %v, want it to load (PostgreSQL only)", err)
			case !tt.needsBroker && len(c.Kafka.Brokers) != 0:
				t.Fatalf("loaded config has brokers %v, want none: the stand-in is for validation only", c.Kafka.Brokers)
			}
			if _, err := loadConfig(tt.cmd, nil, badBroker); err == nil || !strings.Contains(err.Error(), "kafka.brokers") {
				t.Fatalf("with kafka.brokers=nohostport: err %v, want one naming kafka.brokers", err)
			}
		})
	}
}

// The OAUTHBEARER secrets (static token, client secret) never reach the
// printed config; the rest of the oauth settings do.
func TestConfigRedactedOAuthSecrets(t *testing.T) {
	c, err := loadConfig("run", []string{"--kafka-sasl-mechanism", "OAUTHBEARER", "--kafka-sasl-oauth-token-source", "client_credentials",
		"--kafka-sasl-oauth-token-url", "https://idp.example/token", "--kafka-sasl-oauth-client-id", "relay",
		"--kafka-sasl-oauth-extensions", "logicalCluster=lkc-1,identityPoolId=pool-2"},
		requiredEnv(map[string]string{"OUTBOX_RELAY_KAFKA_SASL_OAUTH_CLIENT_SECRET": "s3cret"}))
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	if c.Kafka.SASL.OAuth.Extensions["identityPoolId"] != "pool-2" {
		t.Fatalf("extensions %v", c.Kafka.SASL.OAuth.Extensions)
	}
	out := c.redacted()
	if strings.Contains(out, "s3cret") {
		t.Errorf("redacted config holds the client secret:\n%s", out)
	}
	for _, k := range []string{"token_source: client_credentials", "https://idp.example/token", "logicalCluster: lkc-1", "client_secret: xxxxx"} {
		if !strings.Contains(out, k) {
			t.Errorf("redacted config lost %q:\n%s", k, out)
		}
	}
	c.Kafka.SASL.OAuth = sink.OAuthConfig{Source: sink.TokenStatic, Token: "s3cret"}
	if out := c.redacted(); strings.Contains(out, "s3cret") {
		t.Errorf("redacted config holds the static token:\n%s", out)
	}
}
