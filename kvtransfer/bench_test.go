package kvtransfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
	"google.golang.org/grpc"
)

// The benchmarks move a long prompt's KV cache from a PageSource through a
// Sender, a loopback gRPC stream and a Receiver into a PageSink, with gRPC's
// default codec and with Codec, and the same bytes over a bare TCP
// connection as the baseline. Run them alone, e.g.
//
//	GOMAXPROCS=2 go test -run='^$' -bench=Transfer -benchtime=3s -count=3 ./kvtransfer/
//
// BenchmarkTransferVsRawTCP alternates the three on one machine state and
// reports their ratios, which are steadier than separate runs on a busy
// machine.

// benchLayout is the 110M-parameter model's KV cache: F16, 12 layers, 12 KV
// heads of 64, pages of 16 tokens. A page's keys in one layer are 24 KiB, a
// whole page (all layers, K and V) 576 KiB.
var benchLayout = kernels.KVLayout{DType: quant.F16, PageSize: 16, Layers: 12, KVHeads: 12, HeadDim: 64}

// benchPrompt is a prompt of ≈1 GiB of keys and values whose last page is
// partial.
const benchPrompt = 1820*16 + 7

// benchWindow is the decode service's default credit window.
const benchWindow = 32

func benchBytes() int64 {
	return int64(2 * benchPrompt * benchLayout.Layers * benchLayout.RowBytes())
}

// pageMem is KV memory laid out like engine/kvcache's: separate K and V rows
// per (page, layer). Request pages map onto a fixed set of physical pages,
// round robin, so a 1 GiB transfer needs 36 MiB (more than the L3 cache)
// rather than 1 GiB.
type pageMem struct {
	layout kernels.KVLayout
	k, v   [][][]byte // [physical page][layer]
}

func newPageMem(l kernels.KVLayout, pages int, seed byte) *pageMem {
	per := l.PageSize * l.RowBytes()
	all := make([]byte, 2*pages*l.Layers*per)
	for i := range all {
		all[i] = seed + byte(i) + byte(i>>11)
	}
	m := &pageMem{layout: l}
	for range pages {
		var k, v [][]byte
		for range l.Layers {
			k, all = append(k, all[:per:per]), all[per:]
			v, all = append(v, all[:per:per]), all[per:]
		}
		m.k, m.v = append(m.k, k), append(m.v, v)
	}
	return m
}

func (m *pageMem) CopyPage(p, lo, hi, tokens int, k, v []byte) error {
	n, pp := tokens*m.layout.RowBytes(), p%len(m.k)
	for l := lo; l < hi; l++ {
		off := (l - lo) * n
		copy(k[off:off+n], m.k[pp][l][:n])
		copy(v[off:off+n], m.v[pp][l][:n])
	}
	return nil
}

func (m *pageMem) WritePage(p, lo, hi, tokens int, k, v []byte) error {
	n, pp := tokens*m.layout.RowBytes(), p%len(m.k)
	for l := lo; l < hi; l++ {
		off := (l - lo) * n
		copy(m.k[pp][l][:n], k[off:off+n])
		copy(m.v[pp][l][:n], v[off:off+n])
	}
	return nil
}

// benchTransport moves benchPrompt's pages from one pageMem to another.
type benchTransport func() error

// Benchmark modes.
const (
	modeRaw        = "raw-tcp"       // io.ReadFull straight into the pages
	modeDefault    = "default-codec" // gRPC's proto codec
	modeCodec      = "codec"         // Codec, the Sender's buffers pooled
	modeCodecAlloc = "codec-alloc"   // Codec, a fresh buffer per chunk
	// Codec, and the decode side's gRPC reads frames into buffers from
	// the codec's pool (Codec.DialOption), which does not clear them.
	modeCodecFrames = "codec-dirty-frames"
)

