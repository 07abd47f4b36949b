package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// relayProc is one running outbox-relay process (the product binary).
type relayProc struct {
	*testkit.Relay
	pid     int
	started time.Time
}

// startRelay runs `outbox-relay run` for one slot, one instance
// (--leader-election=false), with its own topics and metrics port.
func (b *bench) startRelay(name, slot, topicTemplate string, extra ...string) (*relayProc, error) {
	return b.startRelayBin(b.relayBin, name, slot, topicTemplate, extra...)
}

// startRelayBin is startRelay with another binary (the base leg).
func (b *bench) startRelayBin(bin, name, slot, topicTemplate string, extra ...string) (*relayProc, error) {
	addr, err := testkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"run", "--postgres-url", b.pg.url, "--kafka-brokers", strings.Join(b.brokers, ","),
		"--slot", slot, "--publication", b.pg.pub, "--table", b.pg.table, "--topic-template", topicTemplate,
		"--metrics-addr", addr, "--leader-election=false", "--log-format", "json"}
	args = append(append(args, b.relayFlags...), extra...)
	r, err := testkit.StartRelay(testkit.RelayConfig{Bin: bin, Args: args, Metrics: addr, Env: b.relayEnv,
		LogPath: filepath.Join(b.runDir, "relay-"+name+".log")})
	if err != nil {
		return nil, err
	}
	return &relayProc{Relay: r, pid: r.PID(), started: r.Started}, nil
}

func (r *relayProc) running() bool { return r.Running() }

// exited returns an error with the log's tail if the relay is gone.
func (r *relayProc) exited() error { return r.Exited() }

func (r *relayProc) get(path string) (int, []byte, error) { return r.Get(context.Background(), path) }

func (r *relayProc) waitReady(d time.Duration) error { return r.WaitReady(d) }

func (r *relayProc) scrape() ([]testkit.Sample, error) { return r.Scrape() }

// published is outbox_relay_events_published_total{topic}: events Kafka acked.
func (r *relayProc) published(topic string) float64 {
	ss, err := r.scrape()
	if err != nil {
		return -1
	}
	v, _ := testkit.SumMetric(ss, "outbox_relay_events_published_total", map[string]string{"topic": topic})
	return v
}

// stop sends SIGTERM (drain acks, final status update) and waits; SIGKILL
// after 40s.
func (r *relayProc) stop() {
	if !r.running() {
		return
	}
	if _, err := r.Stop(syscall.SIGTERM, 40*time.Second); err != nil {
		logf("relay %d ignored SIGTERM for 40s: SIGKILL", r.pid)
	}
}

// fetch GETs a relay URL into a file (pprof profiles): no client timeout,
// a CPU profile takes as long as it was asked to.
func (r *relayProc) fetch(ctx context.Context, path, dst string) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+r.Metrics+path, nil)
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
