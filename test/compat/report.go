package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// contender is one side of `make bench-peer`: its wait results are RUN/<file>-<repeat>-wait.json.
type contender struct {
	file, label string
	color       color.Color
}

var contenders = []contender{
	{"debezium", "Debezium 3.6.1 + Connect 4.3.0", color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}},
	{"relay", "outbox-relay", color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}},
}

// peerRun is what one drain of one contender measured (from its WaitResult).
type peerRun struct {
	Records     int64
	WithStart   float64 // events/s, process start to the last record
	NoStart     float64 // events/s, first record to the last
	Total, Span float64 // seconds: start to last, first to last
	CPUTotal    float64 // CPU seconds of the process, startup included
	CPUUS       float64 // CPU us per event, startup included
	CPUDrainUS  float64 // CPU us per event, only between the first and the last record
	RSSMB       float64 // peak RSS (VmHWM)
}

func loadPeerRun(path string) (peerRun, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return peerRun{}, err
	}
	var w WaitResult
	if err := json.Unmarshal(b, &w); err != nil {
		return peerRun{}, fmt.Errorf("%s: %w", path, err)
	}
	if w.Records <= 0 {
		return peerRun{}, fmt.Errorf("%s: no records", path)
	}
	n := float64(w.Records)
	r := peerRun{Records: w.Records, Total: w.DoneUnix - w.StartUnix, Span: w.DoneUnix - w.FirstUnix,
		CPUTotal: w.CPUDone, CPUUS: w.CPUDone / n * 1e6, CPUDrainUS: (w.CPUDone - w.CPUFirst) / n * 1e6,
		RSSMB: float64(w.RSSPeakKB) / 1024}
	r.WithStart, r.NoStart = math.NaN(), math.NaN()
	if r.Total > 0 {
		r.WithStart = n / r.Total
	}
	if r.Span > 0 {
		r.NoStart = n / r.Span
	}
	return r, nil
}

// spread3 is min / median / max of repeated measurements (NaN ignored; all NaN when there is none).
type spread3 struct{ Min, Med, Max float64 }

func spreadOf(xs []float64) spread3 {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return spread3{math.NaN(), math.NaN(), math.NaN()}
	}
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread3{v[0], med, v[len(v)-1]}
}

// peerMetric is one reported quantity of a run.
type peerMetric struct {
	name, unit, format string
	get                func(peerRun) float64
}

var peerMetrics = []peerMetric{
	{"events/s with startup", "events/s", "%.0f", func(r peerRun) float64 { return r.WithStart }},
	{"events/s without startup", "events/s", "%.0f", func(r peerRun) float64 { return r.NoStart }},
	{"CPU us/event (whole process)", "us", "%.1f", func(r peerRun) float64 { return r.CPUUS }},
	{"CPU us/event (first to last record)", "us", "%.1f", func(r peerRun) float64 { return r.CPUDrainUS }},
	{"peak RSS (MB)", "MB", "%.0f", func(r peerRun) float64 { return r.RSSMB }},
}

// peerResults holds runs[contender][repeat].
type peerResults struct {
	runs  [][]peerRun
	first []string // who drained first in each repeat
}

func (p *peerResults) values(c int, m peerMetric) []float64 {
	var xs []float64
	for _, r := range p.runs[c] {
		xs = append(xs, m.get(r))
	}
	return xs
}

// ratios is relay/Debezium of a metric per repeat.
func (p *peerResults) ratios(m peerMetric) []float64 {
	var xs []float64
	for i := range p.runs[0] {
		xs = append(xs, m.get(p.runs[1][i])/m.get(p.runs[0][i]))
	}
	return xs
}

