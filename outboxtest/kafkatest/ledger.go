package kafkatest

import (
	"cmp"
	"slices"

	"github.com/sqloutbox/outbox/outboxtest"
)

// Row is one committed outbox event, as read back from the outbox table
// after a run: what the database says must be delivered. It is
// [outboxtest.Row]; see there for its fields and the query that reads
// them.
type Row = outboxtest.Row

// Ledger is the outcome of [Check]: the committed rows joined with the
// consumed records by message ID (lost, ghosts, records without a message
// ID, duplicates, order violations). It is [outboxtest.Ledger]; see there
// for its fields and [outboxtest.Ledger.Err].
type Ledger = outboxtest.Ledger

// OrderViolation is one first delivery out of outbox-id order. It is
// [outboxtest.OrderViolation].
type OrderViolation = outboxtest.OrderViolation

// Sentinel errors of [Ledger.Err], matched with errors.Is: the values of
// outboxtest, so either name matches.
var (
	// ErrLost: a committed event was never delivered ([outboxtest.ErrLost]).
	ErrLost = outboxtest.ErrLost
	// ErrGhost: a delivered record matches no committed event
	// ([outboxtest.ErrGhost]).
	ErrGhost = outboxtest.ErrGhost
	// ErrOrder: an aggregate's events were first delivered out of
	// outbox-id order ([outboxtest.ErrOrder]).
	ErrOrder = outboxtest.ErrOrder
)

// Check joins rows (the committed events) with recs (what a [Consumer]
// received, in any order, duplicates included) by message ID and returns
// the [Ledger]: lost rows, ghosts, duplicates and order violations.
//
// Order is judged on first deliveries in (topic, partition, offset)
// order, which is the order a consumer of one partition sees: the relay
// keys an aggregate's records by its aggregate ID, so they share one
// partition. A record that is a duplicate of an earlier offset is not a
// first delivery and is never an order violation. Rows with the same
// message ID are a caller error: the last one given wins. Check does not
// modify its arguments. It sorts and calls [outboxtest.Check].
func Check(rows []Row, recs []Record) Ledger {
	ordered := slices.Clone(recs)
	slices.SortStableFunc(ordered, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	return outboxtest.Check(rows, outboxtest.MessageIDs(ordered, Record.MessageID))
}