func newTransport(b *testing.B, mode string, maxChunk, window int) benchTransport {
	b.Helper()
	src, dst := newPageMem(benchLayout, 64, 1), newPageMem(benchLayout, 64, 2)
	if mode == modeRaw {
		return newRawTCP(b, src, dst, maxChunk)
	}
	srv := &kvServer{maxChunk: maxChunk, source: func(kernels.KVLayout) PageSource { return src }}
	var opts []grpc.ServerOption
	var dopts []grpc.DialOption
	var clientCodec *Codec
	switch mode {
	case modeCodec, modeCodecAlloc, modeCodecFrames:
		serverCodec := NewCodec()
		opts = append(opts, serverCodec.ServerOption())
		if mode != modeCodecAlloc {
			srv.codec = serverCodec
		}
		clientCodec = NewCodec()
		if mode == modeCodecFrames {
			dopts = append(dopts, clientCodec.DialOption())
		}
	case modeDefault:
	default:
		b.Fatalf("unknown mode %q", mode)
	}
	client := serveKV(b, srv, opts, dopts...)
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		rcv, err := pull(ctx, client, benchLayout, benchPrompt, window, dst, clientCodec)
		if err != nil {
			return err
		}
		if rcv.Bytes() != uint64(benchBytes()) {
			return fmt.Errorf("received %d bytes, want %d", rcv.Bytes(), benchBytes())
		}
		return nil
	}
}

