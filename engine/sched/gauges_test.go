package sched

import (
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/kernels/quant"
)

// lastGauges keeps the Gauges the scheduler published last.
type lastGauges struct {
	NopObserver
	mu sync.Mutex
	g  Gauges
	n  int
}

func (o *lastGauges) Gauges(g Gauges) {
	o.mu.Lock()
	o.g, o.n = g, o.n+1
	o.mu.Unlock()
}

func (o *lastGauges) get() (Gauges, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.g, o.n
}

// TestGaugesDuringHungStep: while a forward step hangs, the published
// gauges count the requests the scheduler holds, as its Snapshot (the
// worker's /debug/requests) lists them. The step's own commands — here
// the activation that starts the request it computes — change the counts
// before its forward pass; gauges published only at a step's end would
// keep the previous step's counts for as long as the step hangs (the
// chaos suite's frozen decode showed num_decode_transfer_queue_reqs at 2
// while it listed one transferring request, and diagnose called the
// counter out of step).
func TestGaugesDuringHungStep(t *testing.T) {
	hm := newHangModel()
	pool, err := kvcache.New(hm.cfg.KVLayout(2, quant.F32), 16)
	if err != nil {
		t.Fatal(err)
	}
	obs := &lastGauges{}
	s := newSched(t, Config{Model: hm, Pool: pool, Observer: obs, MaxBatchTokens: 4})
	t.Cleanup(func() { close(hm.release) }) // before Close (cleanups run last first)

	reserved := func(st *Stream) {
		t.Helper()
		select {
		case ev := <-st.Events():
			if ev.Kind != EventReserved {
				t.Fatalf("request %s: first event %v, want reserved", st.ID(), ev.Kind)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request %s: pages not reserved", st.ID())
		}
	}
	var streams []*Stream
	for _, id := range []string{"a", "b"} {
		st, err := s.Submit(t.Context(), Request{ID: id, Mode: ModeDecodeImported, Prompt: []int32{1, 2, 3}, MaxTokens: 4, Params: greedy()})
		if err != nil {
			t.Fatal(err)
		}
		reserved(st)
		streams = append(streams, st)
	}
	// Both reserved: the step that admitted the second published after it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if g, _ := obs.get(); g.Transferring == 2 {
			break
		}
		if time.Now().After(deadline) {
			g, _ := obs.get()
			t.Fatalf("published gauges %+v after both reservations, want 2 transferring", g)
		}
	}

	// a's prompt arrived: the step activates it and hangs decoding it.
	if err := streams[0].Activate(sample.Token{ID: 4}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hm.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no forward step started after the activation")
	}
	snap := s.Snapshot()
	if snap.StepRunning == 0 || snap.Gauges.Running != 1 || snap.Gauges.Transferring != 1 {
		t.Fatalf("snapshot during the hung step: step running %v, gauges %+v; want a step running, 1 running, 1 transferring",
			snap.StepRunning, snap.Gauges)
	}
	g, _ := obs.get()
	if g.Running != snap.Gauges.Running || g.Transferring != snap.Gauges.Transferring ||
		g.Waiting != snap.Gauges.Waiting || g.Prealloc != snap.Gauges.Prealloc || g.PagesUsed != snap.Gauges.PagesUsed {
		t.Errorf("published gauges during the hung step: %d running, %d transferring, %d pages used; "+
			"the scheduler holds %d running, %d transferring, %d pages used",
			g.Running, g.Transferring, g.PagesUsed, snap.Gauges.Running, snap.Gauges.Transferring, snap.Gauges.PagesUsed)
	}
}
