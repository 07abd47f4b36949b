package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

func brokersFlag(fs *flag.FlagSet) *string {
	return fs.String("brokers", os.Getenv("OUTBOX_TEST_KAFKA_BROKERS"), "Kafka bootstrap servers (comma-separated)")
}

func splitBrokers(s string) []string { return strings.Split(s, ",") }

// cmdTopics creates, deletes or recreates the event topics outbox.event.<type> of a manifest's types and the
// relay's dead-letter topic outbox.dlq (the relay creates no topic, and waits for all topics of a metadata request
// while one is missing).
func cmdTopics(args []string) error {
	fs := flag.NewFlagSet("topics", flag.ExitOnError)
	brokers := brokersFlag(fs)
	manifest := fs.String("manifest", "", "manifest (its types name the topics)")
	prefix := fs.String("prefix", "outbox.event.", "topic name prefix")
	parts := fs.Int("partitions", 4, "partitions per topic")
	create := fs.Bool("create", false, "create the topics")
	del := fs.Bool("delete", false, "delete every topic starting with outbox. (event topics and outbox.dlq)")
	recreate := fs.Bool("recreate", false, "delete, wait until gone, create")
	dlq := fs.String("dlq", "outbox.dlq", "the relay's dead-letter topic, created too (the relay creates no topic; \"\" = none)")
	_ = fs.Parse(args)
	bs := splitBrokers(*brokers)
	if *del || *recreate {
		if err := deleteAndWait(bs, "outbox."); err != nil {
			return err
		}
	}
	if *create || *recreate {
		m, _, err := readManifest(*manifest)
		if err != nil {
			return err
		}
		var names []string
		for _, t := range m.Types {
			names = append(names, *prefix+t)
		}
		if *dlq != "" {
			names = append(names, *dlq)
		}
		if err := testkit.CreateTopics(bs, int32(*parts), nil, names...); err != nil {
			return err
		}
		// A fresh topic: every partition starts at offset 0 (the comparison compares offsets).
		for _, tp := range names {
			for p := int32(0); p < int32(*parts); p++ {
				var hwm int64
				var err error
				_ = testkit.Poll(30*time.Second, 200*time.Millisecond, func() (bool, error) {
					hwm, err = offsetOf(bs, tp, p, sarama.OffsetNewest)
					return err == nil, nil
				})
				if err != nil || hwm != 0 {
					return fmt.Errorf("topic %s/%d is not empty after create (high-water mark %d, %v)", tp, p, hwm, err)
				}
			}
		}
		fmt.Printf("topics %s with %d partitions each\n", strings.Join(names, ", "), *parts)
	}
	return nil
}

func offsetOf(brokers []string, tp string, p int32, which int64) (int64, error) {
	c, err := sarama.NewClient(brokers, testkit.SaramaConfig())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.GetOffset(tp, p, which)
}

// deleteAndWait deletes every topic with the prefix and waits until the cluster lists none (KRaft deletes
// asynchronously; a create right after a delete could otherwise meet the old topic).
func deleteAndWait(brokers []string, prefix string) error {
	if err := testkit.DeleteTopics(brokers, prefix); err != nil {
		return err
	}
	return testkit.Poll(60*time.Second, 200*time.Millisecond, func() (bool, error) {
		left, err := testkit.Topics(brokers, prefix)
		return err == nil && len(left) == 0, nil
	})
}

// WaitResult is what `wait` measured (JSON, one line).
type WaitResult struct {
	Records    int64   `json:"records"`
	StartUnix  float64 `json:"start_unix"`  // when wait began (or -since)
	FirstUnix  float64 `json:"first_unix"`  // first poll that saw a record
	DoneUnix   float64 `json:"done_unix"`   // first poll that saw all of them
	CPUFirst   float64 `json:"cpu_first_s"` // the process's CPU seconds at FirstUnix (-pid)
	CPUDone    float64 `json:"cpu_done_s"`  // ... at DoneUnix
	RSSPeakKB  int64   `json:"rss_peak_kb"` // VmHWM at DoneUnix
	WithStart  float64 `json:"events_per_s_with_startup"`
	NoStart    float64 `json:"events_per_s_without_startup"`
	CPUPerEvUS float64 `json:"cpu_per_event_us"` // all of the process's CPU (startup included) / records
	PollMS     int     `json:"poll_ms"`
}

