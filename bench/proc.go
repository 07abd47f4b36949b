package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat
// (getconf CLK_TCK; 100 on every Linux this runs on).
var clockTicks = func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			return float64(n)
		}
	}
	return 100
}()

// procCPU returns user+system CPU time of a process (all its threads) from
// /proc/<pid>/stat. The bench runs as root; the file is world-readable anyway,
// so it works for postgres' processes too.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no comm", pid)
	}
	// After "pid (comm) ": state is field 3, utime field 14, stime field 15.
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(float64(ut+st) / clockTicks * float64(time.Second)), nil
}

// procMem returns VmRSS and VmHWM (peak RSS) in bytes from /proc/<pid>/status.
func procMem(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var dst *int64
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			dst = &rss
		case strings.HasPrefix(line, "VmHWM:"):
			dst = &hwm
		default:
			continue
		}
		fs := strings.Fields(line)
		if len(fs) >= 2 {
			kb, _ := strconv.ParseInt(fs[1], 10, 64)
			*dst = kb * 1024
		}
	}
	return rss, hwm, sc.Err()
}

// cpuSampler keeps the last CPU reading of a process that may exit at any
// moment (a walsender exits with its client): Stop returns the last value
// read, so at most one sampling interval of work is missed.
type cpuSampler struct {
	pid  int
	stop chan struct{}
	done chan struct{}
	last time.Duration
	ok   bool
}

func sampleCPU(pid int, every time.Duration) *cpuSampler {
	s := &cpuSampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	if c, err := procCPU(pid); err == nil {
		s.last, s.ok = c, true
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				if c, err := procCPU(pid); err == nil {
					s.last, s.ok = c, true
				}
				return
			case <-t.C:
				if c, err := procCPU(pid); err == nil {
					s.last, s.ok = c, true
				}
			}
		}
	}()
	return s
}

// Stop ends sampling and returns the last CPU time read (ok false if the
// process could never be read).
func (s *cpuSampler) Stop() (time.Duration, bool) {
	select {
	case <-s.done:
	default:
		close(s.stop)
		<-s.done
	}
	return s.last, s.ok
}

// machineFacts describes the box for the report.
type machineFacts struct {
	NProc     int
	MemTotal  string
	CPUModel  string
	Kernel    string
	GoVersion string
	LoadStart string
}

func readMachine() machineFacts {
	m := machineFacts{NProc: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				fs := strings.Fields(line)
				if kb, err := strconv.ParseFloat(fs[1], 64); err == nil {
					m.MemTotal = fmt.Sprintf("%.1f GiB", kb/1024/1024)
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				if _, v, ok := strings.Cut(line, ":"); ok {
					m.CPUModel = strings.TrimSpace(v)
					break
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.LoadStart = loadAvg()
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	fs := strings.Fields(string(b))
	if len(fs) < 3 {
		return "?"
	}
	return strings.Join(fs[:3], " ")
}
