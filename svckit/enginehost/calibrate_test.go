package enginehost

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sched"
)

// TestCalibrationWarm: calibration records the warm pass, so a model whose
// first pass is cold (its weights faulting in) is measured at its warm
// speed, not at a speed that would give the first steps bounds of hours.
func TestCalibrationWarm(t *testing.T) {
	h, _ := openTestHost(t)
	m := &coldModel{Model: h.Model, cold: time.Second} // ≥ 31 ms a token if measured cold
	var s stepSpeed
	if err := s.calibrate(context.Background(), m, h.Pool, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := s.expect(1); got > 15*time.Millisecond {
		t.Errorf("calibrated at %v a token with a 1 s cold first pass; want the warm speed", got)
	}
}

// coldModel is the real model with a slow first forward pass, as when its
// weights fault in.
type coldModel struct {
	sched.Model
	cold   time.Duration
	passes int
}

func (m *coldModel) ForwardBatch(kv *kvcache.Pool, batch []model.Chunk) error {
	if m.passes++; m.passes == 1 {
		time.Sleep(m.cold)
	}
	return m.Model.ForwardBatch(kv, batch)
}

// TestCalibrationHangs: a forward pass that never returns at Open fails
// calibration within its timeout, naming what hung, instead of blocking
// Open (and SIGTERM) forever.
func TestCalibrationHangs(t *testing.T) {
	h, _ := openTestHost(t)
	block := make(chan struct{})
	defer func() {
		// The abandoned pass returns and releases its page before the
		// host closes.
		close(block)
		for deadline := time.Now().Add(10 * time.Second); h.Pool.Stats().Used != 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	var s stepSpeed
	start := time.Now()
	err := s.calibrate(context.Background(), blockingModel{h.Model, block}, h.Pool, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "forward pass") || !strings.Contains(err.Error(), "did not return") {
		t.Fatalf("calibrate with a hung forward pass = %v; want an error naming the hung pass", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("calibrate took %v with a 200 ms timeout", d)
	}
}

// blockingModel's forward pass blocks until block is closed, as a hung
// kernel would.
type blockingModel struct {
	sched.Model
	block chan struct{}
}

func (m blockingModel) ForwardBatch(kv *kvcache.Pool, batch []model.Chunk) error {
	<-m.block
	return m.Model.ForwardBatch(kv, batch)
}
