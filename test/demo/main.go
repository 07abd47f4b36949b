// Command demo is the viewer behind `make demo`. While examples/orders
// writes orders and their outbox events and examples/billing consumes them
// with package inbox, it prints every record of every outbox topic (topics
// starting with --topic-prefix, found as the relay creates them) and of the
// dead-letter topic (with its dlq.reason), the relay's lag, and a footer
// (--footer, a text file) that stays on screen: pinned to the bottom of the
// terminal when there is one (/dev/tty), else printed again every 30 s. Once
// it publishes a few records the relay already delivered a second time (as a
// relay restart or rewind would), so that billing shows "skipped duplicate".
// It never dies on a closed stdout: its writes then fail silently.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/sample"
)

func main() {
	pg, brokers := sample.PostgresURL(), sample.KafkaBrokers()
	metrics := flag.String("metrics", "http://127.0.0.1:9187/metrics", "relay metrics URL")
	prefix := flag.String("topic-prefix", "outbox.event.", "follow every topic whose name starts with this (the relay's topic template up to its first placeholder)")
	dlq := flag.String("dlq-topic", "outbox.dlq", "the dead-letter topic")
	orderTopic := flag.String("republish-topic", "outbox.event.order", "the topic some records are published to again")
	footer := flag.String("footer", "", "text file shown as a footer")
	after := flag.Duration("republish-after", 8*time.Second, "when to publish a few delivered records again")
	count := flag.Int("republish", 3, "how many records to publish again")
	duration := sample.Duration()
	flag.Parse()
	ctx, stop := sample.Context(*duration, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	scr := newScreen(os.Stdout, *footer)
	defer scr.close()
	db, err := pgxpool.New(ctx, *pg)
	if err != nil {
		scr.line("demo     " + err.Error())
		os.Exit(1)
	}
	defer db.Close()
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(*after):
		}
		if err := republish(scr, strings.Split(*brokers, ","), *orderTopic, *count); err != nil {
			scr.line("demo     republish: " + err.Error())
		}
	}()
	go follow(ctx, scr, strings.Split(*brokers, ","), *prefix, *dlq)
	status(ctx, scr, *metrics, db)
}

// screen is the one writer of the viewer's output: lines to out, and the
// footer, pinned below a scroll region of the terminal or reprinted.
type screen struct {
	mu     sync.Mutex
	out    io.Writer
	tty    *os.File // nil: no terminal, the footer is reprinted
	footer []string
	status string
	rows   int // footer rows on the terminal, 0 before the first draw
	height int
	last   time.Time
}

func newScreen(out io.Writer, footerFile string) *screen {
	s := &screen{out: out}
	if footerFile != "" {
		if b, err := os.ReadFile(footerFile); err == nil {
			s.footer = strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		}
	}
	if os.Getenv("TERM") != "dumb" && os.Getenv("TERM") != "" {
		if f, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			if _, _, ok := winsize(f); ok {
				s.tty = f
			} else {
				f.Close()
			}
		}
	}
	// The log (stdout not a terminal) gets the footer once at the start; the
	// terminal, if any, keeps it pinned.
	if !isTerminal(out) || s.tty == nil {
		s.printFooter()
	}
	if s.tty != nil {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		go func() {
			for range winch {
				s.mu.Lock()
				s.draw(true)
				s.mu.Unlock()
			}
		}()
		s.mu.Lock()
		s.draw(true)
		s.mu.Unlock()
	}
	s.last = time.Now()
	return s
}

// line prints one line (errors ignored: stdout may be a closed pipe).
func (s *screen) line(l string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = io.WriteString(s.out, l+"\n")
}

// setStatus shows the status line: the footer's first line on a terminal,
// else a printed line; without a terminal the footer is printed again every
// 30 s.
func (s *screen) setStatus(st string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = st
	if s.tty != nil {
		s.draw(false)
		return
	}
	_, _ = io.WriteString(s.out, st+"\n")
	if time.Since(s.last) >= 30*time.Second {
		s.printFooter()
		s.last = time.Now()
	}
}

func (s *screen) printFooter() {
	if len(s.footer) == 0 {
		return
	}
	rule := "---- try this " + strings.Repeat("-", 60)
	_, _ = io.WriteString(s.out, rule+"\n"+strings.Join(s.footer, "\n")+"\n"+strings.Repeat("-", len(rule))+"\n")
}

