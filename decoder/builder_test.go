package decoder_test

import (
	"encoding/binary"

	"github.com/outbox-relay/outbox-relay/decoder/pgoutputtest"
)

// The decoder tests' short names for the pgoutput builders.

var be = binary.BigEndian

type tv = pgoutputtest.Col

var (
	commitTime     = pgoutputtest.CommitTime
	begin          = pgoutputtest.Begin
	commit         = pgoutputtest.Commit
	relation       = pgoutputtest.Relation
	text           = pgoutputtest.Text
	bin            = pgoutputtest.Bin
	null           = pgoutputtest.Null
	toast          = pgoutputtest.Toast
	insert         = pgoutputtest.Insert
	update         = pgoutputtest.Update
	del            = pgoutputtest.Delete
	truncate       = pgoutputtest.Truncate
	origin         = pgoutputtest.Origin
	typ            = pgoutputtest.Type
	message        = pgoutputtest.Message
	outboxRelation = pgoutputtest.OutboxRelation
	row            = pgoutputtest.Row
	outboxCols     = pgoutputtest.OutboxCols
)

const (
	outboxID = pgoutputtest.OutboxID
	ordersID = pgoutputtest.OrdersID
)
