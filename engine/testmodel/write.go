package testmodel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"unsafe"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels/quant"
)

// tensor is one tensor of the file to write.
type tensor struct {
	name       string
	typ        quant.Type
	rows, cols int  // rows of cols elements; vectors have rows == 1
	vector     bool // 1-D
	ones       bool // filled with 1.0 (norm weights) instead of noise
	factors    bool // filled with exp(|N(0, 1)|) (longrope factors)
	// values, when not nil, are the tensor's contents (computed, not
	// random: rope_freqs.weight).
	values []float32
	std    float64 // of the noise: Spec.roleStd
}

func (t tensor) dims() []uint64 {
	if t.vector {
		return []uint64{uint64(t.cols)}
	}
	return []uint64{uint64(t.cols), uint64(t.rows)}
}

func (t tensor) size() (uint64, error) {
	rb, err := quant.RowBytes(t.typ, uint64(t.cols))
	return rb * uint64(t.rows), err
}

// tensors lists the file's tensors from the architecture's table, in
// llama.cpp's order (global tensors before the blocks', the output ones
// after them): every required tensor, and output.weight unless s is tied.
// Matrices are stored in s.Type, vectors (norms, biases) in F32.
func (s Spec) tensors(a *arch.Arch) []tensor {
	c := s.Config(a)
	var head, tail, ts []tensor
	add := func(dst *[]tensor, t arch.Tensor, name string) {
		r := t.Parts[0].Role
		llama3 := r == arch.RopeFreqs && s.Llama3Rope.enabled()
		longrope := (r == arch.RopeLong || r == arch.RopeShort) && s.LongRope
		if t.Optional && !(r == arch.Output && !s.Tied) && !llama3 && !longrope {
			return
		}
		w := tensor{name: name, typ: s.Type, rows: t.Rows(c), cols: t.Cols(c), vector: t.Vector, ones: t.Init == arch.Ones, factors: t.Init == arch.Factors, std: s.roleStd(r)}
		if llama3 {
			w.values = s.Llama3Rope.Factors(c.HeadDim, float64(c.RopeBase))
		}
		if t.Vector {
			w.typ = quant.F32
		}
		*dst = append(*dst, w)
	}
	for _, t := range a.Tensors {
		if t.PerLayer() {
			continue
		}
		if t.Parts[0].Role == arch.TokEmbd {
			add(&head, t, t.Name)
		} else {
			add(&tail, t, t.Name)
		}
	}
	ts = head
	for l := range s.Layers {
		for _, t := range a.Tensors {
			if t.PerLayer() {
				add(&ts, t, t.NameAt(l))
			}
		}
	}
	return append(ts, tail...)
}

// Write writes the model described by s to path. See WriteProgress.
func Write(path string, s Spec) error { return WriteProgress(context.Background(), path, s, nil) }

// WriteProgress writes the model described by s to path, calling progress
// (when not nil) with the bytes of tensor data written so far and the total
// after each block of rows (from several goroutines, one call at a time).
// The file appears at path only when complete: it is written to a temporary
// file in the same directory and renamed.
//
// How it streams: the metadata and tensor layout are written by
// gguf.Writer, whose tensors all point at one shared zero buffer; zero
// chunks are skipped (seeked over), leaving a sparse file with a valid
// header. The file is then reopened to read where each tensor's data lies,
// and the weights are generated and written there block by block, so memory
// stays at one tensor's worth of zeros (untouched, so never resident) plus a
// few row blocks.
//
// Cancelling ctx stops the writing and removes the temporary file; the error
// then wraps ctx.Err().
func WriteProgress(ctx context.Context, path string, s Spec, progress func(done, total int64)) (err error) {
	if err := s.Validate(); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	a, err := s.Architecture()
	if err != nil {
		return err
	}
	ts := s.tensors(a)
	if err := writeLayout(tmp, s, a, ts); err != nil {
		return err
	}
	offsets, err := tensorOffsets(tmp.Name(), ts)
	if err != nil {
		return err
	}
	if err := writeWeights(ctx, tmp, s, ts, offsets, progress); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	return nil
}

// writeLayout writes the header, metadata and tensor infos, with the data
// regions left as holes.
func writeLayout(f *os.File, s Spec, a *arch.Arch, ts []tensor) error {
	w := gguf.NewWriter()
	name := fmt.Sprintf("baton-testmodel %s %dx%d-%s", a.Name, s.Layers, s.Dim, s.Type)
	// llama files keep the name they had before architectures. phi3's
	// leaves the architecture out: llama.cpp c392e50 gives Phi-3's special
	// tokens their attributes when general.name contains "phi3", and fails
	// to load a vocabulary without Phi-3's "<|endoftext|>", as the
	// synthetic one is.
	if a.Name == "llama" || a.Name == "phi3" {
		name = fmt.Sprintf("baton-testmodel %dx%d-%s", s.Layers, s.Dim, s.Type)
	}
	kvs := []arch.KV{
		{Key: "general.architecture", Value: a.Name},
		{Key: "general.name", Value: name},
	}
	kvs = append(kvs, arch.Keys(a, s.Config(a))...)
	for _, kv := range s.tokenizerKVs() {
		kvs = append(kvs, arch.KV{Key: kv.Key, Value: kv.Value})
	}
	for _, kv := range kvs {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			return fmt.Errorf("testmodel: %w", err)
		}
	}
	var biggest uint64
	for _, t := range ts {
		n, err := t.size()
		if err != nil {
			return fmt.Errorf("testmodel: tensor %s: %w", t.name, err)
		}
		biggest = max(biggest, n)
	}
	zeros := make([]byte, biggest)
	for _, t := range ts {
		n, _ := t.size()
		if err := w.AddTensor(t.name, t.typ, t.dims(), zeros[:n]); err != nil {
			return fmt.Errorf("testmodel: %w", err)
		}
	}
	sw := &sparseWriter{f: f, zeros: zeros}
	if _, err := w.WriteTo(sw); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	if err := f.Truncate(sw.off); err != nil {
		return fmt.Errorf("testmodel: %w", err)
	}
	return nil
}