// newRawTCP is the baseline: the same chunks (a 16-byte header, then the
// keys and the values of a page's layer range) written with writev straight
// from the source pages and read with io.ReadFull straight into the
// destination pages, over one loopback connection kept across transfers.
func newRawTCP(b *testing.B, src, dst *pageMem, maxChunk int) benchTransport {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	w, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	r := <-accepted
	if r == nil {
		b.Fatal("accepting the loopback connection failed")
	}
	b.Cleanup(func() { w.Close(); r.Close() })
	if maxChunk <= 0 {
		maxChunk = DefaultMaxChunkBytes
	}
	l := benchLayout
	per, pages := LayersPerChunk(l, maxChunk), l.PagesFor(benchPrompt)
	type chunk struct{ seq, p, lo, hi, n int }
	each := func(f func(c chunk) error) error {
		seq := 0
		for p := range pages {
			n := min(l.PageSize, benchPrompt-p*l.PageSize) * l.RowBytes()
			for lo := 0; lo < l.Layers; lo += per {
				if err := f(chunk{seq, p, lo, min(lo+per, l.Layers), n}); err != nil {
					return err
				}
				seq++
			}
		}
		return nil
	}
	send := func() error {
		var hdr [16]byte
		bufs := make(net.Buffers, 0, 1+2*l.Layers)
		return each(func(c chunk) error {
			binary.LittleEndian.PutUint64(hdr[0:], uint64(c.seq))
			binary.LittleEndian.PutUint32(hdr[8:], uint32(c.p))
			binary.LittleEndian.PutUint16(hdr[12:], uint16(c.lo))
			binary.LittleEndian.PutUint16(hdr[14:], uint16(c.hi))
			bufs = append(bufs[:0], hdr[:])
			pp := c.p % len(src.k)
			for ly := c.lo; ly < c.hi; ly++ {
				bufs = append(bufs, src.k[pp][ly][:c.n])
			}
			for ly := c.lo; ly < c.hi; ly++ {
				bufs = append(bufs, src.v[pp][ly][:c.n])
			}
			out := bufs // WriteTo consumes its receiver
			_, err := out.WriteTo(w)
			return err
		})
	}
	receive := func() error {
		var hdr [16]byte
		return each(func(c chunk) error {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return err
			}
			if binary.LittleEndian.Uint64(hdr[0:]) != uint64(c.seq) || binary.LittleEndian.Uint32(hdr[8:]) != uint32(c.p) ||
				binary.LittleEndian.Uint16(hdr[12:]) != uint16(c.lo) || binary.LittleEndian.Uint16(hdr[14:]) != uint16(c.hi) {
				return fmt.Errorf("chunk %d: header %x", c.seq, hdr)
			}
			pp := c.p % len(dst.k)
			for ly := c.lo; ly < c.hi; ly++ {
				if _, err := io.ReadFull(r, dst.k[pp][ly][:c.n]); err != nil {
					return err
				}
			}
			for ly := c.lo; ly < c.hi; ly++ {
				if _, err := io.ReadFull(r, dst.v[pp][ly][:c.n]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return func() error {
		errc := make(chan error, 1)
		go func() { errc <- send() }()
		rerr := receive()
		return errors.Join(rerr, <-errc)
	}
}

// cpuTime is the CPU time (user and system) the process has used: on a
// shared machine it measures a transfer's cost far more steadily than the
// wall clock does.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports CPU seconds per GB (1e9 bytes) moved.
func reportCPU(b *testing.B, name string, cpu time.Duration, n int) {
	b.ReportMetric(cpu.Seconds()/(float64(benchBytes())*float64(n)/1e9), name)
}

func runTransfers(b *testing.B, t benchTransport) {
	b.SetBytes(benchBytes())
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime(b)
	for b.Loop() {
		if err := t(); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, "CPU-s/GB", cpuTime(b)-cpu, b.N)
}

// BenchmarkTransfer moves ≈1 GiB per operation with the default chunk size
// and credit window.
func BenchmarkTransfer(b *testing.B) {
	for _, mode := range []string{modeRaw, modeDefault, modeCodec, modeCodecAlloc, modeCodecFrames} {
		b.Run(mode, func(b *testing.B) { runTransfers(b, newTransport(b, mode, 0, benchWindow)) })
	}
}

// BenchmarkChunkSize varies MaxChunkBytes: 1, 2, 5 (+5+2), 6 and 12 layers
// of a page per chunk (48 KiB of K and V per layer).
func BenchmarkChunkSize(b *testing.B) {
	for _, mode := range []string{modeRaw, modeDefault, modeCodecFrames} {
		for _, kib := range []int{48, 96, 256, 288, 576} {
			b.Run(fmt.Sprintf("%s/chunk=%dKiB", mode, kib), func(b *testing.B) {
				runTransfers(b, newTransport(b, mode, kib<<10, benchWindow))
			})
		}
	}
}

// BenchmarkCreditWindow varies the chunks decode grants ahead.
func BenchmarkCreditWindow(b *testing.B) {
	for _, w := range []int{1, 2, 4, 8, 16, 32, 64} {
		b.Run(fmt.Sprintf("window=%d", w), func(b *testing.B) { runTransfers(b, newTransport(b, modeCodecFrames, 0, w)) })
	}
}

// BenchmarkTransferVsRawTCP runs the raw TCP baseline, the default codec,
// Codec, and Codec with its DialOption in turn in every operation (≈4 GiB)
// and reports each one's GB/s and CPU cost and the ratios to raw TCP, so
// that load changes on a shared machine affect all of them alike.
func BenchmarkTransferVsRawTCP(b *testing.B) {
	modes := []string{modeRaw, modeDefault, modeCodec, modeCodecFrames}
	ts := make([]benchTransport, len(modes))
	for i, m := range modes {
		ts[i] = newTransport(b, m, 0, benchWindow)
	}
	took, cpu := make([]time.Duration, len(modes)), make([]time.Duration, len(modes))
	b.ResetTimer()
	for b.Loop() {
		for i, t := range ts {
			start, cpu0 := time.Now(), cpuTime(b)
			if err := t(); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
			cpu[i] += cpuTime(b) - cpu0
		}
	}
	gbps := func(i int) float64 { return float64(benchBytes()) * float64(b.N) / took[i].Seconds() / 1e9 }
	for i, m := range modes {
		b.ReportMetric(gbps(i), m+"-GB/s")
		reportCPU(b, m+"-CPU-s/GB", cpu[i], b.N)
	}
	for i, m := range modes[1:] {
		b.ReportMetric(gbps(i+1)/gbps(0), m+"/raw")
		// The ratio of CPU costs: what the throughput ratio tends to
		// when both ends are CPU-bound.
		b.ReportMetric(cpu[0].Seconds()/cpu[i+1].Seconds(), "raw/"+m+"-CPU")
	}
	b.ReportMetric(0, "ns/op")
}
