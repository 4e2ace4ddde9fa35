package up

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Supervision: once the fleet is up, a service that exits is started again,
// with the same binary, flags and ports, after a backoff, so that one crash
// on a one-box deployment costs one worker for a few seconds rather than
// the whole fleet. The router keeps every worker's address and routes
// around the missing one meanwhile (its health checks and load streams see
// it gone, then back). The router itself is restarted too, but only
// routerRestarts times in a row: a router that keeps dying ends `up` with
// an error. `up` otherwise exits only on its own signal, and then stops the
// router first (it drains client requests while the workers still serve
// them), then the workers.

// Backoff between a service's exit and its restart: restartBackoff, doubled
// after each exit that follows a short run, up to maxRestartBackoff; a run
// of stableRun or longer starts the count again.
const (
	restartBackoff    = 250 * time.Millisecond
	maxRestartBackoff = 5 * time.Second
	stableRun         = 30 * time.Second
	routerRestarts    = 3
)

// respawnFunc starts a new process for the service that old ran.
type respawnFunc func(old *child) (*child, error)

// slot is one service under supervision: its current process and the
// backoff state of its restarts.
type slot struct {
	c        *child
	started  time.Time
	backoff  time.Duration
	failures int // exits in a row after short runs
}

// supervise keeps children running until ctx ends, then stops them in
// order and returns nil when every one stopped cleanly. It returns an
// error, after stopping the rest, when the router cannot be kept running.
func supervise(ctx context.Context, children []*child, respawn respawnFunc, stopTimeout time.Duration, stderr io.Writer) error {
	quit := make(chan struct{})
	defer close(quit)
	type exit struct {
		i int
		c *child
	}
	exits := make(chan exit)
	restart := make(chan int)
	watch := func(i int, c *child) {
		go func() {
			<-c.done
			select {
			case exits <- exit{i, c}:
			case <-quit:
			}
		}()
	}
	slots := make([]*slot, len(children))
	now := time.Now()
	for i, c := range children {
		slots[i] = &slot{c: c, started: now, backoff: restartBackoff}
		watch(i, c)
	}
	// current lists the processes still running: one that died and waits
	// for its restart has been reported already and is not stopped.
	current := func() []*child {
		var cs []*child
		for _, s := range slots {
			select {
			case <-s.c.done:
			default:
				cs = append(cs, s.c)
			}
		}
		return cs
	}
	schedule := func(i int) {
		s := slots[i]
		time.AfterFunc(s.backoff, func() {
			select {
			case restart <- i:
			case <-quit:
			}
		})
		s.backoff = min(2*s.backoff, maxRestartBackoff)
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stderr, "batonctl up: stopping")
			return stopOrdered(current(), stopTimeout, stderr)
		case e := <-exits:
			s := slots[e.i]
			if e.c != s.c {
				continue
			}
			if time.Since(s.started) >= stableRun {
				s.failures, s.backoff = 0, restartBackoff
			}
			s.failures++
			if isRouter(e.c) && s.failures > routerRestarts {
				err := fmt.Errorf("%s exited %d times in a row (last: %v): %s", e.c.name, s.failures, e.c.err, e.c.last())
				return errors.Join(err, stopOrdered(current(), stopTimeout, stderr))
			}
			fmt.Fprintf(stderr, "batonctl up: %s exited unexpectedly (%v): %s; restarting it in %v\n", e.c.name, e.c.err, e.c.last(), s.backoff)
			schedule(e.i)
		case i := <-restart:
			s := slots[i]
			nc, err := respawn(s.c)
			if err != nil {
				// A restart that cannot even start counts as one more
				// exit: a router that cannot be brought back ends up.
				s.failures++
				if isRouter(s.c) && s.failures > routerRestarts {
					err := fmt.Errorf("%s could not be restarted %d times in a row (last: %v)", s.c.name, s.failures, err)
					return errors.Join(err, stopOrdered(current(), stopTimeout, stderr))
				}
				fmt.Fprintf(stderr, "batonctl up: restarting %s: %v; trying again in %v\n", s.c.name, err, s.backoff)
				schedule(i)
				continue
			}
			s.c, s.started = nc, time.Now()
			watch(i, nc)
			fmt.Fprintf(stderr, "batonctl up: %s restarted (pid %d)\n", nc.name, nc.cmd.Process.Pid)
		}
	}
}

func isRouter(c *child) bool { return c.name == "router-svc" }

// stopOrdered stops the router first, so that it answers its clients while
// the workers still serve them, then every worker at once. Each group gets
// timeout to exit after SIGTERM before it is killed. It returns an error
// naming every service that did not exit cleanly.
func stopOrdered(children []*child, timeout time.Duration, stderr io.Writer) error {
	var routers, workers []*child
	for _, c := range children {
		if isRouter(c) {
			routers = append(routers, c)
		} else {
			workers = append(workers, c)
		}
	}
	return errors.Join(stopAll(routers, timeout, stderr), stopAll(workers, timeout, stderr))
}

// respawner returns the respawnFunc of up's services: the same binary and
// arguments, the log appended to the service's file (or stderr).
func respawner(logDir string, stderr io.Writer, logs *sync.WaitGroup) respawnFunc {
	return func(old *child) (*child, error) {
		sink, err := appendLogSink(logDir, old.name, stderr)
		if err != nil {
			return nil, err
		}
		c, err := start(old.cmd.Path, old.name, old.cmd.Args[1:], sink, logs)
		if err != nil {
			return nil, err
		}
		c.grpcAddr, c.httpAddr, c.label = old.grpcAddr, old.httpAddr, old.label
		return c, nil
	}
}

// appendLogSink is newLogSink for a restarted service: its file keeps the
// lines of the processes before it.
func appendLogSink(dir, service string, stderr io.Writer) (*logSink, error) {
	if dir == "" {
		return &logSink{w: stderr, prefix: "[" + service + "] "}, nil
	}
	path := filepath.Join(dir, logFileName(service))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--log-dir: %w", err)
	}
	return &logSink{w: f, path: path, file: f}, nil
}
