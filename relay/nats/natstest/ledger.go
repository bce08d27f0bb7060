package natstest

import (
	"cmp"
	"slices"

	"github.com/sqloutbox/outbox/outboxtest"
)

// Check joins rows (the committed events, read back from the outbox
// table) with recs (what a [Consumer] received, in any order, duplicates
// included) by outbox message ID and returns the [outboxtest.Ledger]:
// lost rows, ghosts (records of no row, records without a message ID),
// duplicates and order violations; its Err matches [outboxtest.ErrLost],
// [outboxtest.ErrGhost] and [outboxtest.ErrOrder].
//
// Order is judged on first deliveries in stream sequence order
// ([Record.Sequence]): the order in which the stream stored the messages,
// and so the order in which every consumer reading the stream in order
// (an ordered consumer such as [Consumer], a durable consumer with one
// message in flight) delivers them. The publisher publishes an
// aggregate's next message only after the previous one's PubAck, that is
// after the stream stored it, so an aggregate's messages must be stored
// in outbox-id order. Sequences are per stream; records of several
// streams may be given together as long as each aggregate's messages are
// in one stream (the one binding its subjects), since sorting by sequence
// keeps each stream's own order.
//
// A message the publisher sends again within the stream's duplicate
// window ([DefaultDuplicates] for [CreateStream]) has the same
// Nats-Msg-Id and is stored once, so it shows up once; one stored twice
// (after the window, or sent with another Nats-Msg-Id) counts in
// Duplicates. Check does not modify its arguments; it sorts and calls
// [outboxtest.Check].
func Check(rows []outboxtest.Row, recs []Record) outboxtest.Ledger {
	ordered := slices.Clone(recs)
	slices.SortStableFunc(ordered, func(a, b Record) int { return cmp.Compare(a.Sequence, b.Sequence) })
	return outboxtest.Check(rows, outboxtest.MessageIDs(ordered, Record.MessageID))
}
