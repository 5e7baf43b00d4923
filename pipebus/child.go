package pipebus

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// ChildGrace is how long Close waits for a child broker to exit after the
// end of its input before killing it.
const ChildGrace = 5 * time.Second

// Child is a Client talking to a broker child process over its stdio.
type Child struct {
	*Client
	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	err    error // the child's exit status, once exited
}

// Start starts cmd (typically `a2a-bus serve --bus=pipe`) with its stdin
// and stdout connected to a Client. cmd's Stdin and Stdout must be unset;
// its Stderr is left as the caller set it (the broker logs there). Close
// closes the child's stdin, waits up to ChildGrace for it to exit, and
// kills it after that.
func Start(cmd *exec.Cmd, cfg ClientConfig) (*Child, error) {
	if cmd.Stdin != nil || cmd.Stdout != nil {
		return nil, errors.New("pipebus: Start needs cmd.Stdin and cmd.Stdout unset")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout = inR, outW
	if err := cmd.Start(); err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("pipebus: start broker: %w", err)
	}
	// The child holds its ends now.
	inR.Close()
	outW.Close()
	ch := &Child{cmd: cmd, exited: make(chan struct{})}
	go ch.wait()
	ch.Client = newClient(outR, inW, ch.stop, cfg)
	return ch, nil
}

// wait reaps the child; it ends when the child exits, which Close
// guarantees.
func (ch *Child) wait() {
	err := ch.cmd.Wait()
	ch.mu.Lock()
	ch.err = err
	ch.mu.Unlock()
	close(ch.exited)
}

func (ch *Child) stop() error {
	select {
	case <-ch.exited:
	case <-time.After(ChildGrace):
		ch.cmd.Process.Signal(syscall.SIGKILL)
		<-ch.exited
	}
	return nil
}

// Exited is closed when the child has exited.
func (ch *Child) Exited() <-chan struct{} { return ch.exited }

// ExitErr is the child's exit status once it has exited (nil for status
// 0).
func (ch *Child) ExitErr() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.err
}

// Pid is the child's process id.
func (ch *Child) Pid() int { return ch.cmd.Process.Pid }
