package charts

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// checkPNG decodes path and checks that it is a chart-sized picture with
// something drawn on it.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b := img.Bounds()
	if b.Dx() < 400 || b.Dy() < 250 {
		t.Errorf("%s: %v, too small", path, b)
	}
	colours := map[[4]uint32]bool{}
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bl, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, bl, a}] = true
		}
	}
	if len(colours) < 4 {
		t.Errorf("%s: only %d colours: nothing drawn", path, len(colours))
	}
}

func TestCDF(t *testing.T) {
	dir := t.TempDir()
	linear := filepath.Join(dir, "linear.png")
	if err := CDF(linear, "TTFT", "ms", "fraction", []Series{
		{"a", []float64{3, 1, 2, 5, 4}}, {"b", []float64{2, 2.5, 3, math.NaN()}}, {"empty", nil},
	}); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, linear)
	logScale := filepath.Join(dir, "log.png")
	if err := CDF(logScale, "ITL", "ms", "fraction", []Series{{"wide", []float64{0.1, 1, 10, 100, 1000}}}); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, logScale)
	if err := CDF(filepath.Join(dir, "none.png"), "x", "x", "y", []Series{{"nan", []float64{math.NaN()}}}); err == nil {
		t.Error("a chart with nothing to draw: no error")
	}
	if err := CDF(filepath.Join(dir, "absent", "x.png"), "x", "x", "y", []Series{{"a", []float64{1}}}); err == nil {
		t.Error("writing into a missing directory: no error")
	}
}

func TestSweep(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rate.png")
	inf := math.Inf(1)
	if err := Sweep(path, "throughput", "offered request rate (requests/s)", "tokens/s", []Curve{
		{"pd", []Point{{4, 40}, {1, 10}, {2, 20}, {inf, 55}}},
		{"colocated", []Point{{1, 11}, {2, 22}, {inf, math.NaN()}}},
	}); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, path)
	if err := Sweep(filepath.Join(dir, "none.png"), "t", "x", "y", nil); err == nil {
		t.Error("no points: no error")
	}
}

func TestRateLabel(t *testing.T) {
	for rate, want := range map[float64]string{1: "1", 0.5: "0.5", 16: "16", math.Inf(1): "inf"} {
		if got := RateLabel(rate); got != want {
			t.Errorf("RateLabel(%v) = %q, want %q", rate, got, want)
		}
	}
}
