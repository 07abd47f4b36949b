package main

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

var (
	colRecv  = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
	colRelay = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colQ     = []color.Color{
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // p50
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // p90
		color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // p99
		color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // p99.9
	}
	colCons = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
)

// rangeBars draws a min..max whisker on each bar of a bar chart (same
// nominal x and offset as the bars).
type rangeBars struct {
	lo, hi []float64
	offset vg.Length
	color  color.Color
}

func (r rangeBars) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	ls := draw.LineStyle{Color: r.color, Width: vg.Points(1.2)}
	capW := vg.Points(5)
	for i := range r.lo {
		if r.hi[i] <= 0 {
			continue
		}
		x := trX(float64(i)) + r.offset
		y0, y1 := trY(r.lo[i]), trY(r.hi[i])
		c.StrokeLine2(ls, x, y0, x, y1)
		c.StrokeLine2(ls, x-capW, y0, x+capW, y0)
		c.StrokeLine2(ls, x-capW, y1, x+capW, y1)
	}
}

var goalStyle = draw.LineStyle{Color: color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(4), vg.Points(2)}}

// goalMarks draws a dashed line across each relay bar at 0.8x the
// pg_recvlogical median: the drain target.
type goalMarks struct {
	at     []float64
	offset vg.Length
	half   vg.Length
}

func (g goalMarks) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	for i, v := range g.at {
		if v <= 0 {
			continue
		}
		x := trX(float64(i)) + g.offset
		c.StrokeLine2(goalStyle, x-g.half, trY(v), x+g.half, trY(v))
	}
}

// plotDrain draws median events/s of pg_recvlogical and the relay per shape,
// with min..max whiskers, and the median ratio above each pair.
func plotDrain(r *results, path string) error {
	p := plot.New()
	p.Title.Text = "Backlog drain: relay vs pg_recvlogical (median of the repeats, min..max)"
	p.Y.Label.Text = "events/s"
	p.Y.Min = 0
	w := vg.Points(40)
	var names []string
	var recMed, relMed plotter.Values
	var recR, relR rangeBars
	var groupMax []float64
	ymax := 0.0
	for _, d := range r.Drains {
		names = append(names, fmt.Sprintf("%s (%d events)", shapeName(d.PerTxn), d.Events))
		gm := 0.0
		for _, side := range []struct {
			tool string
			med  *plotter.Values
			rb   *rangeBars
		}{{"pg_recvlogical", &recMed, &recR}, {"relay", &relMed, &relR}} {
			var xs []float64
			for _, x := range d.runs(side.tool) {
				xs = append(xs, x.EventsPerS)
			}
			s := summarize(xs)
			if math.IsNaN(s.Med) {
				s = spread{0, 0, 0}
			}
			*side.med = append(*side.med, s.Med)
			side.rb.lo = append(side.rb.lo, s.Min)
			side.rb.hi = append(side.rb.hi, s.Max)
			gm = math.Max(gm, s.Max)
		}
		groupMax = append(groupMax, gm)
		ymax = math.Max(ymax, gm)
	}
	if len(names) == 0 {
		return fmt.Errorf("no drain results")
	}
	bRec, err := plotter.NewBarChart(recMed, w)
	if err != nil {
		return err
	}
	bRec.Color, bRec.LineStyle.Width, bRec.Offset = colRecv, 0, -w/2
	bRel, err := plotter.NewBarChart(relMed, w)
	if err != nil {
		return err
	}
	bRel.Color, bRel.LineStyle.Width, bRel.Offset = colRelay, 0, w/2
	recR.offset, recR.color = -w/2, color.Black
	relR.offset, relR.color = w/2, color.Black
	g := plotter.NewGrid()
	g.Vertical.Color = nil
	goals := goalMarks{offset: w / 2, half: w/2 + vg.Points(3)}
	for _, v := range recMed {
		goals.at = append(goals.at, 0.8*v)
	}
	p.Add(g, bRec, bRel, recR, relR, goals)
	// Ratio labels above each pair.
	var lx plotter.XYLabels
	for i, d := range r.Drains {
		m := summarize(d.ratios())
		if math.IsNaN(m.Med) {
			continue
		}
		lx.XYs = append(lx.XYs, plotter.XY{X: float64(i), Y: groupMax[i] + 0.04*ymax})
		lx.Labels = append(lx.Labels, fmt.Sprintf("relay/pg_recvlogical %.2fx", m.Med))
	}
	if len(lx.XYs) > 0 {
		labels, err := plotter.NewLabels(lx)
		if err != nil {
			return err
		}
		for i := range labels.TextStyle {
			labels.TextStyle[i].XAlign = draw.XCenter
		}
		p.Add(labels)
	}
	p.Y.Max = ymax * 1.35
	p.NominalX(names...)
	p.Legend.Add("pg_recvlogical (the walsender's ceiling)", bRec)
	p.Legend.Add("outbox-relay (until confirmed_flush_lsn, all acked)", bRel)
	thumb := plotter.NewFunction(func(float64) float64 { return math.NaN() }) // legend entry only
	thumb.LineStyle = goalStyle
	p.Legend.Add("target: relay >= 0.8x pg_recvlogical", thumb)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Legend.YOffs = -vg.Points(8)
	p.X.Min, p.X.Max = -0.7, float64(len(names))-0.3 // room for the labels
	return p.Save(7.5*vg.Inch, 4.5*vg.Inch, path)
}

