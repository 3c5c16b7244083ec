// Package nonblocking is the process's own stdout and stderr as writers
// that never block (Output): every subcommand writes its last words through
// one, and the agent its log and its workers' tee.
package nonblocking

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// Output is the process's own stdout or stderr: a writer that never blocks
// its caller. The agent's progress (exits, the hang watchdog's view of the
// workers, signals) must not depend on whoever reads its output: a pipe
// nobody drains would otherwise stall the tee of the workers' output, then
// the workers themselves on their own full pipes, and the watchdog would
// kill healthy workers as hung; a blocked log line would stall the loop.
//
// Each Write is queued whole (a log record, a teed line) and written by one
// goroutine in order. While the destination does not keep up, writes beyond
// maxQueued bytes are dropped and counted, and the count is written once it
// drains again; the workers' log files under the log folder have every line.
// A destination that fails (a closed pipe: EPIPE) is given up, and what
// follows is dropped. Close writes what is queued, waiting at most its
// timeout.
type Output struct {
	dst io.Writer

	mu      sync.Mutex
	queue   [][]byte
	queued  int
	dropped int
	broken  bool
	closing bool
	wake    chan struct{}
	done    chan struct{}
}

// maxQueued bounds the bytes an Output holds for a slow destination.
const maxQueued = 1 << 20

// NewOutput returns an Output writing to dst; dst that is an *Output
// already is returned as it is.
func NewOutput(dst io.Writer) *Output {
	if o, ok := dst.(*Output); ok {
		return o
	}
	ignoreSIGPIPE()
	o := &Output{dst: dst, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go o.drain()
	return o
}

// Write queues a copy of p, or drops it (see Output); it never blocks and
// never fails.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.broken || o.closing:
		o.dropped++
		return len(p), nil
	case o.queued+len(p) > maxQueued:
		o.dropped++
		return len(p), nil
	}
	o.queue = append(o.queue, append([]byte(nil), p...))
	o.queued += len(p)
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (o *Output) drain() {
	defer close(o.done)
	for {
		o.mu.Lock()
		batch, dropped := o.queue, o.dropped
		o.queue, o.queued, o.dropped = nil, 0, 0
		if dropped > 0 && !o.broken {
			// Said after what was queued before the drops, in order.
			batch = append(batch, fmt.Appendf(nil, "[kfelastic] %d writes dropped here: this output was not read fast enough (the workers' logs under --log-dir have every line)\n", dropped))
		}
		closing := o.closing
		o.mu.Unlock()
		for _, b := range batch {
			if _, err := o.dst.Write(b); err != nil {
				o.mu.Lock()
				o.broken = true
				o.mu.Unlock()
				break
			}
		}
		if closing && len(batch) == 0 {
			return
		}
		if len(batch) == 0 {
			<-o.wake
		}
	}
}

// Close writes what is queued, waiting at most timeout for the
// destination; it stops the Output (later writes are dropped). It does not
// close the destination.
func (o *Output) Close(timeout time.Duration) {
	o.mu.Lock()
	o.closing = true
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	select {
	case <-o.done:
	case <-time.After(timeout):
	}
}

var sigpipe sync.Once

// ignoreSIGPIPE keeps the process alive when its stdout or stderr is a
// closed pipe. By default a Go program dies of SIGPIPE on such a write to
// fd 1 or 2, which for the agent meant dying without the pod's document;
// with the signal caught the write fails with EPIPE, the Output gives up
// that destination, and the agent goes on. It stays caught for the rest of
// the process: the command's last words go to the same stderr. Workers are
// unaffected (a caught signal is reset to its default on exec).
func ignoreSIGPIPE() {
	sigpipe.Do(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) })
}

// CloseOutputs closes every Output among ws at once (see Output.Close),
// waiting at most timeout in all; other writers are left alone.
func CloseOutputs(timeout time.Duration, ws ...io.Writer) {
	var wg sync.WaitGroup
	for _, w := range ws {
		if o, ok := w.(*Output); ok {
			wg.Go(func() { o.Close(timeout) })
		}
	}
	wg.Wait()
}
