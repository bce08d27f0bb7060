package kafkatest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Row is one committed outbox event, as read back from the outbox table
// after a run: what the database says must be delivered. Read the rows
// with a plain query, e.g. (default table name)
//
//	SELECT id, message_id, aggregate_type, aggregate_id FROM outbox
type Row struct {
	// ID is the row's outbox id (the table's auto-increment key): the
	// order in which an aggregate's events must first be delivered.
	ID int64
	// MessageID is the row's message_id, the value of the
	// [emit.HeaderMessageID] header of its records.
	MessageID string
	// AggregateType and AggregateID identify the aggregate; order is
	// judged per aggregate.
	AggregateType, AggregateID string
}

// Ledger is the outcome of [Check]: the committed rows joined with the
// consumed records by message ID. The slices are sorted (IDs
// lexicographically, violations by aggregate and then the later row's
// id), so two Ledgers of the same inputs compare equal.
type Ledger struct {
	// Committed is the number of rows given.
	Committed int
	// Delivered is the number of rows with at least one record.
	Delivered int
	// Lost holds the message IDs of rows that no record carries.
	Lost []string
	// Ghosts holds the distinct message IDs of records that match no row
	// (an event published although its transaction did not commit, or a
	// record of another producer on the topic).
	Ghosts []string
	// NoMessageID counts records without an [emit.HeaderMessageID]
	// header: not outbox records at all; they are ghosts too.
	NoMessageID int
	// Duplicates counts records whose message ID was received before
	// (at-least-once delivery allows them; [Ledger.Err] does not fail on
	// them).
	Duplicates int
	// OrderViolations lists first deliveries that came after the first
	// delivery of a later row of the same aggregate.
	OrderViolations []OrderViolation
}

// OrderViolation is one first delivery out of outbox-id order: row Got
// of the aggregate was first delivered after row After (After > Got).
type OrderViolation struct {
	AggregateType, AggregateID string
	// Got is the outbox id first delivered late; After is the highest
	// outbox id of the aggregate first delivered before it.
	Got, After int64
}

// Sentinel errors of [Ledger.Err], matched with errors.Is.
var (
	// ErrLost: a committed event was never delivered.
	ErrLost = errors.New("kafkatest: committed events not delivered")
	// ErrGhost: a delivered record matches no committed event.
	ErrGhost = errors.New("kafkatest: records of events that were not committed")
	// ErrOrder: an aggregate's events were first delivered out of
	// outbox-id order.
	ErrOrder = errors.New("kafkatest: aggregate order broken")
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
// modify its arguments.
func Check(rows []Row, recs []Record) Ledger {
	byMsg := make(map[string]Row, len(rows))
	for _, r := range rows {
		byMsg[r.MessageID] = r
	}
	ordered := slices.Clone(recs)
	slices.SortStableFunc(ordered, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	type agg struct{ typ, id string }
	l := Ledger{Committed: len(byMsg)}
	seen := make(map[string]bool, len(recs))
	ghosts := map[string]bool{}
	highest := map[agg]int64{}
	for _, rec := range ordered {
		mid, ok := rec.MessageID()
		if !ok {
			l.NoMessageID++
			continue
		}
		if seen[mid] {
			l.Duplicates++
			continue
		}
		seen[mid] = true
		row, ok := byMsg[mid]
		if !ok {
			ghosts[mid] = true
			continue
		}
		l.Delivered++
		a := agg{row.AggregateType, row.AggregateID}
		if h, ok := highest[a]; ok && row.ID < h {
			l.OrderViolations = append(l.OrderViolations, OrderViolation{row.AggregateType, row.AggregateID, row.ID, h})
		} else {
			highest[a] = row.ID
		}
	}
	for mid := range byMsg {
		if !seen[mid] {
			l.Lost = append(l.Lost, mid)
		}
	}
	for mid := range ghosts {
		l.Ghosts = append(l.Ghosts, mid)
	}
	slices.Sort(l.Lost)
	slices.Sort(l.Ghosts)
	slices.SortFunc(l.OrderViolations, func(a, b OrderViolation) int {
		return cmp.Or(cmp.Compare(a.AggregateType, b.AggregateType), cmp.Compare(a.AggregateID, b.AggregateID), cmp.Compare(a.Got, b.Got))
	})
	return l
}

// OK reports whether the run kept the outbox's delivery invariants:
// nothing lost, no ghost (with or without a message ID), no order
// violation. Duplicates are allowed.
func (l Ledger) OK() bool { return l.Err() == nil }

// Err returns nil if [Ledger.OK], else an error that matches [ErrLost],
// [ErrGhost] and [ErrOrder] (errors.Is) for each broken invariant and
// names up to five IDs of each.
func (l Ledger) Err() error {
	var errs []error
	if len(l.Lost) > 0 {
		errs = append(errs, fmt.Errorf("%w: %d of %d (%s)", ErrLost, len(l.Lost), l.Committed, firstFew(l.Lost)))
	}
	if n := len(l.Ghosts) + l.NoMessageID; n > 0 {
		errs = append(errs, fmt.Errorf("%w: %d (%d without a message ID; %s)", ErrGhost, n, l.NoMessageID, firstFew(l.Ghosts)))
	}
	if len(l.OrderViolations) > 0 {
		var s []string
		for _, v := range l.OrderViolations {
			s = append(s, fmt.Sprintf("%s/%s: id %d after %d", v.AggregateType, v.AggregateID, v.Got, v.After))
		}
		errs = append(errs, fmt.Errorf("%w: %d (%s)", ErrOrder, len(l.OrderViolations), firstFew(s)))
	}
	return errors.Join(errs...)
}

// firstFew joins up to five of s, noting how many more there are.
func firstFew(s []string) string {
	const n = 5
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(", and %d more", len(s)-n)
}
