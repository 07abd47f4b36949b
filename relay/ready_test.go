package relay

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// outbox_relay_ready tells the same truth as /readyz: 1 exactly when Health
// is ready, read at scrape time, so "not ready for a minute" can alert.
func TestReadyGauge(t *testing.T) {
	for _, tt := range []struct {
		name   string
		health Health
		want   float64
	}{
		{"ready leader", Health{Ready: true, Reason: "leader: streaming"}, 1},
		{"ready standby", Health{Ready: true, Reason: "standby: lease connection up"}, 1},
		{"halted", Health{Ready: false, Reason: "halted: poison"}, 0},
		{"starting", Health{Ready: false, Reason: "starting"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(newReadyGauge(func() Health { return tt.health }))
			if got := gatherValue(t, reg, "outbox_relay_ready"); got != tt.want {
				t.Errorf("outbox_relay_ready = %v, want %v", got, tt.want)
			}
		})
	}
}

// A Relay exports outbox_relay_ready in its process-wide registry (a
// standby's too), agreeing with Health.
func TestRelayExportsReady(t *testing.T) {
	for _, election := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Postgres.URL = "postgres://u@127.0.0.1:1/db"
		cfg.Kafka.Brokers = []string{"127.0.0.1:1"}
		cfg.MetricsAddr = ""
		cfg.Leader.Enabled = election
		reg := prometheus.NewRegistry()
		r, err := New(cfg, Deps{Log: zerolog.Nop(), Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		h := r.Health()
		want := 0.0
		if h.Ready {
			want = 1
		}
		if got := gatherValue(t, r, "outbox_relay_ready"); got != want {
			t.Errorf("election %v: outbox_relay_ready = %v, want %v (/readyz: %q)", election, got, want, h.Reason)
		}
	}
}

func gatherValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}
