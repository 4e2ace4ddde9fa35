//go:build cuda

package cuda

/*
#include <cuda.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/baton-serving/baton/kernels"
)

// KV pages leave and enter device memory on a copy stream of their own
// (ExportKV, ImportKV), through page-locked staging buffers, so that a PD
// transfer does not hold up the forward steps:
//
//   - Export records an event on the default stream, where the kernels
//     that wrote the page were issued, makes the copy stream wait for it,
//     and queues the device-to-host copy there. It then lets go of the
//     backend's lock and waits for the copy alone, while the scheduler goes
//     on issuing the next step's kernels to the default stream; the copy
//     engine and the SMs work side by side.
//   - Import fills a staging buffer, queues the host-to-device copy on the
//     copy stream, and makes the default stream wait for its event, so
//     that every kernel issued afterwards sees the page; it waits for the
//     copy before the staging buffer goes back to the pool.
//
// The copy stream is non-blocking (it does not synchronize with the legacy
// default stream): the events are the only ordering, and the emulated
// driver (emu/driver.cpp) runs such copies late to catch a missing one.

// staging is a page-locked host buffer and the two events that order one
// copy through it: ready, recorded on the default stream, and done, on the
// copy stream.
type staging struct {
	ptr         unsafe.Pointer
	size        int
	ready, done cu.Event
}

func (s *staging) bytes(n int) []byte { return unsafe.Slice((*byte)(s.ptr), n) }

// newCopyStream creates the copy stream, in the backend's context.
func (b *backend) newCopyStream() error {
	s, err := cu.MakeStream(cu.NonBlocking)
	if err != nil {
		return fmt.Errorf("kernels/cuda: creating the copy stream: %w", err)
	}
	b.copyStream = s
	return nil
}

// takeStaging returns a staging buffer of at least n bytes, from the pool
// or new; in the backend's context, under its lock.
func (b *backend) takeStaging(n int) (*staging, error) {
	b.stagingMu.Lock()
	for i, s := range b.stagingFree {
		if s.size >= n {
			last := len(b.stagingFree) - 1
			b.stagingFree[i] = b.stagingFree[last]
			b.stagingFree = b.stagingFree[:last]
			b.stagingMu.Unlock()
			return s, nil
		}
	}
	b.stagingMu.Unlock()
	var p unsafe.Pointer
	if r := C.cuMemAllocHost(&p, C.size_t(n)); r != C.CUDA_SUCCESS {
		return nil, fmt.Errorf("kernels/cuda: allocating %d bytes of page-locked staging: CUresult %d", n, int(r))
	}
	s := &staging{ptr: p, size: n}
	var err1, err2 error
	s.ready, err1 = cu.MakeEvent(cu.DisableTiming)
	// The waiter sleeps on done instead of spinning a core.
	s.done, err2 = cu.MakeEvent(cu.DisableTiming | cu.BlockingSyncEvent)
	if err := errors.Join(err1, err2); err != nil {
		b.freeStaging(s)
		return nil, fmt.Errorf("kernels/cuda: creating copy events: %w", err)
	}
	b.stagingMu.Lock()
	b.stagingAll = append(b.stagingAll, s)
	b.stagingMu.Unlock()
	return s, nil
}

func (b *backend) putStaging(s *staging) {
	b.stagingMu.Lock()
	b.stagingFree = append(b.stagingFree, s)
	b.stagingMu.Unlock()
}

// freeStaging releases one buffer and its events, in the context.
func (b *backend) freeStaging(s *staging) error {
	var errs []error
	for _, e := range []*cu.Event{&s.ready, &s.done} {
		if *e != (cu.Event{}) {
			errs = append(errs, cu.DestroyEvent(e))
		}
	}
	if s.ptr != nil {
		errs = append(errs, cu.MemFreeHost(s.ptr))
		s.ptr = nil
	}
	return errors.Join(errs...)
}

// closeCopies frees the staging buffers and the copy stream; Close calls
// it in the context once no copy is in flight.
func (b *backend) closeCopies() error {
	var errs []error
	b.stagingMu.Lock()
	all := b.stagingAll
	b.stagingAll, b.stagingFree = nil, nil
	b.stagingMu.Unlock()
	for _, s := range all {
		errs = append(errs, b.freeStaging(s))
	}
	if b.copyStream != (cu.Stream{}) {
		errs = append(errs, b.copyStream.Destroy())
	}
	return errors.Join(errs...)
}

// waitCopy waits, without the backend's lock, for the copy that recorded
// s.done; the copy was counted in b.copies, which it leaves.
func (b *backend) waitCopy(s *staging) error {
	defer b.copies.Done()
	return b.inContext(func() error {
		if err := s.done.Synchronize(); err != nil {
			return fmt.Errorf("kernels/cuda: waiting for a KV copy: %w", err)
		}
		return nil
	})
}

func (b *backend) ExportKV(dst []byte, kv kernels.KVCache, page, layer int) error {
	s, err := b.pageCopy(kv, page, layer, len(dst), false, nil)
	if err != nil {
		return err
	}
	copy(dst, s.bytes(len(dst)))
	b.putStaging(s)
	return nil
}

func (b *backend) ImportKV(kv kernels.KVCache, page, layer int, src []byte) error {
	s, err := b.pageCopy(kv, page, layer, len(src), true, src)
	if err != nil {
		return err
	}
	b.putStaging(s)
	return nil
}

// pageCopy copies one layer of a KV page (n bytes) through a staging
// buffer on the copy stream: to the device from src when in is set, else
// from it. It queues the copy after everything the default stream was
// given before (the kernels that wrote the page, or that last used a page
// reused from the free list); an import also orders everything the default
// stream is given afterwards after it. It then waits for the copy without
// the backend's lock and returns the staging buffer, which holds an
// export's bytes, for the caller to give back.
func (b *backend) pageCopy(kv kernels.KVCache, page, layer, n int, in bool, src []byte) (*staging, error) {
	what := "exporting"
	if in {
		what = "importing"
	}
	var s *staging
	err := b.do(func() error {
		c, err := b.kv(kv)
		if err != nil {
			return err
		}
		if err := kernels.CheckKVPageIO(c.l, c.pages, page, layer, n); err != nil {
			return err
		}
		if s, err = b.takeStaging(n); err != nil {
			return err
		}
		dev := c.a.ptr + cu.DevicePtr(int64(page)*int64(c.l.PageBytes())+int64(c.l.LayerOffset(layer)))
		steps := []func() error{
			func() error { return s.ready.Record(cu.Stream{}) },
			func() error { return b.copyStream.Wait(s.ready, 0) },
		}
		if in {
			copy(s.bytes(n), src)
			steps = append(steps,
				func() error { return cu.MemcpyHtoDAsync(dev, s.ptr, int64(n), b.copyStream) },
				func() error { return s.done.Record(b.copyStream) },
				func() error { return (cu.Stream{}).Wait(s.done, 0) })
		} else {
			steps = append(steps,
				func() error { return cu.MemcpyDtoHAsync(s.ptr, dev, int64(n), b.copyStream) },
				func() error { return s.done.Record(b.copyStream) })
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return fmt.Errorf("kernels/cuda: %s KV page %d layer %d: %w", what, page, layer, err)
			}
		}
		b.copies.Add(1)
		return nil
	})
	if err != nil {
		if s != nil {
			// The stream may still use it: wait for what was queued.
			b.quiesce(s)
		}
		return nil, err
	}
	if err := b.waitCopy(s); err != nil {
		b.putStaging(s)
		return nil, err
	}
	return s, nil
}

// quiesce returns a staging buffer after a failed copy, once the copy
// stream has finished with anything queued on it (a closed backend frees
// it with the rest).
func (b *backend) quiesce(s *staging) {
	if b.do(func() error { return b.copyStream.Synchronize() }) == nil {
		b.putStaging(s)
	}
}
