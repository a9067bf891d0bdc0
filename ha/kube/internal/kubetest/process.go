// The servers' processes: started with their output to a log file,
// waited for until ready, and killed.

package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Process is a server started here, logging to a file.
type Process struct {
	cmd    *exec.Cmd
	log    *os.File
	exited chan error // cmd.Wait's result, once; owned by the goroutine startProcess starts
}

// startProcess starts bin with args, its output to logPath, without the
// environment's variables that start with dropEnv (when not "").
func startProcess(bin, logPath, dropEnv string, args ...string) (*Process, error) {
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if dropEnv == "" || !strings.HasPrefix(kv, dropEnv) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Process{cmd: cmd, log: logf, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }() // joined by Stop
	return p, nil
}

// waitFor calls ready until it succeeds, the process exits or timeout
// passes, and says which, with the end of the process's log.
func (p *Process) waitFor(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case exit := <-p.exited:
			p.exited <- exit // for Stop
			return fmt.Errorf("%s exited: %v: %s", p.cmd.Path, exit, p.logTail())
		default:
		}
		if err = ready(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %v: %v: %s", p.cmd.Path, timeout, err, p.logTail())
}

func (p *Process) logTail() string {
	b, _ := os.ReadFile(p.log.Name())
	return tail(b, 2000)
}

// Pid returns the process's ID, for a caller that reads its usage in
// /proc.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop kills the process and waits for it.
func (p *Process) Stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.log.Close()
}
