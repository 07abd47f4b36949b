package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// RelayConfig is how to start one relay process.
type RelayConfig struct {
	Bin     string
	Args    []string // e.g. "run", "--slot", ...
	Env     []string // KEY=value added after the caller's environment; later entries win
	DropEnv string   // caller variables with this prefix are not passed on ("OUTBOX_RELAY_": only the test's settings)
	Metrics string   // host:port the relay serves /metrics, /readyz on (the caller puts it in Args or Env)
	LogPath string   // stdout and stderr go here
}

// Relay is one running relay process.
type Relay struct {
	Cmd     *exec.Cmd
	Metrics string
	LogPath string
	Started time.Time
	done    chan struct{}
	err     error
	stopped atomic.Bool // Stop was called: an exit is expected
}

var httpc = &http.Client{Timeout: 10 * time.Second}

// StartRelay starts the relay; it dies with the test process (Pdeathsig).
func StartRelay(cfg RelayConfig) (*Relay, error) {
	f, err := os.Create(cfg.LogPath)
	if err != nil {
		return nil, err
	}
	r := &Relay{Metrics: cfg.Metrics, LogPath: cfg.LogPath, done: make(chan struct{})}
	r.Cmd = exec.Command(cfg.Bin, cfg.Args...)
	r.Cmd.Stdout, r.Cmd.Stderr = f, f
	for _, kv := range os.Environ() {
		if cfg.DropEnv == "" || !strings.HasPrefix(kv, cfg.DropEnv) {
			r.Cmd.Env = append(r.Cmd.Env, kv)
		}
	}
	r.Cmd.Env = append(r.Cmd.Env, cfg.Env...)
	r.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r.Started = time.Now()
	if err := r.Cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start relay: %w", err)
	}
	go func() {
		r.err = r.Cmd.Wait()
		f.Close()
		close(r.done)
	}()
	return r, nil
}

// PID is the relay's process id.
func (r *Relay) PID() int { return r.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (r *Relay) Done() <-chan struct{} { return r.done }

// Running reports whether the process has not exited.
func (r *Relay) Running() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// Err is the process' wait error; valid once Done is closed.
func (r *Relay) Err() error { return r.err }

// Exited returns an error with the log's tail if the relay is gone.
func (r *Relay) Exited() error {
	if r.Running() {
		return nil
	}
	return fmt.Errorf("relay exited (%v); log %s:\n%s", r.err, r.LogPath, r.LogTail(4096))
}

// Unexpected returns an error if the relay exited without Stop or Kill.
func (r *Relay) Unexpected() error {
	if r.stopped.Load() {
		return nil
	}
	return r.Exited()
}

// Log is the whole log so far.
func (r *Relay) Log() string {
	b, _ := os.ReadFile(r.LogPath)
	return string(b)
}

// LogTail is the last n bytes of the log.
func (r *Relay) LogTail(n int) string { return Tail(r.Log(), n) }

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Get returns the status code and body of one of the relay's HTTP endpoints.
func (r *Relay) Get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Metrics+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// ReadyStatus is the /readyz status code, 0 if the relay does not answer.
func (r *Relay) ReadyStatus() int {
	code, _, _ := r.Get(context.Background(), "/readyz")
	return code
}

// WaitReady polls /readyz until it answers 200 in a settled role: the
// leader streaming, or a standby of another instance's lease. A relay that
// has its lease connection but has not yet taken the free lease is a ready
// standby for a moment; a test that writes then would race the slot's
// creation. It fails at once if the relay exits.
func (r *Relay) WaitReady(d time.Duration) error {
	return Poll(d, 20*time.Millisecond, func() (bool, error) {
		if err := r.Exited(); err != nil {
			return false, fmt.Errorf("waiting for /readyz: %w", err)
		}
		code, body, _ := r.Get(context.Background(), "/readyz")
		if code != http.StatusOK {
			return false, nil
		}
		if !strings.HasPrefix(string(body), "standby") {
			return true, nil
		}
		_, role, _ := r.Get(context.Background(), "/role")
		var st struct{ Instance, Holder string }
		if json.Unmarshal(role, &st) != nil {
			return false, nil
		}
		return st.Holder != "" && st.Holder != st.Instance, nil
	})
}

// Scrape reads /metrics.
func (r *Relay) Scrape() ([]Sample, error) {
	code, body, err := r.Get(context.Background(), "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: status %d", code)
	}
	return ParseMetrics(bytes.NewReader(body)), nil
}

// Metric is the sum of every series of a metric family, -1 if absent or
// the relay does not answer.
func (r *Relay) Metric(name string) float64 {
	ss, err := r.Scrape()
	if err != nil {
		return -1
	}
	if v, ok := SumMetric(ss, name, nil); ok {
		return v
	}
	return -1
}

// Stop sends sig and waits up to d for the exit; past d it kills the
// process and returns -1000 and an error. Otherwise it returns the exit
// code (ExitCode: negative when a signal ended it), or 0 when the relay,
// built with -race, exited with the race detector's code for known races
// of dependencies only (Races). It blocks; after it Unexpected is nil.
func (r *Relay) Stop(sig syscall.Signal, d time.Duration) (int, error) {
	r.stopped.Store(true)
	r.Cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(d):
		r.Cmd.Process.Kill()
		<-r.done
		return -1000, fmt.Errorf("relay did not exit within %s of %s; log:\n%s", d, sig, r.LogTail(4096))
	}
	code, err := ExitCode(r.err)
	if raceTolerated(code, r.LogPath) {
		return 0, err // only known races of dependencies (Races); the chaos suite notes them
	}
	return code, err
}

// Kill kills the process if it still runs and waits for it.
func (r *Relay) Kill() {
	r.stopped.Store(true)
	if r.Running() {
		r.Cmd.Process.Kill()
		<-r.done
	}
}

// ExitCode turns a wait error into an exit code: 0 for nil, negative for a
// signal; err is kept only when it is not about the exit status.
func ExitCode(err error) (int, error) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return -1000, err
}
