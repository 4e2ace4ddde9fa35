// Package gpu exports NVIDIA GPU gauges read through NVML: utilization,
// memory used and total, power and temperature per device, refreshed by a
// goroutine the service owns (Monitor.Run). Where NVML is absent (no driver,
// no GPU, or a build without cgo) it exports baton_gpu_available 0 and
// nothing else, and never calls NVML again: after a failed nvml.Init any
// other NVML call kills the process with an uncatchable symbol lookup error.
package gpu

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultRefresh is how often Run reads the devices unless told otherwise:
// NVML's own utilization sample period is about a second.
const DefaultRefresh = 5 * time.Second

// reading is one device's values at one refresh. A value NVML could not
// read (not supported by this device, say) is NaN and is not exported.
type reading struct {
	index       int
	name, uuid  string
	utilization float64 // fraction of the last sample period a kernel ran, 0-1
	memUsed     float64 // bytes
	memTotal    float64 // bytes
	power       float64 // watts
	temperature float64 // degrees Celsius
}

// source reads the devices. The NVML source is the only one outside tests.
type source interface {
	// open prepares the library; an error means no other method may be
	// called.
	open() error
	// read returns every device's values.
	read() ([]reading, error)
	// close releases the library; called once, only after open succeeded.
	close()
}

// Monitor is a Prometheus collector of GPU gauges. Create it with New,
// register it, and run Run on a goroutine of the service's own for as long
// as it serves.
type Monitor struct {
	src    source
	logger *slog.Logger

	mu        sync.Mutex
	available bool
	devices   []reading
	inUse     string // UUID of the GPU the service computes on, "" for none
}

// SetInUse names the GPU the service computes on by its UUID (with or
// without NVML's "GPU-" prefix; the CUDA driver and NVML number devices
// differently, a UUID is the same in both), or none with "". The gauge
// baton_gpu_in_use then says 1 for that device and 0 for the others.
func (m *Monitor) SetInUse(uuid string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inUse = strings.TrimPrefix(strings.ToLower(uuid), "gpu-")
}

// New returns a monitor of this machine's GPUs through NVML (or of none,
// in a build without cgo).
func New(logger *slog.Logger) *Monitor { return newMonitor(newNVML(), logger) }

func newMonitor(src source, logger *slog.Logger) *Monitor {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Monitor{src: src, logger: logger}
}

// Run opens NVML and refreshes the gauges every interval (DefaultRefresh
// when not positive) until ctx ends, then closes NVML. Without NVML it
// logs why once and returns at once: the gauges then say
// baton_gpu_available 0. Call it once.
func (m *Monitor) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultRefresh
	}
	if err := m.src.open(); err != nil {
		m.logger.Info("GPU gauges off", "reason", err.Error())
		return
	}
	defer m.src.close()
	m.refresh()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.set(false, nil)
			return
		case <-t.C:
			m.refresh()
		}
	}
}

// refresh reads the devices once. A failed read turns the gauges off until
// a read succeeds again; it is logged once per change, not per refresh.
func (m *Monitor) refresh() {
	devs, err := m.src.read()
	m.mu.Lock()
	was := m.available
	m.mu.Unlock()
	if err != nil {
		if was {
			m.logger.Warn("reading GPUs failed; GPU gauges off until it works again", "err", err)
		}
		m.set(false, nil)
		return
	}
	if !was {
		m.logger.Info("GPU gauges on", "devices", len(devs))
	}
	m.set(true, devs)
}

func (m *Monitor) set(available bool, devs []reading) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.available, m.devices = available, devs
}

var (
	gpuLabels     = []string{"gpu"}
	descAvailable = prometheus.NewDesc("baton_gpu_available",
		"1 while NVML reads this machine's GPUs, 0 where there is no NVML (no GPU, no driver, or a build without cgo) or reading failed.", nil, nil)
	descInfo = prometheus.NewDesc("baton_gpu_info",
		"Always 1 per GPU; labels name the device (gpu is its NVML index).", []string{"gpu", "name", "uuid"}, nil)
	descUtil = prometheus.NewDesc("baton_gpu_utilization_ratio",
		"Fraction of the last sample period (about 1 s) during which a kernel ran on the GPU, 0-1.", gpuLabels, nil)
	descMemUsed = prometheus.NewDesc("baton_gpu_memory_used_bytes",
		"GPU memory allocated, in bytes.", gpuLabels, nil)
	descMemTotal = prometheus.NewDesc("baton_gpu_memory_total_bytes",
		"GPU memory installed, in bytes.", gpuLabels, nil)
	descPower = prometheus.NewDesc("baton_gpu_power_watts",
		"GPU power draw, in watts.", gpuLabels, nil)
	descTemp = prometheus.NewDesc("baton_gpu_temperature_celsius",
		"GPU core temperature, in degrees Celsius.", gpuLabels, nil)
	descInUse = prometheus.NewDesc("baton_gpu_in_use",
		"1 for the GPU this service computes on (--device), 0 for the machine's other GPUs.", gpuLabels, nil)
)

// Describe implements prometheus.Collector.
func (m *Monitor) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAvailable, descInfo, descUtil, descMemUsed, descMemTotal, descPower, descTemp, descInUse} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the last refresh's values.
func (m *Monitor) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	available, devs, inUse := m.available, m.devices, m.inUse
	m.mu.Unlock()
	avail := 0.0
	if available {
		avail = 1
	}
	ch <- prometheus.MustNewConstMetric(descAvailable, prometheus.GaugeValue, avail)
	for _, d := range devs {
		gpu := strconv.Itoa(d.index)
		ch <- prometheus.MustNewConstMetric(descInfo, prometheus.GaugeValue, 1, gpu, d.name, d.uuid)
		used := 0.0
		if inUse != "" && strings.TrimPrefix(strings.ToLower(d.uuid), "gpu-") == inUse {
			used = 1
		}
		ch <- prometheus.MustNewConstMetric(descInUse, prometheus.GaugeValue, used, gpu)
		for _, g := range []struct {
			desc *prometheus.Desc
			v    float64
		}{{descUtil, d.utilization}, {descMemUsed, d.memUsed}, {descMemTotal, d.memTotal}, {descPower, d.power}, {descTemp, d.temperature}} {
			if !math.IsNaN(g.v) {
				ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, g.v, gpu)
			}
		}
	}
}
