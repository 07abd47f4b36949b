package relay

import (
	"context"

	"github.com/outbox-relay/outbox-relay/decoder"
	"github.com/outbox-relay/outbox-relay/history"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Delivery is the one seam between the pipeline and Kafka. The pipeline
// hands it each PostgreSQL transaction (or chunk of one, decoder.Txn), on
// the replication loop goroutine: Begin, then Publish for each record the
// transaction has, then End. Verdicts come back through the ack path
// (Pipeline.Acked, which the term registers with the delivery's OnAcked)
// and each record's Done for failures. Two deliveries implement it:
// at-least-once (atLeastOnce, over sink.Producer) and exactly-once
// (exactlyonce.Delivery, Kafka transactions and a checkpoint).
type Delivery interface {
	// Begin is called before txn enters the tracker (where backpressure
	// blocks). An error ends the session (replication.ErrRestart rewinds).
	// It may block until ctx ends.
	Begin(ctx context.Context, txn *decoder.Txn) error
	// Publish hands m over and returns; its verdict comes later. Also
	// called from the pipeline's retry goroutine for a dead letter resent
	// alone. It must return once the delivery is stopped, whatever ctx.
	Publish(ctx context.Context, m *sink.Message) error
	// End follows the last Publish of txn. It does not block.
	End(txn *decoder.Txn)
	// Flush is called when the session ends, before the pipeline waits for
	// the acks of everything published: what the delivery holds back must
	// now get its verdict. It may block.
	Flush()
	// Restart is called once the pipeline dropped what was in flight and
	// reads again from its watermark (after every Drain).
	Restart()
}

// atLeastOnce is delivery: at_least_once: every record goes to the
// producer (*sink.Producer) as it comes, and each ack moves the watermark.
type atLeastOnce struct{ publisher }

// publisher is what atLeastOnce needs of its producer.
type publisher interface {
	Publish(ctx context.Context, m *sink.Message) error
}

func (atLeastOnce) Begin(context.Context, *decoder.Txn) error { return nil }
func (atLeastOnce) End(*decoder.Txn)                          {}
func (atLeastOnce) Flush()                                    {} // the producer flushes on its own
func (atLeastOnce) Restart()                                  {}

// Keeper is a Delivery that keeps a position of its own across sessions and
// processes: exactly-once's checkpoint, the last PostgreSQL transaction
// committed to Kafka. The pipeline asks for it at every session start and
// applies it only on the history it was taken on (package history).
type Keeper interface {
	// Kept tells the delivery the history of the session about to start
	// (the history its next positions belong to) and returns its position,
	// ok false when it has none. It blocks until the position is known
	// (the checkpoint read) or ctx ends.
	Kept(ctx context.Context, m history.Mark) (p history.Point, ok bool, err error)
}