// draw paints the footer below the scroll region in one write (so no other
// process's output lands inside it). layout: set the scroll region first
// (at the start and after a resize). Holds s.mu.
func (s *screen) draw(layout bool) {
	w, h, ok := winsize(s.tty)
	if !ok {
		return
	}
	lines := append([]string{s.status}, s.footer...)
	rows := 0
	for _, l := range lines {
		rows += max(1, (len(l)+w-1)/w)
	}
	rows++ // the rule
	if h-rows < 5 {
		return // too small a terminal: no footer
	}
	var b strings.Builder
	if layout || s.rows != rows || s.height != h {
		if s.rows == 0 {
			b.WriteString(strings.Repeat("\n", rows)) // make room at the bottom
		}
		fmt.Fprintf(&b, "\x1b[1;%dr\x1b[%d;1H", h-rows, h-rows) // scroll region; cursor to its last row
		s.rows, s.height = rows, h
	}
	b.WriteString("\x1b7") // save the cursor
	row := h - rows + 1
	fmt.Fprintf(&b, "\x1b[%d;1H\x1b[J%s", row, strings.Repeat("-", w))
	row++
	for _, l := range lines {
		fmt.Fprintf(&b, "\x1b[%d;1H%s", row, l)
		row += max(1, (len(l)+w-1)/w)
	}
	b.WriteString("\x1b8") // restore the cursor
	_, _ = io.WriteString(s.tty, b.String())
}

// close gives the terminal its full height back; the footer stays visible.
func (s *screen) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tty == nil || s.rows == 0 {
		return
	}
	_, h, _ := winsize(s.tty)
	fmt.Fprintf(s.tty, "\x1b[r\x1b[%d;1H\n", h)
	s.rows = 0
}