// sparseWriter writes to f at increasing offsets, seeking over chunks that
// are all zero instead of writing them. Slices of zeros (the tensors' data,
// which gguf.Writer hands over unbuffered when large) are known to be zero
// and skipped without reading them: scanning gigabytes of a big preset's
// zeros took minutes.
type sparseWriter struct {
	f     *os.File
	off   int64
	zeros []byte
}

func (w *sparseWriter) Write(p []byte) (int, error) {
	total := len(p)
	if w.within(p) {
		w.off += int64(total)
		return total, nil
	}
	for len(p) > 0 {
		n := min(len(p), 1<<20)
		chunk := p[:n]
		if !allZero(chunk) {
			if _, err := w.f.WriteAt(chunk, w.off); err != nil {
				return 0, err
			}
		}
		w.off += int64(n)
		p = p[n:]
	}
	return total, nil
}

// within reports whether p lies inside w.zeros' memory.
func (w *sparseWriter) within(p []byte) bool {
	if len(p) == 0 || len(w.zeros) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(w.zeros)))
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	return start >= base && start-base+uintptr(len(p)) <= uintptr(len(w.zeros))
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// tensorOffsets parses the header just written and returns the absolute data
// offset of each tensor, checking that the layout is what was asked for.
func tensorOffsets(path string, ts []tensor) ([]int64, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("testmodel: reading back the layout: %w", err)
	}
	defer f.Close()
	offs := make([]int64, len(ts))
	for i, t := range ts {
		info, ok := f.Tensor(t.name)
		n, _ := t.size()
		if !ok || info.Size != n || info.Type != t.typ {
			return nil, fmt.Errorf("testmodel: tensor %s did not come back as written", t.name)
		}
		offs[i] = int64(info.Offset)
	}
	return offs, nil
}

// rowsPerBlock aims for blocks of about 1M elements: large enough to keep the
// workers busy, small enough to keep memory flat.
func rowsPerBlock(cols int) int { return max(1, (1<<20)/cols) }

// writeWeights generates every tensor's data and writes it at its offset.
// Blocks of rows are generated and quantized by GOMAXPROCS workers; each row
// has its own generator stream, so the output does not depend on the split.
func writeWeights(ctx context.Context, f *os.File, s Spec, ts []tensor, offsets []int64, progress func(done, total int64)) error {
	var total int64
	for _, t := range ts {
		n, _ := t.size()
		total += int64(n)
	}
	type job struct {
		t       tensor
		off     int64 // where row r0 goes
		r0, r1  int
		rowSize int
	}
	jobs := make(chan job)
	var (
		mu   sync.Mutex
		done int64
		errs []error
		wg   sync.WaitGroup
	)
	workers := runtime.GOMAXPROCS(0)
	for range workers {
		wg.Go(func() {
			pcg := rand.NewPCG(0, 0)
			rng := rand.New(pcg)
			var vals []float32
			var buf []byte
			for j := range jobs {
				n := (j.r1 - j.r0) * j.t.cols
				vals = slicesGrow(vals, n)
				buf = bytesGrow(buf, (j.r1-j.r0)*j.rowSize)
				for r := j.r0; r < j.r1; r++ {
					row := vals[(r-j.r0)*j.t.cols : (r-j.r0+1)*j.t.cols]
					if j.t.values != nil {
						copy(row, j.t.values[r*j.t.cols:])
					} else if j.t.ones {
						for i := range row {
							row[i] = 1
						}
					} else {
						weightRow(pcg, rng, s.Seed, j.t.std, j.t.name, r, row)
					}
					if j.t.factors {
						// Std-free: the same factors whatever the weights' std.
						weightRow(pcg, rng, s.Seed, 1, j.t.name, r, row)
						for i, v := range row {
							row[i] = float32(math.Exp(math.Abs(float64(v))))
						}
					}
				}
				err := quant.Quantize(j.t.typ, vals, buf)
				if err == nil {
					_, err = f.WriteAt(buf, j.off)
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("testmodel: tensor %s rows %d…%d: %w", j.t.name, j.r0, j.r1-1, err))
				}
				done += int64(len(buf))
				if progress != nil {
					progress(done, total)
				}
				mu.Unlock()
			}
		})
	}
send:
	for i, t := range ts {
		rb, _ := quant.RowBytes(t.typ, uint64(t.cols))
		step := rowsPerBlock(t.cols)
		for r0 := 0; r0 < t.rows; r0 += step {
			r1 := min(r0+step, t.rows)
			select {
			case jobs <- job{t: t, off: offsets[i] + int64(r0)*int64(rb), r0: r0, r1: r1, rowSize: int(rb)}:
			case <-ctx.Done():
				break send
			}
		}
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("testmodel: writing %s: %w", f.Name(), err))
	}
	return errors.Join(errs...)
}

func slicesGrow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func bytesGrow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
