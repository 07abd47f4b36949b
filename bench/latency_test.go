package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseLatMode(t *testing.T) {
	for _, c := range []struct {
		in, want string
		bad      bool
	}{
		{"", latTurns, false},
		{"turns", latTurns, false},
		{" together ", latTogether, false},
		{"together", latTogether, false},
		{"Turns", "", true},
		{"alone", "", true},
		{"turns,together", "", true},
	} {
		got, err := parseLatMode(c.in)
		if c.bad {
			if err == nil || !strings.Contains(err.Error(), "OUTBOX_BENCH_LAT_MODE") || !strings.Contains(err.Error(), "turns") {
				t.Errorf("%q: err %v, want an error naming the setting and its values", c.in, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestTurnOrder(t *testing.T) {
	for _, c := range []struct {
		n, phase int
		want     []int
	}{
		{3, 0, []int{0, 1, 2}},
		{3, 1, []int{1, 2, 0}},
		{3, 2, []int{2, 0, 1}},
		{3, 3, []int{0, 1, 2}},
		{2, 1, []int{1, 0}},
		{1, 5, []int{0}},
	} {
		if got := turnOrder(c.n, c.phase); !slices.Equal(got, c.want) {
			t.Errorf("turnOrder(%d, %d) = %v, want %v", c.n, c.phase, got, c.want)
		}
	}
	// Over n phases every leg takes every place once.
	for n := 1; n <= 5; n++ {
		for place := range n {
			seen := map[int]bool{}
			for phase := range n {
				seen[turnOrder(n, phase)[place]] = true
			}
			if len(seen) != n {
				t.Errorf("n=%d: place %d taken by %d legs over %d phases, want all", n, place, len(seen), n)
			}
		}
	}
}

func TestMergeTurns(t *testing.T) {
	names := []string{"relay", "relay-alt", "forwarder"}
	descs := []string{"relay, defaults", "relay, alt", "forwarder"}
	run := func(name string, events int, loadS, cpu, p50 float64, behind bool) *latPhase {
		return &latPhase{Rate: 5000, Gen: loadResult{Events: events, DurationS: 5}, LoadS: loadS, SteadyDelivered: float64(events) / 5,
			RelayBehind: behind, AckQ: []float64{0.002, 0, 0.009, 0, 0}, RelayRSSMax: 30 << 20,
			Legs: []legStats{{Name: name, CPU: cpu, ConsQ: []float64{p50, 0, 0, 0, 0}, Events: events, LoadS: loadS}}}
	}
	for _, c := range []struct {
		name       string
		runs       []*latPhase
		order      []int
		wantErr    bool
		wantLegs   []string // name=status or name!err
		wantUS     []float64
		wantRelayQ float64
	}{
		{
			name:  "all ran",
			runs:  []*latPhase{run("relay", 25000, 5.1, 0.25, 3, false), run("relay-alt", 24000, 5.2, 0.3, 4, false), run("forwarder", 20000, 5.0, 0.1, 2, true)},
			order: []int{1, 2, 0},
			// each leg's CPU over its own run's events: 0.25 s / 25000 = 10 us
			wantLegs: []string{"relay=ok", "relay-alt=ok", "forwarder=not sustained"}, wantUS: []float64{10, 12.5, 5}, wantRelayQ: 0.009,
		},
		{
			name:     "forwarder failed",
			runs:     []*latPhase{run("relay", 25000, 5, 0.5, 3, false), nil, {Err: "forwarder exited"}},
			order:    []int{2, 0, 1},
			wantLegs: []string{"relay=ok", "forwarder!forwarder exited"}, wantUS: []float64{20, math.NaN()}, wantRelayQ: 0.009,
		},
		{
			name:    "relay failed",
			runs:    []*latPhase{{Err: "loadgen: boom"}, run("relay-alt", 100, 1, 0, 1, false), nil},
			order:   []int{0, 1, 2},
			wantErr: true, wantLegs: []string{"relay!loadgen: boom", "relay-alt=ok"}, wantUS: []float64{math.NaN(), 0},
		},
		{
			name:    "relay not run",
			runs:    []*latPhase{nil, nil, run("forwarder", 100, 1, 0, 1, false)},
			order:   []int{2, 0, 1},
			wantErr: true, wantLegs: []string{"forwarder=ok"}, wantUS: []float64{0},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := mergeTurns(names, descs, c.runs, c.order)
			if (p.Err != "") != c.wantErr {
				t.Fatalf("Err %q, want error %v", p.Err, c.wantErr)
			}
			var want []string
			for _, k := range c.order {
				want = append(want, names[k])
			}
			if !slices.Equal(p.TurnOrder, want) {
				t.Errorf("TurnOrder %v, want %v", p.TurnOrder, want)
			}
			var got []string
			for _, l := range p.Legs {
				if l.Err != "" {
					got = append(got, l.Name+"!"+l.Err)
				} else {
					got = append(got, l.Name+"="+l.Status)
				}
			}
			if !slices.Equal(got, c.wantLegs) {
				t.Errorf("legs %v, want %v", got, c.wantLegs)
			}
			for i, l := range p.Legs {
				if l.Err != "" {
					continue
				}
				if us := l.usPerEvent(); math.Abs(us-c.wantUS[i]) > 1e-9 {
					t.Errorf("%s: %g us/event, want %g", l.Name, us, c.wantUS[i])
				}
			}
			if !c.wantErr && p.AckQ[2] != c.wantRelayQ {
				t.Errorf("phase ack p99 %g, want the relay run's %g", p.AckQ[2], c.wantRelayQ)
			}
			if c.runs[0] != nil && len(c.runs[0].Legs) == 1 && c.runs[0].Legs[0].Status != "" {
				t.Errorf("mergeTurns changed the relay run's own legs")
			}
		})
	}
}

// TestReportTurns: the report names the mode, lists the turn order, gives
// each leg's status and CPU from its own run and the median gap to the
// forwarder's.
func TestReportTurns(t *testing.T) {
	sc, _ := scaleFor("small")
	res := &results{Started: time.Now(), Scale: sc, Machine: readMachine(), Latency: &latencyRun{Mode: latTurns, Legs: []string{"relay, defaults", "forwarder"}}}
	names, descs := []string{"relay", "forwarder"}, []string{"relay, defaults", "forwarder"}
	for i, rate := range []int{1000, 5000} {
		var runs []*latPhase
		for k, name := range names {
			events := rate * 5 * (k + 1) / 2 // the forwarder's run generated fewer: its own figure counts
			runs = append(runs, &latPhase{Rate: rate, Gen: loadResult{Events: events, DurationS: 5, FirstLateS: -1}, LoadS: 5, SteadyDelivered: float64(events) / 5,
				AckQ: []float64{0.002, 0.004, 0.009, 0.02, 0.04}, ConsQ: []float64{2.5, 5, 11, 22, 45},
				Legs: []legStats{{Name: name, Desc: descs[k], CPU: 0.05, ConsQ: []float64{3 - float64(k), 5, 11, 22, 45}, Events: events, LoadS: 5}}})
		}
		res.Latency.Phases = append(res.Latency.Phases, mergeTurns(names, descs, runs, turnOrder(2, i)))
	}
	md := res.markdown("x")
	for _, want := range []string{
		"Legs in **turns** (`OUTBOX_BENCH_LAT_MODE=turns`",
		"each leg runs **alone**",
		"Order of the turns: 1000: relay, forwarder; 5000: forwarder, relay.",
		// relay: 0.05 s over 2500 events = 20 us; forwarder 0.05 s over 5000 = 10 us
		"| 1000 | relay, defaults | 3.0 ms | 11.0 ms | 22.0 ms | 45.0 ms | +1.00 ms | 20.0 | 1% | 0 | 0 | 0 | ok |",
		"| 1000 | forwarder | 2.0 ms | 11.0 ms | 22.0 ms | 45.0 ms | +0.00 ms | 10.0 | 1% | 0 | 0 | 0 | ok |",
		"the highest of the relay leg's processes, one per phase",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
	res.Latency.Mode = latTogether
	if md := res.markdown("x"); !strings.Contains(md, "Legs **together**") || strings.Contains(md, "Order of the turns") {
		t.Errorf("together report: wrong mode text")
	}
}
