package gpu

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeSource serves scripted readings and counts the calls.
type fakeSource struct {
	mu      sync.Mutex
	openErr error
	reads   []fakeRead // one per read; the last repeats
	opened  int
	closed  int
	n       int
}

type fakeRead struct {
	devs []reading
	err  error
}

func (f *fakeSource) open() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened++
	return f.openErr
}

func (f *fakeSource) read() ([]reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.reads[min(f.n, len(f.reads)-1)]
	f.n++
	return r.devs, r.err
}

func (f *fakeSource) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
}

func TestMonitorExportsReadings(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name string
		read fakeRead
		want string
	}{
		{
			name: "two devices, one without a power sensor",
			read: fakeRead{devs: []reading{
				{index: 0, name: "GPU A", uuid: "GPU-a", utilization: 0.75, memUsed: 1 << 30, memTotal: 80 << 30, power: 312.5, temperature: 61},
				{index: 1, name: "GPU B", uuid: "GPU-b", utilization: 0, memUsed: 0, memTotal: 80 << 30, power: nan, temperature: 35},
			}},
			want: `
# HELP baton_gpu_available 1 while NVML reads this machine's GPUs, 0 where there is no NVML (no GPU, no driver, or a build without cgo) or reading failed.
# TYPE baton_gpu_available gauge
baton_gpu_available 1
# HELP baton_gpu_power_watts GPU power draw, in watts.
# TYPE baton_gpu_power_watts gauge
baton_gpu_power_watts{gpu="0"} 312.5
# HELP baton_gpu_utilization_ratio Fraction of the last sample period (about 1 s) during which a kernel ran on the GPU, 0-1.
# TYPE baton_gpu_utilization_ratio gauge
baton_gpu_utilization_ratio{gpu="0"} 0.75
baton_gpu_utilization_ratio{gpu="1"} 0
# HELP baton_gpu_temperature_celsius GPU core temperature, in degrees Celsius.
# TYPE baton_gpu_temperature_celsius gauge
baton_gpu_temperature_celsius{gpu="0"} 61
baton_gpu_temperature_celsius{gpu="1"} 35
# HELP baton_gpu_info Always 1 per GPU; labels name the device (gpu is its NVML index).
# TYPE baton_gpu_info gauge
baton_gpu_info{gpu="0",name="GPU A",uuid="GPU-a"} 1
baton_gpu_info{gpu="1",name="GPU B",uuid="GPU-b"} 1
`,
		},
		{
			name: "read fails",
			read: fakeRead{err: errors.New("GPU is lost")},
			want: `
# HELP baton_gpu_available 1 while NVML reads this machine's GPUs, 0 where there is no NVML (no GPU, no driver, or a build without cgo) or reading failed.
# TYPE baton_gpu_available gauge
baton_gpu_available 0
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMonitor(&fakeSource{reads: []fakeRead{tt.read}}, nil)
			m.refresh()
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(m)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tt.want),
				"baton_gpu_available", "baton_gpu_power_watts", "baton_gpu_utilization_ratio",
				"baton_gpu_temperature_celsius", "baton_gpu_info"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestMonitorInUse: baton_gpu_in_use marks the device named by the CUDA
// driver's UUID (no "GPU-" prefix, any case) among NVML's.
func TestMonitorInUse(t *testing.T) {
	devs := []reading{
		{index: 0, name: "GPU A", uuid: "GPU-0a1b", utilization: 0, memTotal: 1, power: math.NaN(), temperature: math.NaN()},
		{index: 1, name: "GPU B", uuid: "GPU-2c3d", utilization: 0, memTotal: 1, power: math.NaN(), temperature: math.NaN()},
	}
	for _, tt := range []struct{ uuid, want string }{
		{"", `baton_gpu_in_use{gpu="0"} 0
baton_gpu_in_use{gpu="1"} 0
`},
		{"2C3D", `baton_gpu_in_use{gpu="0"} 0
baton_gpu_in_use{gpu="1"} 1
`},
		{"GPU-0a1b", `baton_gpu_in_use{gpu="0"} 1
baton_gpu_in_use{gpu="1"} 0
`},
	} {
		m := newMonitor(&fakeSource{reads: []fakeRead{{devs: devs}}}, nil)
		m.SetInUse(tt.uuid)
		m.refresh()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		want := "# HELP baton_gpu_in_use 1 for the GPU this service computes on (--device), 0 for the machine's other GPUs.\n# TYPE baton_gpu_in_use gauge\n" + tt.want
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "baton_gpu_in_use"); err != nil {
			t.Errorf("SetInUse(%q): %v", tt.uuid, err)
		}
	}
}

// TestMonitorWithoutNVML: a failed open leaves the gauge at 0, and the
// source is never used again (with NVML, any call after a failed Init
// kills the process).
func TestMonitorWithoutNVML(t *testing.T) {
	src := &fakeSource{openErr: errors.New("NVML: ERROR_LIBRARY_NOT_FOUND")}
	m := newMonitor(src, nil)
	done := make(chan struct{})
	go func() { m.Run(context.Background(), time.Millisecond); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run kept going without NVML")
	}
	if src.n != 0 || src.closed != 0 {
		t.Errorf("after a failed open: %d reads, %d closes; want none", src.n, src.closed)
	}
	if v := testutil.ToFloat64(gaugeOnly{m, "baton_gpu_available"}); v != 0 {
		t.Errorf("baton_gpu_available = %v, want 0", v)
	}
}

// TestMonitorRunStops: Run refreshes until its context ends, recovers after
// a failed read, then closes the source and turns the gauges off.
func TestMonitorRunStops(t *testing.T) {
	dev := []reading{{index: 0, name: "G", uuid: "u", utilization: 0.5, memUsed: 1, memTotal: 2, power: 3, temperature: 4}}
	src := &fakeSource{reads: []fakeRead{{devs: dev}, {err: errors.New("transient")}, {devs: dev}}}
	m := newMonitor(src, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, time.Millisecond); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		src.mu.Lock()
		n := src.n
		src.mu.Unlock()
		if n >= 3 && testutil.ToFloat64(gaugeOnly{m, "baton_gpu_available"}) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d reads the monitor is not back on", n)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if src.opened != 1 || src.closed != 1 {
		t.Errorf("opened %d, closed %d; want 1 and 1", src.opened, src.closed)
	}
	if v := testutil.ToFloat64(gaugeOnly{m, "baton_gpu_available"}); v != 0 {
		t.Errorf("baton_gpu_available = %v after Run returned, want 0", v)
	}
}

// gaugeOnly narrows a monitor to one metric family for testutil.ToFloat64.
type gaugeOnly struct {
	m    *Monitor
	name string
}

func (g gaugeOnly) Describe(ch chan<- *prometheus.Desc) { g.m.Describe(ch) }

func (g gaugeOnly) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() { g.m.Collect(all); close(all) }()
	for m := range all {
		if strings.Contains(m.Desc().String(), `"`+g.name+`"`) {
			ch <- m
		}
	}
}
