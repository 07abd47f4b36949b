// Package testkit is the shared harness of outbox-relay's end-to-end suite
// (test/e2e), fault-injection suite (test/chaos) and benchmarks (bench): the
// services test/services.sh starts, a primary/standby PostgreSQL pair of its
// own (PGPair), the relay process and its metrics, an outbox writer, a real
// Kafka consumer, the delivery checker, a Java-compatible murmur2
// partitioner oracle, the race-report reader and a PromQL name lexer.
package testkit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Services is what test/services.sh start wrote to its env file.
type Services struct {
	File    string            // the env file read; "" when only the process environment had the values
	Vars    map[string]string // every KEY=value of the file
	PGURL   string            // OUTBOX_TEST_PG_URL
	Brokers []string          // OUTBOX_TEST_KAFKA_BROKERS: the direct PLAINTEXT listener
	Script  string            // OUTBOX_TEST_SERVICES: test/services.sh, for kafka-kill, pg-restart, ...
}

// baseKeys are what every user of the services needs.
var baseKeys = []string{"OUTBOX_TEST_PG_URL", "OUTBOX_TEST_KAFKA_BROKERS", "OUTBOX_TEST_SERVICES"}

// LoadServices reads $OUTBOX_TEST_RUN_DIR/env (default <module>/test/.run/env),
// requires baseKeys plus keys, and checks that PostgreSQL and Kafka accept
// connections. Without the file it takes the OUTBOX_TEST_* variables of the
// process (a shell that loaded the file); a variable of the process that
// contradicts the file is an error, as it means a stale shell. It never
// returns "skip": missing services are an error.
func LoadServices(keys ...string) (*Services, error) {
	dir := os.Getenv("OUTBOX_TEST_RUN_DIR")
	if dir == "" {
		root, err := ModuleRoot()
		if err != nil {
			return nil, err
		}
		dir = filepath.Join(root, "test", ".run")
	}
	s, err := ReadServices(filepath.Join(dir, "env"))
	if errors.Is(err, os.ErrNotExist) {
		s, err = &Services{Vars: map[string]string{}}, nil
	}
	if err != nil {
		return nil, err
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "OUTBOX_TEST_") || k == "OUTBOX_TEST_RUN_DIR" {
			continue
		}
		if strings.HasSuffix(k, "_PID") {
			continue // a service restarted by an earlier suite (pg-restart, kafka-start) has a new pid: the file is current
		}
		if old, ok := s.Vars[k]; ok && s.File != "" && old != v {
			return nil, fmt.Errorf("%s=%s in the environment but %s in %s: reload the env file (set -a; . %s; set +a)", k, v, old, s.File, s.File)
		}
		s.Vars[k] = v
	}
	s.fill()
	if err := s.Require(keys...); err != nil {
		return nil, err
	}
	return s, s.Reachable(5 * time.Second)
}

// ReadServices reads an env file of test/services.sh (plain KEY=value lines).
func ReadServices(path string) (*Services, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("services env file: %w: start the services first (OUTBOX_TEST_RUN_DIR=... bash test/services.sh start)", err)
	}
	defer f.Close()
	s := &Services{File: path, Vars: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := sc.Text(); !strings.HasPrefix(line, "#") {
			if k, v, ok := strings.Cut(line, "="); ok {
				s.Vars[k] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	s.fill()
	return s, nil
}

func (s *Services) fill() {
	s.PGURL, s.Script = s.Vars["OUTBOX_TEST_PG_URL"], s.Vars["OUTBOX_TEST_SERVICES"]
	s.Brokers = nil
	if b := s.Vars["OUTBOX_TEST_KAFKA_BROKERS"]; b != "" {
		s.Brokers = strings.Split(b, ",")
	}
}

// Get returns one variable of the env file ("" if absent).
func (s *Services) Get(key string) string { return s.Vars[key] }

// Require fails, naming every one, when baseKeys or keys are unset.
func (s *Services) Require(keys ...string) error {
	var missing []string
	for _, k := range append(slices.Clone(baseKeys), keys...) {
		if s.Vars[k] == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	src := "the environment"
	if s.File != "" {
		src = s.File
	}
	return fmt.Errorf("%s not set in %s; start the services with test/services.sh and load its env file (make test, make chaos and make bench do both)",
		strings.Join(slices.Compact(missing), ", "), src)
}

// Reachable dials PostgreSQL and every broker: a stale env file of stopped
// services fails here, not in the middle of a test.
func (s *Services) Reachable(d time.Duration) error {
	addrs := slices.Clone(s.Brokers)
	if h, p := s.Vars["OUTBOX_TEST_PG_HOST"], s.Vars["OUTBOX_TEST_PG_PORT"]; h != "" && p != "" {
		addrs = append(addrs, net.JoinHostPort(h, p))
	}
	var errs []error
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("services not reachable (test/services.sh status): %w", err))
			continue
		}
		c.Close()
	}
	return errors.Join(errs...)
}

// Run runs a test/services.sh command (kafka-kill, pg-restart fast, ...).
func (s *Services) Run(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "bash", append([]string{s.Script}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("services.sh %v: %w\n%s", args, err, out)
	}
	return nil
}

// ModuleRoot is the directory of the go.mod above the working directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

var builds sync.Map // output path -> *buildOnce

type buildOnce struct {
	once sync.Once
	err  error
}

// BuildRelay builds ./cmd/outbox-relay into out, once per process and path;
// race adds -race (the test runs double as a race check of the daemon).
func BuildRelay(ctx context.Context, goBin, out string, race bool) error {
	v, _ := builds.LoadOrStore(out, &buildOnce{})
	b := v.(*buildOnce)
	b.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			b.err = err
			return
		}
		args := []string{"build"}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, goBin, append(args, "-o", out, "./cmd/outbox-relay")...)
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			b.err = fmt.Errorf("build relay: %w", err)
		}
	})
	return b.err
}

// Run runs a command to its end, bounded by ctx, and returns its exit code
// (negative: killed by that signal) and combined output. err is only for a
// command that could not run or outlived ctx.
func Run(ctx context.Context, env []string, bin string, args ...string) (int, string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return -1, string(out), fmt.Errorf("%s %v still running: %w", bin, args, ctx.Err())
	}
	code, err := ExitCode(err)
	return code, string(out), err
}

// FreeAddr returns a 127.0.0.1 address nothing listens on right now.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