// cmdWait polls the high-water marks of the topics with the prefix until they add up to -records (topics are
// fresh: offsets start at 0, no transactions), then prints a WaitResult. With -pid it samples that process's CPU
// and peak RSS from /proc. -since (unix seconds, e.g. when the process was started) is the "with startup" origin.
func cmdWait(args []string) error {
	fs := flag.NewFlagSet("wait", flag.ExitOnError)
	brokers := brokersFlag(fs)
	prefix := fs.String("prefix", "outbox.event.", "topic name prefix")
	want := fs.Int64("records", 0, "records to wait for (required)")
	pid := fs.Int("pid", 0, "process to sample (/proc/PID)")
	since := fs.Float64("since", 0, "origin of the with-startup rate (unix seconds; default: now)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after")
	stall := fs.Duration("stall", 3*time.Minute, "give up when the count has not grown for this long")
	poll := fs.Duration("poll", 50*time.Millisecond, "poll interval")
	out := fs.String("out", "", "also write the result here")
	_ = fs.Parse(args)
	if *want <= 0 {
		return fmt.Errorf("-records is required")
	}
	bs := splitBrokers(*brokers)
	client, err := sarama.NewClient(bs, testkit.SaramaConfig())
	if err != nil {
		return err
	}
	defer client.Close()
	r := WaitResult{StartUnix: unixNow(), PollMS: int(poll.Milliseconds())}
	if *since > 0 {
		r.StartUnix = *since
	}
	deadline := time.Now().Add(*timeout)
	var topics []string
	lastPrint := time.Now()
	lastGrowth, lastSum := time.Now(), int64(-1)
	for {
		if pidGone(*pid) {
			return fmt.Errorf("process %d exited with %d of %d records written", *pid, r.Records, *want)
		}
		if len(topics) == 0 || time.Since(lastPrint) > 2*time.Second {
			_ = client.RefreshMetadata()
			all, err := client.Topics()
			if err == nil {
				topics = topics[:0]
				for _, t := range all {
					if strings.HasPrefix(t, *prefix) {
						topics = append(topics, t)
					}
				}
			}
		}
		var sum int64
		for _, t := range topics {
			parts, err := client.Partitions(t)
			if err != nil {
				continue
			}
			for _, p := range parts {
				if o, err := client.GetOffset(t, p, sarama.OffsetNewest); err == nil {
					sum += o
				}
			}
		}
		now := unixNow()
		if sum > 0 && r.FirstUnix == 0 {
			r.FirstUnix = now
			r.CPUFirst = cpuOf(*pid)
		}
		r.Records = sum
		if sum >= *want {
			r.DoneUnix = now
			r.CPUDone = cpuOf(*pid)
			r.RSSPeakKB = hwmOf(*pid)
			break
		}
		if sum != lastSum {
			lastGrowth, lastSum = time.Now(), sum
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s with %d of %d records", *timeout, sum, *want)
		}
		if time.Since(lastGrowth) > *stall {
			return fmt.Errorf("stuck at %d of %d records for %s", sum, *want, *stall)
		}
		if time.Since(lastPrint) > 10*time.Second {
			fmt.Fprintf(os.Stderr, "wait: %d of %d records\n", sum, *want)
			lastPrint = time.Now()
		}
		time.Sleep(*poll)
	}
	if r.Records > *want {
		return fmt.Errorf("%d records, more than the %d expected", r.Records, *want)
	}
	r.WithStart = float64(r.Records) / (r.DoneUnix - r.StartUnix)
	if r.DoneUnix > r.FirstUnix {
		r.NoStart = float64(r.Records) / (r.DoneUnix - r.FirstUnix)
	}
	if *pid > 0 {
		r.CPUPerEvUS = r.CPUDone / float64(r.Records) * 1e6
	}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	if *out != "" {
		return os.WriteFile(*out, append(b, '\n'), 0o644)
	}
	return nil
}

