package replication

import (
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	c := DefaultConfig()
	c.URL = "postgres://relay:s3cret@db:5432/app"
	return c
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // keys named in the error; nil = valid
	}{
		{"defaults with URL", func(*Config) {}, nil},
		{"keyword URL", func(c *Config) { c.URL = "host=db user=relay dbname=app" }, nil},
		{"table without schema", func(c *Config) { c.Table = "outbox" }, nil},
		{"shortest status interval", func(c *Config) { c.StatusInterval = 10 * time.Millisecond }, nil},
		{"longest status interval", func(c *Config) { c.StatusInterval = time.Minute }, nil},
		{"equal reconnect bounds", func(c *Config) { c.ReconnectMin, c.ReconnectMax = time.Second, time.Second }, nil},
		{"63-char slot", func(c *Config) { c.Slot = strings.Repeat("a", 63) }, nil},
		// Publications are quoted everywhere, so any name PostgreSQL can hold works.
		{"upper-case publication", func(c *Config) { c.Publication = "OutboxPub" }, nil},
		{"publication starts with digit", func(c *Config) { c.Publication = "1pub" }, nil},
		{"hostile publication", func(c *Config) { c.Publication = `Out"box 'Pub, $$ x` }, nil},
		{"63-byte publication", func(c *Config) { c.Publication = strings.Repeat("p", 63) }, nil},
		{"shortest lag poll", func(c *Config) { c.LagPollInterval = 100 * time.Millisecond }, nil},

		{"empty URL", func(c *Config) { c.URL = "" }, []string{"postgres.url"}},
		{"unparsable URL", func(c *Config) { c.URL = "postgres://u:s3cret@db:notaport/app" }, []string{"postgres.url"}},
		{"unparsable keyword URL", func(c *Config) { c.URL = "host=db port=x password=s3cret" }, []string{"postgres.url"}},
		{"empty slot", func(c *Config) { c.Slot = "" }, []string{"postgres.slot"}},
		{"upper-case slot", func(c *Config) { c.Slot = "Outbox" }, []string{"postgres.slot"}},
		{"dashed slot", func(c *Config) { c.Slot = "outbox-relay" }, []string{"postgres.slot"}},
		{"64-char slot", func(c *Config) { c.Slot = strings.Repeat("a", 64) }, []string{"postgres.slot"}},
		{"empty publication", func(c *Config) { c.Publication = "" }, []string{"postgres.publication"}},
		{"64-byte publication", func(c *Config) { c.Publication = strings.Repeat("p", 64) }, []string{"postgres.publication"}},
		{"publication with NUL", func(c *Config) { c.Publication = "pub\x00" }, []string{"postgres.publication"}},
		{"publication not UTF-8", func(c *Config) { c.Publication = "pub\xff" }, []string{"postgres.publication"}},
		{"slot with space", func(c *Config) { c.Slot = "outbox relay" }, []string{"postgres.slot"}},
		{"empty table", func(c *Config) { c.Table = "" }, []string{"postgres.table"}},
		{"three-part table", func(c *Config) { c.Table = "db.public.outbox" }, []string{"postgres.table"}},
		{"status interval zero", func(c *Config) { c.StatusInterval = 0 }, []string{"postgres.status_interval"}},
		{"status interval too short", func(c *Config) { c.StatusInterval = 9 * time.Millisecond }, []string{"postgres.status_interval"}},
		{"status interval too long", func(c *Config) { c.StatusInterval = time.Minute + 1 }, []string{"postgres.status_interval"}},
		{"reconnect min zero", func(c *Config) { c.ReconnectMin = 0 }, []string{"postgres.reconnect_min"}},
		{"reconnect min negative", func(c *Config) { c.ReconnectMin = -time.Second }, []string{"postgres.reconnect_min"}},
		{"reconnect max below min", func(c *Config) { c.ReconnectMax = c.ReconnectMin - 1 }, []string{"postgres.reconnect_max"}},
		{"reconnect min above max", func(c *Config) { c.ReconnectMin = time.Hour }, []string{"postgres.reconnect_max"}},
		{"partition weekly", func(c *Config) { c.Partition = "weekly" }, []string{"postgres.partition"}},
		{"partition daily", func(c *Config) { c.Partition = "daily" }, nil},
		{"partition monthly", func(c *Config) { c.Partition = "monthly" }, nil},
		{"lag poll too short", func(c *Config) { c.LagPollInterval = 99 * time.Millisecond }, []string{"postgres.lag_poll_interval"}},
		{"streaming unknown", func(c *Config) { c.Streaming = "yes" }, []string{"postgres.streaming"}},
		{"standby slots", func(c *Config) { c.StandbySlots = []string{"standby_1", "standby_2"} }, nil},
		{"standby slot upper-case", func(c *Config) { c.StandbySlots = []string{"Standby"} }, []string{"postgres.standby_slots"}},
		{"standby slot empty", func(c *Config) { c.StandbySlots = []string{""} }, []string{"postgres.standby_slots"}},
		{"standby slot twice", func(c *Config) { c.StandbySlots = []string{"a", "b", "a"} }, []string{"postgres.standby_slots"}},
		{"standby slot is the relay's slot", func(c *Config) { c.StandbySlots = []string{c.Slot} }, []string{"postgres.standby_slots"}},
		{"streaming off", func(c *Config) { c.Streaming = StreamingOff }, nil},
		{"everything wrong", func(c *Config) { *c = Config{} }, []string{
			"postgres.url", "postgres.slot", "postgres.publication", "postgres.table", "postgres.partition",
			"postgres.status_interval", "postgres.receive_timeout", "postgres.reconnect_min", "postgres.lag_poll_interval",
			"postgres.streaming",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate("postgres.")
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %v", tt.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Errorf("%d problems reported, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, line := range lines {
				if i < len(tt.want) && !strings.HasPrefix(line, tt.want[i]+": ") {
					t.Errorf("line %d %q does not start with %q", i, line, tt.want[i]+": ")
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
	t.Run("prefix is used verbatim", func(t *testing.T) {
		c := validConfig()
		c.Slot = ""
		if err := c.Validate("pg."); err == nil || !strings.HasPrefix(err.Error(), "pg.slot: ") {
			t.Errorf("Validate(\"pg.\") = %v, want a pg.slot error", err)
		}
	})
}

func TestParsePGDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"60s", time.Minute, true},
		{"500ms", 500 * time.Millisecond, true},
		{"1min", time.Minute, true},
		{"5min", 5 * time.Minute, true},
		{"0", 0, true},
		{"1500", 1500 * time.Millisecond, true}, // no unit: milliseconds, wal_sender_timeout's base unit
		{"2h", 2 * time.Hour, true},
		{"1d", 24 * time.Hour, true},
		{"0s", 0, true},
		{"", 0, false},
		{"bad", 0, false},
		{"s", 0, false},
		{"ms", 0, false},
		{"min", 0, false},
		{"xs", 0, false},
		{"abcmin", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parsePGDuration(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("parsePGDuration(%q) err = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if tt.ok && got != tt.want {
				t.Errorf("parsePGDuration(%q) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}
