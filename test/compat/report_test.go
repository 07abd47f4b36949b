package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestSpreadOf(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want spread3
	}{
		{[]float64{3, 1, 2}, spread3{1, 2, 3}},
		{[]float64{4, 1}, spread3{1, 2.5, 4}},
		{[]float64{5}, spread3{5, 5, 5}},
		{[]float64{math.NaN(), 7, math.Inf(1), 9}, spread3{7, 8, 9}},
	} {
		if got := spreadOf(tc.in); got != tc.want {
			t.Errorf("spreadOf(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	if s := spreadOf(nil); !math.IsNaN(s.Med) {
		t.Errorf("spreadOf(nil) = %+v, want NaN", s)
	}
}

// TestReport builds a run dir of three repeats and checks the medians, the per-repeat ratios and the plot.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// 1000 records; Debezium: 10 s start to last, 5 s first to last; the relay 2 s / 1 s; repeat i scales time by i.
	for i := 1; i <= 3; i++ {
		for _, c := range []struct {
			name        string
			total, span float64
			cpu         float64
			rss         int64
		}{{"debezium", 10, 5, 4, 1 << 20}, {"relay", 2, 1, 0.5, 60 << 10}} {
			w := WaitResult{Records: 1000, StartUnix: 100, DoneUnix: 100 + c.total*float64(i), FirstUnix: 100 + c.total*float64(i) - c.span*float64(i),
				CPUFirst: c.cpu / 2, CPUDone: c.cpu, RSSPeakKB: c.rss}
			b, _ := json.Marshal(w)
			write(fmt.Sprintf("%s-%d-wait.json", c.name, i), string(b))
		}
	}
	write("debezium-1/worker.properties", "# comment\nbootstrap.servers=x\n")
	write("debezium-1/connector.properties", "slot.name=debezium_peer_1\ndatabase.password=secret\nmax.batch.size=8192\n")
	write("relay-1.cmd", "outbox-relay run --compat debezium\n")
	err := cmdReport([]string{"-run", dir, "-repeats", "3", "-first", "debezium,relay,debezium", "-events", "1000",
		"-aggregates", "10", "-txn", "100", "-load-start", "1", "-load-end", "2", "-elapsed", "1s"})
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "peer.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		// with startup: Debezium 1000/10, /20, /30 -> 33 / 50 / 100; the relay 167 / 250 / 500; ratio 5x every time
		"| events/s with startup | 33 / **50** / 100 | 167 / **250** / 500 | 5.00x |",
		"| events/s without startup | 67 / **100** / 200 | 333 / **500** / 1000 | 5.00x |",
		"| CPU us/event (whole process) | 4000.0 / **4000.0** / 4000.0 | 500.0 / **500.0** / 500.0 | 0.12x |",
		"| CPU us/event (first to last record) | 2000.0 / **2000.0** / 2000.0 | 250.0 / **250.0** / 250.0 | 0.12x |",
		"| peak RSS (MB) | 1024 / **1024** / 1024 | 60 / **60** / 60 | 0.059x |",
		"| 2 (first) | outbox-relay | 1000 | 4.0 | 250 |",
		"| 2 (second) | Debezium 3.6.1 + Connect 4.3.0 | 1000 | 20.0 | 50 |",
		"| 3 | 5.00 | 5.00 | 0.12 | 0.12 | 0.059 |",
		"max.batch.size=8192",
		"![Debezium vs outbox-relay](peer.png)",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("peer.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "secret") || strings.Contains(string(md), "# comment") {
		t.Errorf("peer.md has the password or a comment:\n%s", md)
	}
	png, err := os.ReadFile(filepath.Join(dir, "peer.png"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG")) || len(png) < 10000 {
		t.Errorf("peer.png is not a plot (%d bytes)", len(png))
	}
}

func TestLoaded(t *testing.T) {
	n := float64(runtime.NumCPU())
	for _, tc := range []struct {
		load string
		want bool
	}{
		{fmt.Sprintf("%.2f 0.10 0.10", n+0.5), true},
		{fmt.Sprintf("%.2f 99 99", n-0.5), false},
		{"", false},
		{"x", false},
	} {
		if got := loaded(tc.load); got != tc.want {
			t.Errorf("loaded(%q) = %v, want %v", tc.load, got, tc.want)
		}
	}
}
