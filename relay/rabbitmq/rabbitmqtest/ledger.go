package rabbitmqtest

import (
	"github.com/sqloutbox/outbox/outboxtest"
)

// Check joins rows (the committed events, read back from the outbox
// table) with recs (the records of one [Consumer], as [Consumer.Records]
// or a Wait returns them, duplicates included) by outbox message ID and
// returns the [outboxtest.Ledger]: lost rows, ghosts (records of no row,
// records without a message ID), duplicates and order violations; its
// Err matches [outboxtest.ErrLost], [outboxtest.ErrGhost] and
// [outboxtest.ErrOrder].
//
// Order is judged on first deliveries in the order of recs, which must
// be delivery order as received: a queue has no sequence number a
// record could be sorted by, and the order one consumer receives a queue
// in is the order the broker routed the messages into it: a message
// published after another one was confirmed is routed after it. The
// publisher publishes an aggregate's next message only after the broker
// confirmed the previous one, so each aggregate's messages must arrive
// in outbox-id order. Do not sort recs, nor merge the records of
// several consumers unless each aggregate is routed to one of their
// queues only (concatenate them then, each in its own order).
//
// RabbitMQ does not deduplicate: a message the relay sends again (after
// an outage, a lost confirm) is delivered again and counts in
// Duplicates, never as an order violation. Check does not modify its
// arguments; it calls [outboxtest.Check].
func Check(rows []outboxtest.Row, recs []Record) outboxtest.Ledger {
	return outboxtest.Check(rows, outboxtest.MessageIDs(recs, Record.MessageID))
}
