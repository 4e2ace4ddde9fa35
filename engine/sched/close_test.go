package sched

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/kernels/quant"
)

// hangModel is a fakeModel whose forward passes block, the way a hung
// kernel does, until release is closed. entered is closed when the first
// pass starts blocking.
type hangModel struct {
	*fakeModel
	entered chan struct{}
	release chan struct{}
}

func newHangModel() *hangModel {
	return &hangModel{fakeModel: newFakeModel(0), entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *hangModel) ForwardBatch(kv *kvcache.Pool, batch []model.Chunk) error {
	select {
	case <-h.entered:
	default:
		close(h.entered)
	}
	<-h.release
	return h.fakeModel.ForwardBatch(kv, batch)
}

// TestShutdownBoundedDuringHungStep: Shutdown returns at its context's end
// while a forward step hangs, saying so (ErrStepHung), instead of waiting
// for the step forever, so that a stopping service can exit. The request
// the step holds stays visible in the snapshot, and its one owner, the
// scheduler's goroutine, releases it and its pages when the step finally
// returns.
func TestShutdownBoundedDuringHungStep(t *testing.T) {
	hm := newHangModel()
	pool, err := kvcache.New(hm.cfg.KVLayout(2, quant.F32), 16)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Model: hm, Pool: pool, MaxBatchTokens: 4, AuditInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Submit(t.Context(), Request{ID: "held", Prompt: []int32{1, 2, 3}, MaxTokens: 4, Params: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-hm.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the forward pass never started")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- s.Shutdown(ctx) }()
	select {
	case err = <-returned:
	case <-time.After(20 * time.Second):
		close(hm.release) // let the test's goroutines end
		<-returned
		t.Fatal("Shutdown did not return at its context's end while a forward step hung")
	}
	if !errors.Is(err, ErrStepHung) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown during a hung step = %v; want ErrStepHung and the context's cause", err)
	}
	if _, err := s.Submit(t.Context(), Request{Prompt: []int32{1}, MaxTokens: 1, Params: greedy()}); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Shutdown = %v, want ErrClosed", err)
	}
	snap := s.Snapshot()
	if len(snap.Requests) != 1 || snap.Requests[0].ID != "held" || snap.StepRunning <= 0 || snap.Pages.Used == 0 {
		t.Errorf("snapshot while the step hangs: %+v; want request held with its pages, a step running", snap)
	}
	// A second, equally bounded call says the same.
	if err := s.Shutdown(ctx); !errors.Is(err, ErrStepHung) {
		t.Errorf("second Shutdown during the hang = %v, want ErrStepHung", err)
	}

	close(hm.release)
	res := collect(t, st, 30*time.Second)
	if res.done.Finish != FinishAborted || !errors.Is(res.done.Err, ErrClosed) {
		t.Errorf("request held by the hung step ended %s (%v), want aborted with ErrClosed", res.done.Finish, res.done.Err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close after the step returned: %v", err)
	}
	if u := pool.Stats().Used; u != 0 {
		t.Errorf("%d pages still used after the hung step returned and the scheduler exited", u)
	}
}
