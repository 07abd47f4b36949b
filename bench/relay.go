package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// relayProc is one running outbox-relay process (the product binary).
type relayProc struct {
	cmd     *exec.Cmd
	pid     int
	addr    string // metrics host:port
	logPath string
	started time.Time
	done    chan struct{}
	err     error
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startRelay runs `outbox-relay run` for one slot, one instance
// (--leader-election=false), with its own topics and metrics port.
func (b *bench) startRelay(name, slot, topicTemplate string, extra ...string) (*relayProc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	r := &relayProc{addr: addr, done: make(chan struct{}), logPath: filepath.Join(b.runDir, "relay-"+name+".log")}
	f, err := os.Create(r.logPath)
	if err != nil {
		return nil, err
	}
	args := []string{"run", "--postgres-url", b.pg.url, "--kafka-brokers", strings.Join(b.brokers, ","),
		"--slot", slot, "--publication", b.pg.pub, "--table", b.pg.table, "--topic-template", topicTemplate,
		"--metrics-addr", addr, "--leader-election=false", "--log-format", "json"}
	args = append(args, b.relayFlags...)
	args = append(args, extra...)
	r.cmd = exec.Command(b.relayBin, args...)
	r.cmd.Stdout, r.cmd.Stderr = f, f
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
	r.started = time.Now()
	if err := r.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start relay: %w", err)
	}
	r.pid = r.cmd.Process.Pid
	go func() {
		r.err = r.cmd.Wait()
		f.Close()
		close(r.done)
	}()
	return r, nil
}

func (r *relayProc) running() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// exited returns an error with the log's tail if the relay is gone.
func (r *relayProc) exited() error {
	if r.running() {
		return nil
	}
	b, _ := os.ReadFile(r.logPath)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return fmt.Errorf("relay exited (%v); log %s:\n%s", r.err, r.logPath, b)
}

var httpc = &http.Client{Timeout: 10 * time.Second}

func (r *relayProc) get(path string) (int, []byte, error) {
	resp, err := httpc.Get("http://" + r.addr + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (r *relayProc) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := r.exited(); err != nil {
			return err
		}
		if code, _, err := r.get("/readyz"); err == nil && code == 200 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("relay not ready after %s (log %s)", d, r.logPath)
}

func (r *relayProc) scrape() ([]sample, error) {
	resp, err := httpc.Get("http://" + r.addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	return parseProm(resp.Body), nil
}

// published is outbox_relay_events_published_total{topic}: events Kafka acked.
func (r *relayProc) published(topic string) float64 {
	ss, err := r.scrape()
	if err != nil {
		return -1
	}
	v, _ := value(ss, "outbox_relay_events_published_total", map[string]string{"topic": topic})
	return v
}

// stop sends SIGTERM (drain acks, final status update) and waits; SIGKILL
// after 40s.
func (r *relayProc) stop() {
	if !r.running() {
		return
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(40 * time.Second):
		logf("relay %d ignored SIGTERM for 40s: SIGKILL", r.pid)
		r.cmd.Process.Kill()
		<-r.done
	}
}

// fetch GETs a relay URL into a file (pprof profiles).
func (r *relayProc) fetch(ctx context.Context, path, dst string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+r.addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s %s", path, resp.Status, b)
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