func winsize(f *os.File) (w, h int, ok bool) {
	var ws struct{ Row, Col, X, Y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
	if errno != 0 || ws.Col == 0 || ws.Row == 0 {
		return 0, 0, false
	}
	return int(ws.Col), int(ws.Row), true
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, _, ok = winsize(f)
	return ok
}

// follow prints every record of every topic starting with prefix and of the
// dead-letter topic, from the oldest; it looks for new topics and partitions
// every 2 s (the relay creates a topic at its first event).
func follow(ctx context.Context, scr *screen, brokers []string, prefix, dlq string) {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Consumer.Return.Errors = false
	var client sarama.Client
	var consumer sarama.Consumer
	for client == nil {
		c, err := sarama.NewClient(brokers, cfg)
		if err == nil {
			client = c
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		scr.line("demo     kafka consumer: " + err.Error())
		return
	}
	defer consumer.Close()
	followed := map[string]bool{}
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		_ = client.RefreshMetadata()
		topics, _ := client.Topics()
		sort.Strings(topics)
		for _, topic := range topics {
			if !strings.HasPrefix(topic, prefix) && topic != dlq {
				continue
			}
			parts, err := client.Partitions(topic)
			if err != nil {
				continue
			}
			for _, p := range parts {
				key := fmt.Sprintf("%s/%d", topic, p)
				if followed[key] {
					continue
				}
				pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
				if err != nil {
					continue
				}
				followed[key] = true
				go func() {
					defer pc.AsyncClose()
					for {
						select {
						case <-ctx.Done():
							return
						case m, ok := <-pc.Messages():
							if !ok {
								return
							}
							scr.line(describe(m, topic == dlq))
						}
					}
				}()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// describe is one record as a line: the relay's headers, and for a dead
// letter its reason, original topic and error.
func describe(m *sarama.ConsumerMessage, dead bool) string {
	h := map[string]string{}
	for _, rh := range m.Headers {
		h[string(rh.Key)] = string(rh.Value)
	}
	where := fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)
	if dead {
		e := h["dlq.error"]
		if len(e) > 120 {
			e = e[:117] + "..."
		}
		orig := ""
		if t := h["dlq.original_topic"]; t != "" {
			orig = " original_topic=" + t
		}
		return fmt.Sprintf("DEAD LETTER %s reason=%s%s event_id=%s key=%s error=%q",
			where, h["dlq.reason"], orig, h["dlq.event_id"], m.Key, e)
	}
	return fmt.Sprintf("kafka    %-24s %-16s %-16s event_id=%s", where, h["event_type"], m.Key, h["event_id"])
}

// republish reads the last n records of the topic's first non-empty
// partition and produces them again, headers (event_id) included.
func republish(scr *screen, brokers []string, topic string, n int) error {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return err
	}
	// The partition with the most records.
	p, newest := int32(-1), int64(0)
	for _, q := range parts {
		if n, err := client.GetOffset(topic, q, sarama.OffsetNewest); err == nil && n > newest {
			p, newest = q, n
		}
	}
	if p >= 0 {
		consumer, err := sarama.NewConsumerFromClient(client)
		if err != nil {
			return err
		}
		defer consumer.Close()
		from := max(newest-int64(n), 0)
		pc, err := consumer.ConsumePartition(topic, p, from)
		if err != nil {
			return err
		}
		var again []*sarama.ProducerMessage
		var ids []string
		for m := range pc.Messages() {
			var hs []sarama.RecordHeader
			for _, h := range m.Headers {
				hs = append(hs, *h)
				if string(h.Key) == "event_id" {
					ids = append(ids, string(h.Value))
				}
			}
			again = append(again, &sarama.ProducerMessage{Topic: topic, Partition: p, Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(m.Value), Headers: hs})
			if m.Offset >= newest-1 {
				break
			}
		}
		pc.AsyncClose()
		producer, err := sarama.NewSyncProducerFromClient(client)
		if err != nil {
			return err
		}
		defer producer.Close()
		if err := producer.SendMessages(again); err != nil {
			return err
		}
		scr.line(fmt.Sprintf("demo     published %d delivered records again (event_id %s), as a relay restart would: billing must skip them",
			len(again), strings.Join(ids, ", ")))
		return nil
	}
	return fmt.Errorf("no record in %s yet", topic)
}

// status shows the relay's lag and the end-to-end counts every second (a
// line every 3 s without a terminal).
func status(ctx context.Context, scr *screen, url string, db *pgxpool.Pool) {
	every := time.Second
	if scr.tty == nil {
		every = 3 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		scr.setStatus(statusLine(ctx, url, db))
	}
}

func statusLine(ctx context.Context, url string, db *pgxpool.Pool) string {
	m, err := scrape(url)
	relay := "relay DOWN (restarting?)"
	if err == nil {
		relay = fmt.Sprintf("relay ready=%.0f lag_seconds=%.1f slot_lag=%s %s published=%.0f",
			m["outbox_relay_ready"], m["outbox_relay_lag_seconds"], bytes(m["outbox_relay_slot_lag_bytes"]),
			undelivered(m), m["outbox_relay_events_published_total"])
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var written, billed, dead int64
	err = db.QueryRow(qctx, `SELECT
		(SELECT count(*) FROM public.outbox WHERE aggregate_type = 'order' AND dead_lettered_at IS NULL),
		(SELECT count(*) FROM public.processed_events),
		(SELECT count(*) FROM public.outbox WHERE dead_lettered_at IS NOT NULL AND dlq_resolved_at IS NULL)`).Scan(&written, &billed, &dead)
	if err != nil {
		return "status   " + relay
	}
	return fmt.Sprintf("status   %s | order events written=%d billed=%d | dead letters=%d", relay, written, billed, dead)
}

// undelivered shows outbox_relay_undelivered_events: "undelivered=N" when
// it is exact (outbox_relay_undelivered_exact 1: the slot confirmed past
// the count; 0 when the relay is caught up), "undelivered<=N" when it is a
// bound by the delivered horizon's sample (the relay has not confirmed
// past the count yet).
func undelivered(m map[string]float64) string {
	if m["outbox_relay_undelivered_exact"] == 1 {
		return fmt.Sprintf("undelivered=%.0f", m["outbox_relay_undelivered_events"])
	}
	return fmt.Sprintf("undelivered<=%.0f", m["outbox_relay_undelivered_events"])
}

func bytes(f float64) string {
	switch {
	case f >= 1<<20:
		return fmt.Sprintf("%.1fMiB", f/(1<<20))
	case f >= 1<<10:
		return fmt.Sprintf("%.1fKiB", f/(1<<10))
	}
	return fmt.Sprintf("%.0fB", f)
}

func scrape(url string) (map[string]float64, error) {
	out := map[string]float64{}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := f[0]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			out[name] += v
		}
	}
	return out, sc.Err()
}
