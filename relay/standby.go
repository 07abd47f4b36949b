package relay

import (
	"context"

	"github.com/outbox-relay/outbox-relay/decoder"
)

// standbyGate holds a transaction back until the standbys of
// postgres.standby_slots have flushed it (*standby.Gate).
type standbyGate interface {
	WaitTxn(ctx context.Context, txn *decoder.Txn) error
}

// SetStandby makes the pipeline wait on g before publishing each
// transaction; without it (postgres.standby_slots unset) nothing waits.
// Call before the stream runs.
func (p *Pipeline) SetStandby(g standbyGate) { p.standby = g }
