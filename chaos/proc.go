package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/geolog/geolog/internal/portlock"
)

// proc is one process the harness started and owns: it signals it by its
// pid only, never by name.
type proc struct {
	name    string
	bin     string
	args    []string
	env     []string // added to the harness's environment
	logPath string
	pidPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
}

// start runs the process, appending its output to logPath. It must not be
// running.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("chaos: %s is running", p.name)
		}
	}
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C meant for the harness does not
	// reach the cluster, which the harness stops in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: start %s: %w", p.name, err)
	}
	p.cmd, p.done, p.paused = cmd, make(chan struct{}), false
	done := p.done
	go func() { _ = cmd.Wait(); close(done) }()
	if p.pidPath != "" {
		_ = os.WriteFile(p.pidPath, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	}
	return nil
}

// running reports whether the process runs (paused counts).
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the running process; wait makes it wait for the exit.
func (p *proc) signal(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd != nil {
		switch sig {
		case syscall.SIGSTOP:
			p.paused = true
		case syscall.SIGCONT, syscall.SIGKILL:
			p.paused = false
		}
	}
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("chaos: %s was never started", p.name)
	}
	select {
	case <-done:
		return fmt.Errorf("chaos: %s is not running", p.name)
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("chaos: signal %s: %w", p.name, err)
	}
	if wait <= 0 {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("chaos: %s still runs %v after %v", p.name, wait, sig)
	}
}

func (p *proc) kill() error { return p.signal(syscall.SIGKILL, 30*time.Second) }

// stop ends the process politely (SIGTERM, SIGKILL after timeout); a
// process that is not running is fine.
func (p *proc) stop(timeout time.Duration) {
	if !p.running() {
		return
	}
	_ = p.signal(syscall.SIGCONT, 0)
	if err := p.signal(syscall.SIGTERM, timeout); err != nil && p.running() {
		_ = p.kill()
	}
	if p.pidPath != "" {
		_ = os.Remove(p.pidPath)
	}
}

// portAllocator hands out loopback ports of a range through portlock: each
// is held (no other run takes it) until release, so a node killed and
// restarted finds its port still free.
type portAllocator struct {
	r    portlock.Range
	held []*portlock.Port
}

func (a *portAllocator) take() (int, error) {
	p, err := portlock.Take(a.r)
	if err != nil {
		return 0, fmt.Errorf("chaos: %w", err)
	}
	a.held = append(a.held, p)
	return p.Number(), nil
}

func (a *portAllocator) addr() (string, error) {
	p, err := a.take()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

// release gives every port back.
func (a *portAllocator) release() {
	for _, p := range a.held {
		p.Release()
	}
	a.held = nil
}

// absPath makes p absolute (processes run with the harness's directory).
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)
