// Package charts draws a benchmark's PNG charts with gonum.org/v1/plot:
// cumulative distributions of latencies, and figures against the offered
// request rate or the concurrency when a run sweeps them.
package charts

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Chart size: legible in a Markdown page at its natural size.
const (
	width  = 7 * vg.Inch
	height = 4.5 * vg.Inch
)

// Series is one named sample of values (milliseconds) for a CDF.
type Series struct {
	Label  string
	Values []float64
}

// finite drops NaN and infinite values, which no axis can place.
func finite(vs []float64) []float64 {
	out := make([]float64, 0, len(vs))
	for _, v := range vs {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			out = append(out, v)
		}
	}
	return out
}

// CDF writes to path (a .png) the empirical cumulative distribution of
// each series: the fraction of values at or below each x. The x axis is
// logarithmic when the values span more than a factor of 20.
func CDF(path, title, xLabel, yLabel string, series []Series) error {
	p := newPlot(title, xLabel, yLabel)
	lo, hi := math.Inf(1), math.Inf(-1)
	drawn := 0
	for i, s := range series {
		vs := finite(s.Values)
		if len(vs) == 0 {
			continue
		}
		slices.Sort(vs)
		lo, hi = min(lo, vs[0]), max(hi, vs[len(vs)-1])
		pts := make(plotter.XYs, 0, len(vs)+1)
		pts = append(pts, plotter.XY{X: vs[0], Y: 0})
		for j, v := range vs {
			pts = append(pts, plotter.XY{X: v, Y: float64(j+1) / float64(len(vs))})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("chart %s: %w", path, err)
		}
		l.StepStyle = plotter.PostStep
		l.LineStyle.Width = vg.Points(1.5)
		l.LineStyle.Color = plotutil.Color(i)
		l.LineStyle.Dashes = plotutil.Dashes(i)
		p.Add(l)
		p.Legend.Add(s.Label, l)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("chart %s: no values to draw", path)
	}
	p.Y.Min, p.Y.Max = 0, 1
	// Room on the right keeps the last steps clear of the legend, which
	// sits where a CDF has no line: bottom right.
	if lo > 0 && hi/lo > 20 {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.X.Min, p.X.Max = lo/1.2, hi*2
	} else {
		p.X.Min, p.X.Max = lo, hi+(hi-lo)*0.25
		if hi == lo {
			p.X.Min, p.X.Max = lo-1, hi+1
		}
	}
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(8), vg.Points(8)
	return save(p, path)
}

// Point is a figure at one setting of the swept variable.
type Point struct {
	// X is the request rate (requests/s) or the concurrency bound; +Inf
	// for requests sent all at once or no bound.
	X float64
	Y float64
}

// Curve is one named line of points.
type Curve struct {
	Label  string
	Points []Point
}

// RateLabel is how a rate or bound reads on the axis and in reports.
func RateLabel(x float64) string {
	if math.IsInf(x, 1) {
		return "inf"
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

// Sweep writes to path a chart of each curve against the swept variable.
// Its values sit at evenly spaced positions labelled with the values (inf
// last), since sweeps double the rate or the concurrency.
func Sweep(path, title, xLabel, yLabel string, curves []Curve) error {
	var xs []float64
	for _, c := range curves {
		for _, pt := range c.Points {
			if !slices.Contains(xs, pt.X) {
				xs = append(xs, pt.X)
			}
		}
	}
	if len(xs) == 0 {
		return fmt.Errorf("chart %s: no points to draw", path)
	}
	slices.Sort(xs)
	p := newPlot(title, xLabel, yLabel)
	ticks := make([]plot.Tick, len(xs))
	for i, x := range xs {
		ticks[i] = plot.Tick{Value: float64(i), Label: RateLabel(x)}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = -0.25, float64(len(xs)-1)+0.25
	p.Y.Min = 0
	top := 0.0
	for i, c := range curves {
		pts := make(plotter.XYs, 0, len(c.Points))
		for _, pt := range c.Points {
			if math.IsNaN(pt.Y) || math.IsInf(pt.Y, 0) {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(slices.Index(xs, pt.X)), Y: pt.Y})
			top = max(top, pt.Y)
		}
		if len(pts) == 0 {
			continue
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("chart %s: %w", path, err)
		}
		l.LineStyle.Width = vg.Points(1.5)
		l.LineStyle.Color = plotutil.Color(i)
		l.LineStyle.Dashes = plotutil.Dashes(i)
		s.GlyphStyle.Color = plotutil.Color(i)
		s.GlyphStyle.Shape = plotutil.Shape(i)
		s.GlyphStyle.Radius = vg.Points(3)
		p.Add(l, s)
		p.Legend.Add(c.Label, l, s)
	}
	// Headroom above the highest point keeps the legend (top left) clear
	// of the lines.
	if top > 0 {
		p.Y.Max = top * 1.2
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(10)
	return save(p, path)
}

func newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Add(plotter.NewGrid())
	p.Legend.ThumbnailWidth = vg.Points(28)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	return p
}

// save renders p; the plotting library panics on some degenerate inputs, so
// a panic becomes an error naming the chart.
func save(p *plot.Plot, path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("chart %s: drawing failed: %v", path, r)
		}
	}()
	if err := p.Save(width, height, path); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return nil
}
