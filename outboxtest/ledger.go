package outboxtest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sqloutbox/outbox/relay"
)

// Row is one committed outbox event, as read back from the outbox table
// after a run: what the database says must be delivered. Read the rows
// with a plain query, e.g. (default table name)
//
//	SELECT id, message_id, aggregate_type, aggregate_id FROM outbox_message
type Row struct {
	// ID is the row's outbox id (the table's auto-increment key): the
	// order in which an aggregate's events must first be delivered.
	ID int64
	// MessageID is the row's message_id, the value of the
	// [github.com/sqloutbox/outbox/emit.HeaderMessageID] header of its
	// records.
	MessageID string
	// AggregateType and AggregateID identify the aggregate; order is
	// judged per aggregate.
	AggregateType, AggregateID string
}

// Ledger is the outcome of [Check] (and of each broker kit's Check): the
// committed rows joined with the deliveries by message ID. The slices are
// sorted (IDs lexicographically, violations by aggregate and then the
// later row's id) and nil when empty, so two Ledgers of the same inputs
// compare equal.
type Ledger struct {
	// Committed is the number of distinct message IDs among the rows.
	Committed int
	// Delivered is the number of rows with at least one delivery.
	Delivered int
	// Lost holds the message IDs of rows that no delivery carries.
	Lost []string
	// Ghosts holds the distinct message IDs of deliveries that match no
	// row (an event published although its transaction did not commit, or
	// a record of another producer on the same topic, stream or queue).
	Ghosts []string
	// NoMessageID counts deliveries without a message ID (no
	// [github.com/sqloutbox/outbox/emit.HeaderMessageID] header, or an
	// empty one): not outbox records at all; they are ghosts too.
	NoMessageID int
	// Duplicates counts deliveries whose message ID was delivered before
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

// Sentinel errors of [Ledger.Err], matched with errors.Is. The broker
// kits' names for them (kafkatest.ErrLost and so on) are the same values.
var (
	// ErrLost: a committed event was never delivered.
	ErrLost = errors.New("outboxtest: committed events not delivered")
	// ErrGhost: a delivered record matches no committed event.
	ErrGhost = errors.New("outboxtest: records of events that were not committed")
	// ErrOrder: an aggregate's events were first delivered out of
	// outbox-id order.
	ErrOrder = errors.New("outboxtest: aggregate order broken")
)

// Check joins rows (the committed events) with deliveries by message ID
// and returns the [Ledger]: lost rows, ghosts, duplicates and order
// violations. It knows no broker: messageIDs[i] is the outbox message ID
// of the i-th delivery ("" for a record without one), duplicates
// included, in the order a consumer of each aggregate saw them. Only the
// order of an aggregate's own deliveries among themselves is judged, so
// deliveries of different aggregates may interleave in any way (records
// of several partitions or streams may simply be concatenated, each in
// its own order); putting the records of a broker in that order is the
// broker kit's job (kafkatest.Check and the others do it, then call
// this).
//
// Order is judged on first deliveries: a message ID seen before is a
// duplicate, never an order violation. Rows with the same message ID are
// a caller error: the last one given wins. Check does not modify its
// arguments.
func Check(rows []Row, messageIDs []string) Ledger {
	byMsg := make(map[string]Row, len(rows))
	for _, r := range rows {
		byMsg[r.MessageID] = r
	}
	type agg struct{ typ, id string }
	l := Ledger{Committed: len(byMsg)}
	seen := make(map[string]bool, len(messageIDs))
	ghosts := map[string]bool{}
	highest := map[agg]int64{}
	for _, mid := range messageIDs {
		if mid == "" {
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

// MessageIDs returns the message ID of each of recs, in order, as [Check]
// takes them: messageID returns a record's ID and whether it has one
// (a kit's Record.MessageID method expression fits); a record without
// one gives "".
func MessageIDs[R any](recs []R, messageID func(R) (string, bool)) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		if id, ok := messageID(r); ok {
			out[i] = id
		}
	}
	return out
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

// Rows returns the [Row] of each of msgs, in order: ID, MessageID,
// AggregateType and AggregateID as the relay read them from the outbox
// table. It is for tests that hand messages to a publisher themselves,
// with no table to read the rows back from.
func Rows(msgs []relay.Message) []Row {
	out := make([]Row, len(msgs))
	for i, m := range msgs {
		out[i] = Row{ID: m.ID, MessageID: m.MessageID, AggregateType: m.AggregateType, AggregateID: m.AggregateID}
	}
	return out
}

// ByMessageID groups recs by outbox message ID, each group in the order
// of recs (a group of two or more is a duplicate delivery); messageID
// returns a record's ID and whether it has one (a kit's Record.MessageID
// method expression fits). Records without one are left out.
func ByMessageID[R any](recs []R, messageID func(R) (string, bool)) map[string][]R {
	out := make(map[string][]R, len(recs))
	for _, r := range recs {
		if id, ok := messageID(r); ok {
			out[id] = append(out[id], r)
		}
	}
	return out
}
