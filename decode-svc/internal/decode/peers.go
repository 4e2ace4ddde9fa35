package decode

import (
	"errors"
	"sync"

	"google.golang.org/grpc"
)

// peerPool keeps one connection per prefill endpoint.
type peerPool struct {
	opts  []grpc.DialOption
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func newPeerPool(opts ...grpc.DialOption) *peerPool {
	return &peerPool{opts: opts, conns: map[string]*grpc.ClientConn{}}
}

func (p *peerPool) get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, p.opts...)
	if err != nil {
		return nil, err
	}
	p.conns[addr] = c
	return c, nil
}

func (p *peerPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for a, c := range p.conns {
		errs = append(errs, c.Close())
		delete(p.conns, a)
	}
	return errors.Join(errs...)
}