// cmdReport reads the wait results of `make bench-peer`'s repeats and writes the report (Markdown) and the plot
// (PNG): per contender min/median/max of each metric, the relay/Debezium ratio per repeat, every setting.
func cmdReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	run := fs.String("run", "", "run dir of make bench-peer (required)")
	repeats := fs.Int("repeats", 0, "number of repeats (required)")
	first := fs.String("first", "", "who drained first in each repeat, comma-separated (debezium|relay)")
	events := fs.Int64("events", 0, "backlog events")
	aggs := fs.String("aggregates", "", "backlog aggregates")
	txn := fs.String("txn", "", "backlog rows per transaction")
	load0 := fs.String("load-start", "", "load average at the start")
	load1 := fs.String("load-end", "", "load average at the end")
	elapsed := fs.String("elapsed", "", "how long the whole run took so far")
	out := fs.String("out", "", "report file (default RUN/peer.md)")
	png := fs.String("png", "", "plot file (default RUN/peer.png); the report links it by its base name")
	_ = fs.Parse(args)
	if *run == "" || *repeats <= 0 {
		return fmt.Errorf("-run and -repeats are required")
	}
	if *out == "" {
		*out = filepath.Join(*run, "peer.md")
	}
	if *png == "" {
		*png = filepath.Join(*run, "peer.png")
	}
	p := &peerResults{runs: make([][]peerRun, len(contenders)), first: strings.Split(*first, ",")}
	for c, ct := range contenders {
		for i := 1; i <= *repeats; i++ {
			r, err := loadPeerRun(filepath.Join(*run, fmt.Sprintf("%s-%d-wait.json", ct.file, i)))
			if err != nil {
				return err
			}
			p.runs[c] = append(p.runs[c], r)
		}
	}
	if err := plotPeer(p, *events, *png); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## make bench-peer: Debezium 3.6.1.Final vs outbox-relay (compat: debezium)\n\n")
	fmt.Fprintf(&b, "Backlog: %d events (~200 B JSON payloads), %s aggregates, 5 types, %s rows per transaction, written once; "+
		"%d repeats, each contender draining the whole backlog once per repeat from a slot of its own created before the backlog, "+
		"one after the other (who goes first alternates: %s), topics (4 partitions) recreated empty before each drain, "+
		"each output verified by a real consumer (every event once, in order per key). Same PostgreSQL 15 and Kafka. "+
		"Machine: %d cores, load average %s at the start, %s at the end. Whole run: %s.\n\n",
		*events, *aggs, *txn, *repeats, strings.Join(p.first, ", "), runtime.NumCPU(), *load0, *load1, *elapsed)
	if loaded(*load0) || loaded(*load1) {
		fmt.Fprintf(&b, "**Loaded machine**: a 1-minute load average above the %d cores means other work shared the CPUs, "+
			"so both contenders' absolute rates are below an idle machine's; the per-repeat ratios suffer less.\n\n", runtime.NumCPU())
	}
	fmt.Fprintf(&b, "![Debezium vs outbox-relay](%s)\n\n", filepath.Base(*png))
	b.WriteString("Min / median / max over the repeats:\n\n| metric |")
	for _, ct := range contenders {
		fmt.Fprintf(&b, " %s |", ct.label)
	}
	b.WriteString(" relay/Debezium (median of the per-repeat ratios) |\n|---|---|---|---|\n")
	for _, m := range peerMetrics {
		fmt.Fprintf(&b, "| %s |", m.name)
		for c := range contenders {
			s := spreadOf(p.values(c, m))
			fmt.Fprintf(&b, " "+m.format+" / **"+m.format+"** / "+m.format+" |", s.Min, s.Med, s.Max)
		}
		fmt.Fprintf(&b, " %sx |\n", ratioText(spreadOf(p.ratios(m)).Med))
	}
	b.WriteString("\nEach drain:\n\n| repeat | contender | records | start to last record (s) | events/s with startup | first to last record (s) | events/s without startup | CPU total (s) | CPU us/event (whole) | CPU us/event (first to last) | peak RSS (MB) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i := 0; i < *repeats; i++ {
		order := []int{0, 1}
		if i < len(p.first) && p.first[i] == "relay" {
			order = []int{1, 0}
		}
		for k, c := range order {
			r := p.runs[c][i]
			fmt.Fprintf(&b, "| %d (%s) | %s | %d | %.1f | %.0f | %.1f | %.0f | %.1f | %.1f | %.1f | %.0f |\n", i+1,
				[]string{"first", "second"}[k], contenders[c].label, r.Records, r.Total, r.WithStart, r.Span, r.NoStart,
				r.CPUTotal, r.CPUUS, r.CPUDrainUS, r.RSSMB)
		}
	}
	b.WriteString("\nrelay/Debezium per repeat (events/s: above 1 means the relay is faster; CPU and RSS: below 1 means the relay uses less):\n\n| repeat |")
	for _, m := range peerMetrics {
		fmt.Fprintf(&b, " %s |", m.name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(peerMetrics)) + "\n")
	for i := 0; i < *repeats; i++ {
		fmt.Fprintf(&b, "| %d |", i+1)
		for _, m := range peerMetrics {
			fmt.Fprintf(&b, " %s |", ratioText(p.ratios(m)[i]))
		}
		b.WriteString("\n")
	}
	b.WriteString("\nWith startup: from the process's start (JVM and Connect worker, or the relay binary) to the last record in Kafka; " +
		"without: from the first record to the last. CPU: user+sys of the process from /proc (the whole process, or only between " +
		"the first and the last record), per event. Peak RSS: VmHWM when the last record arrived. Median of an even number of " +
		"repeats: the mean of the middle two. Times are read by polling Kafka's high-water marks every 50 ms, so a drain of " +
		"under a few seconds (a small backlog) has a coarse rate.\n\n")
	dbzDir := filepath.Join(*run, "debezium-1")
	worker, err := propsWithout(filepath.Join(dbzDir, "worker.properties"), "")
	if err != nil {
		return err
	}
	conn, err := propsWithout(filepath.Join(dbzDir, "connector.properties"), "database.password")
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "Debezium worker settings (repeat 1; the same in every repeat but for the offsets file):\n\n```\n%s```\n\n", worker)
	fmt.Fprintf(&b, "Debezium connector settings (repeat 1, password omitted; repeat N uses slot debezium_peer_N, publication debezium_peer_N_pub):\n\n```\n%s```\n\n", conn)
	cmd, err := os.ReadFile(filepath.Join(*run, "relay-1.cmd"))
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "Relay command line (repeat 1; repeat N uses slot relay_peer_N, publication relay_peer_N_pub; every other setting is its default, docs/configuration.md):\n\n```\n%s```\n", cmd)
	return os.WriteFile(*out, []byte(b.String()), 0o644)
}

