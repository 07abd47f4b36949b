package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var colRef = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}

// plotCurves draws the curves part as one PNG of six panels: payload MB/s
// (relay and the plain producer), payload events/s, topics and aggregates
// (peak RSS, goroutines), the big transaction and the round-trip drains.
func plotCurves(c *curvesResult, path string) error {
	line := func(title, xl, yl string, logX bool, series ...curveSeries) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = xl
		p.Y.Label.Text = yl
		p.Y.Min = 0
		p.Legend.Top = true
		for _, s := range series {
			var xy plotter.XYs
			for i, x := range s.x {
				if !math.IsNaN(s.y[i]) && x > 0 {
					xy = append(xy, plotter.XY{X: x, Y: s.y[i]})
				}
			}
			if len(xy) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				continue
			}
			l.Color, pts.Color = s.col, s.col
			if s.dashed {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			p.Add(l, pts)
			p.Legend.Add(s.name, l, pts)
			if logX { // only with data: a log axis of nothing panics
				p.X.Scale = plot.LogScale{}
				p.X.Tick.Marker = plot.LogTicks{Prec: -1}
			}
		}
		return p
	}
	get := func(f string, y func(*curvePoint) float64) (xs, ys []float64) {
		for _, p := range c.family(f) {
			v := math.NaN()
			if p.Err == "" {
				v = y(p)
			}
			xs, ys = append(xs, p.X), append(ys, v)
		}
		return
	}
	mib := func(p *curvePoint) float64 { return float64(p.PeakRSS) / (1 << 20) }
	ser := func(name string, col color.Color, dashed bool, f string, y func(*curvePoint) float64) curveSeries {
		xs, ys := get(f, y)
		return curveSeries{name: name, col: col, dashed: dashed, x: xs, y: ys}
	}
	p1 := line("Payload size: MB/s (same payload bytes per point)", "payload bytes per event", "MB/s", true,
		ser("relay", colRelay, false, "payload", func(p *curvePoint) float64 { return p.MBPerS }),
		ser("plain sarama producer (broker ingest)", colRef, true, "payload", func(p *curvePoint) float64 { return p.RefMBPerS }))
	p2 := line("Payload size: events/s", "payload bytes per event", "events/s", true,
		ser("relay", colRelay, false, "payload", func(p *curvePoint) float64 { return p.EvPerS }),
		ser("plain sarama producer", colRef, true, "payload", func(p *curvePoint) float64 { return p.RefEvPerS }))
	p3 := line("Distinct topics", "topics", "MiB / count / k events/s", true,
		ser("relay peak RSS MiB", colRelay, false, "topics", mib),
		ser("goroutines (max)", colQ[2], false, "topics", func(p *curvePoint) float64 { return p.Goroutines }),
		ser("k events/s", colQ[0], true, "topics", func(p *curvePoint) float64 { return p.EvPerS / 1000 }))
	p4 := line("Distinct aggregates (key space)", "aggregate_id key space", "MiB / k events/s", true,
		ser("relay peak RSS MiB", colRelay, false, "aggregates", mib),
		ser("k events/s", colQ[0], true, "aggregates", func(p *curvePoint) float64 { return p.EvPerS / 1000 }))
	p5 := bars("One large transaction: relay start -> ack (s)", c.family("bigtxn"), func(p *curvePoint) []float64 {
		return []float64{p.FirstS, p.Seconds}
	}, []string{"first ack", "all acked"})
	p6 := bars("100 rows/txn drain with added round trip (events/s)", c.family("rtt"), func(p *curvePoint) []float64 {
		return []float64{p.EvPerS}
	}, []string{"events/s"})
	rows, cols := 3, 2
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	plots := [][]*plot.Plot{{p1, p2}, {p3, p4}, {p5, p6}}
	img := vgimg.New(vg.Points(1100), vg.Points(1150))
	dc := draw.New(img)
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
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

type curveSeries struct {
	name   string
	col    color.Color
	dashed bool
	x, y   []float64
}

// bars draws one group of bars per point (its label on the x axis).
func bars(title string, pts []*curvePoint, vals func(*curvePoint) []float64, names []string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Min = 0
	p.Legend.Top = true
	var labels []string
	for _, pt := range pts {
		labels = append(labels, strings.ReplaceAll(pt.Label, " via proxy ", "\n"))
	}
	w := vg.Points(18)
	for k, name := range names {
		var v plotter.Values
		for _, pt := range pts {
			x := 0.0
			if pt.Err == "" {
				x = vals(pt)[k]
			}
			if math.IsNaN(x) {
				x = 0
			}
			v = append(v, x)
		}
		if len(v) == 0 {
			continue
		}
		b, err := plotter.NewBarChart(v, w)
		if err != nil {
			continue
		}
		b.Color = colQ[k%len(colQ)]
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(k)-float64(len(names)-1)/2)
		p.Add(b)
		p.Legend.Add(name, b)
	}
	if len(labels) > 0 {
		p.NominalX(labels...)
	}
	if len(pts) == 1 {
		pt := pts[0]
		p.Title.Text += fmt.Sprintf("\n%s, peak RSS %d MiB", pt.Label, pt.PeakRSS>>20)
	}
	return p
}
