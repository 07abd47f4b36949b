//go:build e2e

// Package demotest checks that `make demo` stops cleanly however it is
// stopped: Ctrl-C on `make demo | tee x.log` in a terminal (a pseudo-terminal
// here: the test types ^C), SIGTERM to the whole process group, the terminal
// closing (SIGHUP), and the end of DEMO_DURATION. Each case starts its own
// PostgreSQL and Kafka through the demo (about 40-60 s each); `make
// demo-test` runs them.
package demotest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// A demo started here must get SIGINT/SIGHUP with their default action even
// when `go test` itself was started with them ignored (a background job of a
// script): once the test handles them, exec resets them to the default in
// the children.
func init() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGHUP)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// output collects what the demo writes (a pty master or a pipe).
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool, out *output) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; output so far:\n%s", d, what, tail(out.String(), 60))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// openPTY returns a pseudo-terminal's master and slave, rows x cols.
func openPTY(t *testing.T, rows, cols uint16) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal("unlockpt:", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal("ptsname:", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	ws := struct{ Row, Col, X, Y uint16 }{rows, cols, 0, 0}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, s.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); e != 0 {
		t.Fatal("set window size:", e)
	}
	return m, s
}

// demo is one `make demo | tee x.log` run in a session of its own.
type demo struct {
	t      *testing.T
	root   string
	runDir string
	log    string // x.log
	cmd    *exec.Cmd
	out    *output
	master *os.File // nil without a terminal
	done   chan struct{}
	tmp    []string // the services' temp dirs, read from the env file
}

// startDemo runs `make demo | tee x.log` then prints the pipeline's exit
// statuses as "RC=<make> <tee>", in a new session; withTTY gives it a
// pseudo-terminal as its controlling terminal (and stdin, stdout, stderr).
func startDemo(t *testing.T, name string, withTTY bool, env ...string) *demo {
	root := repoRoot(t)
	d := &demo{t: t, root: root, runDir: filepath.Join(root, "test", ".run", "demotest-"+name), out: &output{}, done: make(chan struct{})}
	if err := os.RemoveAll(d.runDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d.log = filepath.Join(d.runDir, "x.log")
	d.cmd = exec.Command("bash", "-c", `make demo | tee "$DEMO_TEE"; echo "RC=${PIPESTATUS[*]}"`)
	d.cmd.Dir = root
	d.cmd.Env = append(os.Environ(), append([]string{"DEMO_RUN_DIR=" + d.runDir, "DEMO_TEE=" + d.log, "TERM=xterm"}, env...)...)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if withTTY {
		m, s := openPTY(t, 40, 160)
		d.master = m
		d.cmd.Stdin, d.cmd.Stdout, d.cmd.Stderr = s, s, s
		d.cmd.SysProcAttr.Setctty = true
		d.cmd.SysProcAttr.Ctty = 0
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		go func() { _, _ = bufio.NewReader(m).WriteTo(d.out) }() // EIO once every slave is closed
	} else {
		d.cmd.Stdin = nil
		d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		}
		if d.master != nil {
			d.master.Close()
		}
		if t.Failed() {
			t.Logf("demo output (last lines):\n%s", tail(d.out.String(), 80))
		}
	})
	return d
}