// ratioText formats a ratio with two decimals, three below 0.1 (CPU and RSS ratios are small).
func ratioText(r float64) string {
	if math.Abs(r) < 0.1 {
		return strconv.FormatFloat(r, 'f', 3, 64)
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}

// loaded says whether a load average ("1.2 3.4 5.6") has its 1-minute figure above the number of cores.
func loaded(load string) bool {
	f := strings.Fields(load)
	if len(f) == 0 {
		return false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return err == nil && v > float64(runtime.NumCPU())
}

// propsWithout returns a properties file without comments and without the lines starting with skip.
func propsWithout(path, skip string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l == "" || strings.HasPrefix(l, "#") || (skip != "" && strings.HasPrefix(l, skip)) {
			continue
		}
		out.WriteString(l)
	}
	return out.String(), nil
}

// whiskers draws a min..max line with caps on each bar (same nominal x and offset as the bars).
type whiskers struct {
	lo, hi []float64
	offset vg.Length
}

func (w whiskers) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	ls := draw.LineStyle{Color: color.Black, Width: vg.Points(1.2)}
	capW := vg.Points(4)
	for i := range w.lo {
		if math.IsNaN(w.lo[i]) || math.IsNaN(w.hi[i]) {
			continue
		}
		x := trX(float64(i)) + w.offset
		y0, y1 := trY(w.lo[i]), trY(w.hi[i])
		c.StrokeLine2(ls, x, y0, x, y1)
		c.StrokeLine2(ls, x-capW, y0, x+capW, y0)
		c.StrokeLine2(ls, x-capW, y1, x+capW, y1)
	}
}

