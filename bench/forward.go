package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// forwardMain is the minimal forwarder, the latency part's reference
// (`outbox-bench forward ...`, a child process so its CPU is its own): it
// uses pglogrepl and sarama only, no package of the relay. pgoutput proto 1
// on the relay's publication; of each Insert it decodes aggregate_type
// (topic = -topic-prefix + aggregate_type), aggregate_id (key) and payload
// (value), nothing else (no headers, no poison handling, no retries beyond
// sarama's); the record timestamp is the transaction's commit time, as the
// relay sets it. The producer has the relay's settings (idempotent,
// acks=all, one request in flight, murmur2 partitioner, Kafka 3.6.0
// protocol) and, unless -flush-frequency says otherwise, sarama's own
// batching: send at once, batch while a request is in flight. The slot is
// confirmed (standby status update, every -status-interval and when the
// server asks) up to the end of the last transaction whose events are all
// acked. Any produce error ends it with exit status 1: it is a reference for
// the happy path, not a relay.
func forwardMain(args []string) int {
	fs := flag.NewFlagSet("forward", flag.ContinueOnError)
	url := fs.String("pg-url", "", "PostgreSQL URL (replication=database is added)")
	slot := fs.String("slot", "", "logical slot (pgoutput), created beforehand")
	pub := fs.String("publication", "", "publication")
	brokers := fs.String("brokers", "", "Kafka brokers, comma-separated")
	prefix := fs.String("topic-prefix", "", "topic = prefix + aggregate_type")
	flush := fs.Duration("flush-frequency", 0, "sarama Producer.Flush.Frequency (0: unset, sarama's default)")
	status := fs.Duration("status-interval", time.Second, "standby status update interval")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run here")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "forward:", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "forward:", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	n, err := forward(ctx, *url, *slot, *pub, strings.Split(*brokers, ","), *prefix, *flush, *status)
	fmt.Fprintf(os.Stderr, "forward: %d events acked\n", n)
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "forward:", err)
		return 1
	}
	return 0
}

// fwdTxn is one PostgreSQL transaction on its way: the slot may be confirmed
// to end once it is committed (decoded to its end) and nothing is pending.
type fwdTxn struct {
	end       pglogrepl.LSN
	pending   int
	committed bool
}

// fwdAcks is the ack watermark: transactions in commit order.
type fwdAcks struct {
	mu        sync.Mutex
	txns      []*fwdTxn
	confirmed atomic.Uint64
	acked     atomic.Int64
}

// advance pops the finished transactions at the head. Under mu.
func (a *fwdAcks) advance() {
	i := 0
	for ; i < len(a.txns) && a.txns[i].committed && a.txns[i].pending == 0; i++ {
		a.confirmed.Store(uint64(a.txns[i].end))
	}
	if i > 0 {
		a.txns = append(a.txns[:0], a.txns[i:]...)
	}
}

func forward(ctx context.Context, url, slot, pub string, brokers []string, prefix string, flush, status time.Duration) (int64, error) {
	sc := sarama.NewConfig()
	sc.Version = sarama.V3_6_0_0
	sc.ClientID = "outbox-bench-forward"
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.Partitioner = sarama.NewMurmur2Partitioner
	sc.Producer.Flush.Frequency = flush
	sc.Metadata.Full = false
	ap, err := sarama.NewAsyncProducer(brokers, sc)
	if err != nil {
		return 0, fmt.Errorf("kafka: %w", err)
	}
	defer ap.Close()

	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	conn, err := pgconn.Connect(ctx, url+sep+"replication=database")
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"}})
	if err != nil {
		return 0, fmt.Errorf("start replication: %w", err)
	}

	acks := &fwdAcks{}
	fail := make(chan error, 1)
	go func() {
		for m := range ap.Successes() {
			t := m.Metadata.(*fwdTxn)
			acks.mu.Lock()
			t.pending--
			acks.advance()
			acks.mu.Unlock()
			acks.acked.Add(1)
		}
	}()
	go func() {
		for e := range ap.Errors() {
			select {
			case fail <- e.Err:
			default:
			}
		}
	}()

	// Column positions of the outbox table, from its Relation message.
	type rel struct{ aggType, aggID, payload int }
	rels := map[uint32]rel{}
	var cur *fwdTxn
	var commitTime time.Time
	sendStatus := func() error {
		c := pglogrepl.LSN(acks.confirmed.Load())
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: c, WALFlushPosition: c, WALApplyPosition: c})
	}
	next := time.Now().Add(status)
	stop := context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
	defer stop()
	for {
		select {
		case err := <-fail:
			return acks.acked.Load(), fmt.Errorf("produce: %w", err)
		default:
		}
		if !time.Now().Before(next) {
			if err := sendStatus(); err != nil {
				return acks.acked.Load(), err
			}
			next = time.Now().Add(status)
		}
		// A socket deadline, not a context per read: pgconn would start a
		// watcher for every message (the relay reads the same way).
		_ = conn.Conn().SetReadDeadline(next)
		raw, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			if ctx.Err() != nil {
				return acks.acked.Load(), ctx.Err()
			}
			return acks.acked.Load(), err
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok {
			if e, ok := raw.(*pgproto3.ErrorResponse); ok {
				return acks.acked.Load(), pgconn.ErrorResponseToPgError(e)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return acks.acked.Load(), err
			}
			if ka.ReplyRequested {
				next = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return acks.acked.Load(), err
			}
			msg, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return acks.acked.Load(), err
			}
			switch m := msg.(type) {
			case *pglogrepl.RelationMessage:
				r := rel{-1, -1, -1}
				for i, c := range m.Columns {
					switch c.Name {
					case "aggregate_type":
						r.aggType = i
					case "aggregate_id":
						r.aggID = i
					case "payload":
						r.payload = i
					}
				}
				if r.aggType < 0 || r.aggID < 0 || r.payload < 0 {
					return acks.acked.Load(), fmt.Errorf("relation %s.%s has no aggregate_type, aggregate_id and payload columns", m.Namespace, m.RelationName)
				}
				rels[m.RelationID] = r
			case *pglogrepl.BeginMessage:
				cur = &fwdTxn{}
				commitTime = m.CommitTime
				acks.mu.Lock()
				acks.txns = append(acks.txns, cur)
				acks.mu.Unlock()
			case *pglogrepl.InsertMessage:
				r, ok := rels[m.RelationID]
				if !ok || cur == nil {
					return acks.acked.Load(), errors.New("insert before its relation or begin")
				}
				cols := m.Tuple.Columns
				acks.mu.Lock()
				cur.pending++
				acks.mu.Unlock()
				ap.Input() <- &sarama.ProducerMessage{
					Topic:     prefix + string(cols[r.aggType].Data),
					Key:       sarama.ByteEncoder(cols[r.aggID].Data),
					Value:     sarama.ByteEncoder(cols[r.payload].Data),
					Timestamp: commitTime,
					Metadata:  cur,
				}
			case *pglogrepl.CommitMessage:
				acks.mu.Lock()
				cur.end = m.TransactionEndLSN
				cur.committed = true
				acks.advance()
				acks.mu.Unlock()
				cur = nil
			}
		}
	}
}