// waitFlowing waits until billing applied an event and records the services'
// temp dirs from the env file.
func (d *demo) waitFlowing() {
	d.t.Helper()
	waitFor(d.t, "billing to apply an event", 4*time.Minute, func() bool {
		return strings.Contains(d.out.String(), "billing  applied")
	}, d.out)
	b, err := os.ReadFile(filepath.Join(d.runDir, "env"))
	if err != nil {
		d.t.Fatalf("the demo's env file: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, "=")
		if (k == "OUTBOX_TEST_PG_TMP" || k == "OUTBOX_TEST_KAFKA_DIR" || k == "OUTBOX_TEST_SCHEMA_REGISTRY_DIR") && v != "" {
			d.tmp = append(d.tmp, v)
		}
	}
	if len(d.tmp) != 3 {
		d.t.Fatalf("temp dirs in the env file: %v, want the PostgreSQL, the Kafka and the schema registry one", d.tmp)
	}
	for _, dir := range d.tmp {
		if _, err := os.Stat(dir); err != nil {
			d.t.Fatalf("temp dir %s while the demo runs: %v", dir, err)
		}
	}
}

// waitExit waits for the shell to print RC= and end; returns the statuses.
func (d *demo) waitExit(within time.Duration) string {
	d.t.Helper()
	select {
	case <-d.done:
	case <-time.After(within):
		d.t.Fatalf("the demo did not end within %s after being stopped:\n%s", within, tail(d.out.String(), 40))
	}
	waitFor(d.t, "the RC line", 5*time.Second, func() bool { return strings.Contains(d.out.String(), "RC=") }, d.out)
	s := d.out.String()
	rc := s[strings.LastIndex(s, "RC=")+3:]
	if i := strings.IndexAny(rc, "\r\n"); i >= 0 {
		rc = rc[:i]
	}
	return strings.TrimSpace(rc)
}

// demoProcesses lists the live processes the demo started: every one carries
// OUTBOX_TEST_RUN_DIR=<run dir> in its environment (the demo exports it;
// PostgreSQL and Kafka inherit it), or names the run dir or a temp dir in its
// command line.
func (d *demo) demoProcesses() []string {
	var found []string
	marks := append([]string{d.runDir}, d.tmp...)
	env := []byte("OUTBOX_TEST_RUN_DIR=" + d.runDir + "\x00")
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if st, err := os.ReadFile(p + "/stat"); err != nil || bytes.Contains(st, []byte(") Z ")) {
			continue // gone, or a zombie
		}
		cmdline, _ := os.ReadFile(p + "/cmdline")
		environ, _ := os.ReadFile(p + "/environ")
		hit := bytes.Contains(environ, env)
		for _, m := range marks {
			hit = hit || bytes.Contains(cmdline, []byte(m))
		}
		if hit {
			found = append(found, filepath.Base(p)+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}

// checkClean: within a short grace no demo process is left, the temp dirs
// and the run dir's temporary files are gone.
func (d *demo) checkClean() {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := d.demoProcesses()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			d.t.Errorf("processes left by the demo:\n%s", strings.Join(left, "\n"))
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, dir := range d.tmp {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			d.t.Errorf("temp dir %s left (stat: %v)", dir, err)
		}
	}
	for _, f := range []string{"env", ".env.lock", "relay.yaml", "relay.pid", "footer.txt", ".stopping"} {
		if _, err := os.Stat(filepath.Join(d.runDir, f)); !os.IsNotExist(err) {
			d.t.Errorf("run dir file %s left (stat: %v)", f, err)
		}
	}
}

func (d *demo) logHas(want string) {
	d.t.Helper()
	b, _ := os.ReadFile(d.log)
	if !strings.Contains(string(b), want) {
		d.t.Errorf("x.log has no %q; its end:\n%s", want, tail(string(b), 20))
	}
}

func noMakeError(t *testing.T, out string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "make: ***") || strings.Contains(l, "Error 1") || strings.Contains(l, "Error 130") {
			t.Errorf("make reported an error: %q", l)
		}
	}
}

// Ctrl-C typed in a terminal on `make demo | tee x.log`: make and tee exit 0,
// x.log has the demo's last line, nothing is left.
func TestDemoCtrlCThroughTee(t *testing.T) {
	d := startDemo(t, "ctrlc", true)
	d.waitFlowing()
	if _, err := d.master.Write([]byte{3}); err != nil { // ^C: SIGINT to the terminal's foreground group
		t.Fatal(err)
	}
	if rc := d.waitExit(90 * time.Second); rc != "0 0" {
		t.Errorf("exit statuses of make | tee after Ctrl-C: %q, want \"0 0\"", rc)
	}
	noMakeError(t, d.out.String())
	d.logHas("== stopping (Ctrl-C)")
	d.logHas("== stopped")
	d.checkClean()
}

// SIGTERM to the whole process group (no terminal): the demo cleans up.
// make, which gets SIGTERM too, dies by it once the demo ended (GNU make
// re-raises a fatal signal after its recipe ends), so only cleanup is checked.
func TestDemoSIGTERMToGroup(t *testing.T) {
	d := startDemo(t, "sigterm", false)
	d.waitFlowing()
	if err := syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the demo did not end within 90 s after SIGTERM")
	}
	d.checkClean()
}

// The terminal closes (SIGHUP): the demo cleans up.
func TestDemoTerminalClosed(t *testing.T) {
	d := startDemo(t, "sighup", true)
	d.waitFlowing()
	d.master.Close()
	d.master = nil
	select {
	case <-d.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the demo did not end within 90 s after its terminal closed")
	}
	d.checkClean()
}

// DEMO_DURATION ends the demo: exit 0, billing's totals, nothing left.
func TestDemoDuration(t *testing.T) {
	d := startDemo(t, "duration", false, "DEMO_DURATION=15s")
	d.waitFlowing()
	if rc := d.waitExit(2 * time.Minute); rc != "0 0" {
		t.Errorf("exit statuses of make | tee: %q, want \"0 0\"", rc)
	}
	noMakeError(t, d.out.String())
	d.logHas("billing  stopped:")
	d.logHas("== stopped")
	d.checkClean()
}