func unixNow() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func pidGone(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] == 'Z'
}

// cpuOf is user+system CPU seconds of a process (0 without one).
func cpuOf(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	var ut, st float64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return (ut + st) / 100 // USER_HZ: 100 on Linux
}

// hwmOf is VmHWM (peak RSS) in kB.
func hwmOf(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb int64
			fmt.Sscan(strings.Fields(line)[1], &kb)
			return kb
		}
	}
	return 0
}

// Header is one Kafka record header, in record order.
type Header struct {
	Name  string `json:"n"`
	Value []byte `json:"v"` // nil = a null header value
}

// Rec is one record as dumped: keys and values keep null apart from empty (nil encodes as JSON null).
type Rec struct {
	Topic     string   `json:"t"`
	Partition int32    `json:"p"`
	Offset    int64    `json:"o"`
	Key       []byte   `json:"k"`
	Value     []byte   `json:"v"`
	Headers   []Header `json:"h"`
	TSMillis  int64    `json:"ts"`
}

// cmdDump reads every partition of every topic with the prefix from the oldest offset to the high-water mark
// with a real consumer and writes each record (bytes exactly) as a JSON line, sorted by topic, partition, offset.
func cmdDump(args []string) error {
	fs := flag.NewFlagSet("dump", flag.ExitOnError)
	brokers := brokersFlag(fs)
	prefix := fs.String("prefix", "outbox.", "topic name prefix (outbox. includes the relay's outbox.dlq)")
	out := fs.String("out", "", "output file (required)")
	_ = fs.Parse(args)
	if *out == "" {
		return fmt.Errorf("-out is required")
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	n := 0
	err = consumeAll(splitBrokers(*brokers), *prefix, func(r Rec) error {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		w.Write(append(b, '\n'))
		n++
		return nil
	})
	if err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Printf("dumped %d records to %s\n", n, *out)
	return nil
}

// consumeAll reads every partition of every topic with the prefix from the oldest offset to the high-water mark
// it has now, in topic, partition, offset order, handing each record to f. Any consume error is an error.
func consumeAll(brokers []string, prefix string, f func(Rec) error) error {
	cfg := testkit.SaramaConfig()
	cfg.Consumer.Fetch.Default = 4 << 20
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return err
	}
	defer consumer.Close()
	if err := client.RefreshMetadata(); err != nil {
		return err
	}
	all, err := client.Topics()
	if err != nil {
		return err
	}
	slices.Sort(all)
	for _, tp := range all {
		if !strings.HasPrefix(tp, prefix) {
			continue
		}
		parts, err := client.Partitions(tp)
		if err != nil {
			return err
		}
		slices.Sort(parts)
		for _, p := range parts {
			hwm, err := client.GetOffset(tp, p, sarama.OffsetNewest)
			if err != nil {
				return fmt.Errorf("high-water mark of %s/%d: %w", tp, p, err)
			}
			if hwm == 0 {
				continue
			}
			pc, err := consumer.ConsumePartition(tp, p, sarama.OffsetOldest)
			if err != nil {
				return fmt.Errorf("consume %s/%d: %w", tp, p, err)
			}
			for done := false; !done; {
				select {
				case m := <-pc.Messages():
					r := Rec{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, TSMillis: m.Timestamp.UnixMilli()}
					for _, h := range m.Headers {
						r.Headers = append(r.Headers, Header{Name: string(h.Key), Value: h.Value})
					}
					if err := f(r); err != nil {
						pc.Close()
						return err
					}
					done = m.Offset >= hwm-1
				case err := <-pc.Errors():
					pc.Close()
					return fmt.Errorf("consume %s/%d: %w", tp, p, err)
				case <-time.After(30 * time.Second):
					pc.Close()
					return fmt.Errorf("consume %s/%d: stuck before offset %d", tp, p, hwm-1)
				}
			}
			pc.Close()
		}
	}
	return nil
}

func readDump(path string) ([]Rec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	var out []Rec
	for sc.Scan() {
		var r Rec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New(path + ": no records")
	}
	return out, nil
}
