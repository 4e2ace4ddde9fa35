//go:build cgo && linux

package gpu

import (
	"context"
	"log/slog"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestNVMLSourceReadsMockDGX reads go-nvml's mock DGX A100 (eight A100
// 40GB). The mock leaves utilization, power and temperature unset, so the
// test supplies them; device 3 reports no power sensor, as some boards do.
func TestNVMLSourceReadsMockDGX(t *testing.T) {
	srv := dgxa100.New()
	for i, d := range srv.Devices {
		dev := d.(*dgxa100.Device)
		dev.MemoryInfo.Used = uint64(i) << 30
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i), Memory: 5}, nvml.SUCCESS
		}
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) {
			if i == 3 {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return 250_000 + uint32(i), nvml.SUCCESS // milliwatts
		}
		dev.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
			if s != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return 40 + uint32(i), nvml.SUCCESS
		}
	}
	src := &nvmlSource{lib: srv}
	if err := src.open(); err != nil {
		t.Fatal(err)
	}
	devs, err := src.read()
	if err != nil {
		t.Fatal(err)
	}
	src.close()
	if n := len(srv.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	for i, d := range devs {
		if d.index != i || !strings.Contains(d.name, "A100-SXM4-40GB") || !strings.HasPrefix(d.uuid, "GPU-") {
			t.Errorf("device %d: index %d name %q uuid %q", i, d.index, d.name, d.uuid)
		}
		wantPower := (250_000 + float64(i)) / 1000
		if i == 3 {
			wantPower = math.NaN()
		}
		checks := []struct {
			what      string
			got, want float64
		}{
			{"utilization", d.utilization, float64(10*i) / 100},
			{"memory used", d.memUsed, float64(uint64(i) << 30)},
			{"memory total", d.memTotal, 40960 << 20},
			{"power", d.power, wantPower},
			{"temperature", d.temperature, float64(40 + i)},
		}
		for _, c := range checks {
			if c.got != c.want && !(math.IsNaN(c.got) && math.IsNaN(c.want)) {
				t.Errorf("device %d %s = %v, want %v", i, c.what, c.got, c.want)
			}
		}
	}
}

// TestNVMLSourceFailedInitCallsNothingElse: after Init fails, nothing else
// may be called — on a real machine that call would kill the process. The
// bare mock panics on any call it was not given a function for.
func TestNVMLSourceFailedInitCallsNothingElse(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	m := newMonitor(&nvmlSource{lib: lib}, nil)
	m.Run(context.Background(), time.Millisecond) // returns at once
	m.refresh()                                   // a stray refresh must not reach the library either
	if n := len(lib.InitCalls()); n != 1 {
		t.Errorf("Init called %d times, want 1", n)
	}
	if v := testutil.ToFloat64(gaugeOnly{m, "baton_gpu_available"}); v != 0 {
		t.Errorf("baton_gpu_available = %v, want 0", v)
	}
}

// TestRealNVML runs the monitor on this machine's real NVML. Where there is
// none (CI, this project's build machines) Init fails and the monitor must
// say so cleanly; with BATON_EXPECT_GPU=1 (a GPU machine) it must read at
// least one device.
func TestRealNVML(t *testing.T) {
	var logs strings.Builder
	m := New(slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, 100*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			if os.Getenv("BATON_EXPECT_GPU") == "1" {
				t.Fatalf("no GPU gauges on a GPU machine: %s", logs.String())
			}
			if !strings.Contains(logs.String(), "GPU gauges off") {
				t.Errorf("no log line says why the GPU gauges are off: %q", logs.String())
			}
			if v := testutil.ToFloat64(gaugeOnly{m, "baton_gpu_available"}); v != 0 {
				t.Errorf("baton_gpu_available = %v without NVML", v)
			}
			t.Logf("no NVML here: %s", strings.TrimSpace(logs.String()))
			return
		default:
		}
		if testutil.ToFloat64(gaugeOnly{m, "baton_gpu_available"}) == 1 {
			m.mu.Lock()
			devs := m.devices
			m.mu.Unlock()
			if len(devs) == 0 {
				t.Fatal("NVML is available but lists no device")
			}
			for _, d := range devs {
				t.Logf("GPU %d %s %s: utilization %v, memory %v/%v bytes, power %v W, temperature %v C",
					d.index, d.name, d.uuid, d.utilization, d.memUsed, d.memTotal, d.power, d.temperature)
				if !(d.memTotal > 0) || d.memUsed > d.memTotal || d.utilization < 0 || d.utilization > 1 {
					t.Errorf("GPU %d: implausible reading %+v", d.index, d)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("NVML neither failed nor produced a reading within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
