package main

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func TestBindsAt(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    curvePoint
		want string
	}{
		{"walsender saturated", curvePoint{Family: "topics", Seconds: 10, RelayCPU: 5, Walsender: 9, Broker: 2}, "walsender CPU"},
		{"relay saturated", curvePoint{Family: "topics", Seconds: 10, RelayCPU: 12, Walsender: 3, Broker: 2}, "relay CPU"},
		{"broker saturated", curvePoint{Family: "topics", Seconds: 10, RelayCPU: 3, Walsender: 3, Broker: 9}, "broker CPU"},
		{"machine full", curvePoint{Family: "topics", Seconds: 10, RelayCPU: 7, Walsender: 7, Broker: 7}, "machine CPU"},
		{"at the broker's ingest", curvePoint{Family: "payload", Seconds: 10, RelayCPU: 2, Walsender: 1, Broker: 5, EvPerS: 900, RefEvPerS: 1000}, "broker ingest"},
		{"below the broker's ingest", curvePoint{Family: "payload", Seconds: 10, RelayCPU: 2, Walsender: 1, Broker: 5, EvPerS: 500, RefEvPerS: 1000}, "largest share: broker CPU"},
		{"added round trip", curvePoint{Family: "rtt", Label: "Kafka via proxy +1ms", Seconds: 10, RelayCPU: 2, Walsender: 1, Broker: 1}, "network RTT"},
		{"proxy without delay", curvePoint{Family: "rtt", Label: "Kafka via proxy +0", Seconds: 10, RelayCPU: 2, Walsender: 1, Broker: 1}, "proxy hop"},
		{"machine busy with other load", curvePoint{Family: "topics", Seconds: 10, RelayCPU: 2, Walsender: 1, Broker: 1, MachBusy: 0.97}, "machine CPU, taken by other load"},
		{"disk", curvePoint{Family: "bigtxn", Seconds: 10, RelayCPU: 2, Walsender: 1, Broker: 1, MachBusy: 0.5, MachIOWait: 0.4}, "disk"},
		{"failed point", curvePoint{Family: "rtt", Err: "boom"}, "n/a"},
	} {
		if tc.p.MachBusy == 0 && tc.p.MachIOWait == 0 {
			tc.p.MachBusy, tc.p.MachIOWait = math.NaN(), math.NaN()
		}
		t.Run(tc.name, func(t *testing.T) {
			if got := bindsAt(&tc.p, 2); !strings.HasPrefix(got, tc.want) && !strings.Contains(got, tc.want) {
				t.Fatalf("bindsAt = %q, want %q", got, tc.want)
			}
		})
	}
}

// A run whose points all failed (no data on a log axis) still draws its
// figure instead of panicking (gonum: "Values must be greater than 0 for a
// log scale").
func TestPlotCurvesWithoutData(t *testing.T) {
	c := &curvesResult{Cores: 2}
	for _, f := range []string{"payload", "topics", "aggregates", "bigtxn", "rtt"} {
		c.Points = append(c.Points, &curvePoint{Family: f, Label: "x", X: 1, Err: "failed"})
	}
	if err := plotCurves(c, filepath.Join(t.TempDir(), "c.png")); err != nil {
		t.Fatal(err)
	}
}