// plotPeer draws three panels side by side (events/s with and without startup, CPU us per event whole and
// first to last record, peak RSS): the median of each contender as a bar, min..max as a whisker, the median
// written above each bar.
func plotPeer(p *peerResults, events int64, path string) error {
	panels := []struct {
		title, ylabel string
		groups        []string
		metrics       []peerMetric
	}{
		{"Throughput", "events/s", []string{"with startup", "without startup"}, peerMetrics[0:2]},
		{"CPU per event", "CPU us/event", []string{"whole process", "first to last record"}, peerMetrics[2:4]},
		{"Memory", "peak RSS (MB)", []string{"VmHWM"}, peerMetrics[4:5]},
	}
	w := vg.Points(26)
	var row []*plot.Plot
	for _, pn := range panels {
		pl := plot.New()
		pl.Title.Text = pn.title
		pl.Y.Label.Text = pn.ylabel
		pl.Y.Min = 0
		g := plotter.NewGrid()
		g.Vertical.Color = nil
		pl.Add(g)
		ymax := 0.0
		var lb barLabels
		for c, ct := range contenders {
			off := w * vg.Length(float64(c)-0.5)
			var med plotter.Values
			var wh whiskers
			wh.offset = off
			for _, m := range pn.metrics {
				s := spreadOf(p.values(c, m))
				v := s.Med
				if math.IsNaN(v) {
					v = 0
				}
				med = append(med, v)
				wh.lo, wh.hi = append(wh.lo, s.Min), append(wh.hi, s.Max)
				if !math.IsNaN(s.Max) {
					ymax = math.Max(ymax, s.Max)
				}
			}
			bars, err := plotter.NewBarChart(med, w)
			if err != nil {
				return err
			}
			bars.Color, bars.LineStyle.Width, bars.Offset = ct.color, 0, off
			pl.Add(bars, wh)
			if len(row) == 0 {
				pl.Legend.Add(ct.label, bars)
			}
			for gi, m := range pn.metrics {
				s := spreadOf(p.values(c, m))
				if math.IsNaN(s.Med) {
					continue
				}
				lb.x = append(lb.x, float64(gi))
				lb.off = append(lb.off, off)
				lb.y = append(lb.y, s.Max)
				lb.text = append(lb.text, fmt.Sprintf(m.format, s.Med))
			}
		}
		lb.style = draw.TextStyle{Color: color.Black, Font: pl.Title.TextStyle.Font, Handler: pl.Title.TextStyle.Handler,
			XAlign: draw.XCenter, YAlign: draw.YBottom}
		lb.style.Font.Size = vg.Points(8)
		pl.Add(lb)
		pl.Y.Max = ymax * 1.3
		if len(row) == 0 {
			pl.Y.Max = ymax * 1.5 // room for the legend
		}
		if ymax == 0 {
			pl.Y.Max = 1
		}
		pl.NominalX(pn.groups...)
		pl.X.Min, pl.X.Max = -0.6, float64(len(pn.groups))-0.4
		pl.Legend.Top = true
		pl.Legend.Left = true
		pl.Legend.XOffs, pl.Legend.YOffs = vg.Points(6), -vg.Points(6)
		row = append(row, pl)
	}
	width, height := 11*vg.Inch, 4.6*vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	title := fmt.Sprintf("Debezium vs outbox-relay, %d-event backlog: median of %d repeats, whiskers min..max", events, len(p.runs[0]))
	top := draw.Canvas{Canvas: dc.Canvas, Rectangle: dc.Rectangle}
	top.FillText(draw.TextStyle{Color: color.Black, Font: row[0].Title.TextStyle.Font, Handler: row[0].Title.TextStyle.Handler,
		XAlign: draw.XCenter, YAlign: draw.YTop}, vg.Point{X: width / 2, Y: height - vg.Points(6)}, title)
	body := draw.Crop(dc, 0, 0, 0, -vg.Points(24))
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Points(18), PadY: vg.Points(6), PadTop: vg.Points(4),
		PadBottom: vg.Points(4), PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, body)
	for j, pl := range row {
		pl.Draw(canvases[0][j])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// barLabels writes each bar's median just above its whisker (x: group index plus the bar's offset).
type barLabels struct {
	x, y  []float64
	off   []vg.Length
	text  []string
	style draw.TextStyle
}

func (l barLabels) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	for i := range l.x {
		c.FillText(l.style, vg.Point{X: trX(l.x[i]) + l.off[i], Y: trY(l.y[i]) + vg.Points(2)}, l.text[i])
	}
}