// plotLatency draws commit->ack percentiles (the relay's histogram) and the
// consumer's p99 per transaction shape against the offered rate.
func plotLatency(r *results, path string) error {
	if r.Latency == nil {
		return fmt.Errorf("no latency results")
	}
	pl := plot.New()
	pl.Title.Text = fmt.Sprintf("Commit latency vs offered load (%s, %s per rate)", mixName(r.Scale.LatencyShapes), r.Scale.PhaseDur)
	pl.X.Label.Text = "offered events/s"
	pl.Y.Label.Text = "latency, ms (log)"
	pl.X.Scale, pl.Y.Scale = plot.LogScale{}, plot.LogScale{}
	pl.X.Tick.Marker = rateTicks{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	type series struct {
		name   string
		c      color.Color
		dashes []vg.Length
		xy     plotter.XYs
	}
	var ss []*series
	for q, n := range []string{"commit->ack p50", "commit->ack p90", "commit->ack p99", "commit->ack p99.9"} {
		ss = append(ss, &series{name: n, c: colQ[q]})
	}
	cons := map[int]*series{}
	for i, txn := range r.Scale.LatencyShapes {
		s := &series{name: "commit->consumer p99, " + shapeName(txn), c: colCons, dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
		if i > 0 {
			s.c = color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}
			s.dashes = []vg.Length{vg.Points(1.5), vg.Points(2)}
		}
		cons[txn] = s
		ss = append(ss, s)
	}
	var bad plotter.XYs
	lo, hi := math.Inf(1), 0.0
	for _, p := range r.Latency.Phases {
		if p.Err != "" || p.OneRow {
			continue
		}
		x := float64(p.Rate)
		lo, hi = math.Min(lo, x), math.Max(hi, x)
		for q := 0; q < 4; q++ {
			if v := p.AckQ[q]; !math.IsNaN(v) && !math.IsInf(v, 0) {
				ss[q].xy = append(ss[q].xy, plotter.XY{X: x, Y: math.Max(v*1000, 0.01)})
			}
		}
		for _, cs := range p.ByShape {
			if v := cs.Q[2]; !math.IsNaN(v) && cons[cs.Txn] != nil {
				cons[cs.Txn].xy = append(cons[cs.Txn].xy, plotter.XY{X: x, Y: math.Max(v, 0.01)})
			}
		}
		if p.RelayBehind && !math.IsNaN(p.AckQ[2]) && !math.IsInf(p.AckQ[2], 0) {
			bad = append(bad, plotter.XY{X: x, Y: math.Max(p.AckQ[2]*1000, 0.01)})
		}
	}
	drawn := 0
	for _, s := range ss {
		if len(s.xy) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(s.xy)
		if err != nil {
			return err
		}
		l.Color, pts.Color, l.Dashes = s.c, s.c, s.dashes
		pts.Shape = draw.CircleGlyph{}
		pl.Add(l, pts)
		pl.Legend.Add(s.name, l, pts)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("no latency measured") // a log axis needs data
	}
	var goals plotter.XYs
	for _, g := range latencyGoals {
		if r.phase(g.rate) != nil {
			goals = append(goals, plotter.XY{X: float64(g.rate), Y: g.limit * 1000})
		}
	}
	if len(goals) > 0 {
		sc, err := plotter.NewScatter(goals)
		if err != nil {
			return err
		}
		sc.Shape = draw.BoxGlyph{}
		sc.Radius = vg.Points(4)
		sc.Color = color.Black
		pl.Add(sc)
		pl.Legend.Add("p99 target", sc)
	}
	if len(bad) > 0 {
		sc, err := plotter.NewScatter(bad)
		if err != nil {
			return err
		}
		sc.Shape = draw.CrossGlyph{}
		sc.Radius = vg.Points(7)
		sc.Color = color.RGBA{R: 0xd6, A: 0xff}
		pl.Add(sc)
		pl.Legend.Add("relay not sustained", sc)
	}
	pl.X.Min, pl.X.Max = lo/1.25, hi*1.25
	ymax := 0.0
	for _, s := range ss {
		for _, xy := range s.xy {
			ymax = math.Max(ymax, xy.Y)
		}
	}
	pl.Y.Max = ymax * 20 // room for the legend above the data
	pl.Legend.Top = true
	pl.Legend.Left = true
	pl.Legend.XOffs = vg.Points(8)
	pl.Add(plotter.NewGrid())
	return pl.Save(8*vg.Inch, 5*vg.Inch, path)
}

// rateTicks labels the offered rates (1k, 5k, 20k...) on a log axis.
type rateTicks struct{}

func (rateTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for _, v := range []float64{100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000} {
		if v >= min*0.999 && v <= max*1.001 {
			label := fmt.Sprintf("%.0f", v)
			if v >= 1000 {
				label = fmt.Sprintf("%.0fk", v/1000)
			}
			ts = append(ts, plot.Tick{Value: v, Label: label})
		}
	}
	return ts
}
