package redistest

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/sqloutbox/outbox/outboxtest"
)

// Check joins rows (the committed events, read back from the outbox
// table) with recs (what a [Consumer] read, in any order, duplicates
// included) by outbox message ID and returns the [outboxtest.Ledger]:
// lost rows, ghosts (records of no row, records without a message ID),
// duplicates and order violations; its Err matches [outboxtest.ErrLost],
// [outboxtest.ErrGhost] and [outboxtest.ErrOrder].
//
// Order is judged on first deliveries per stream in entry ID order: the
// order in which the stream holds the entries and every reader (XREAD,
// XRANGE, a consumer group) returns them. Entry IDs are "ms-seq" and are
// compared as the two numbers they are ("9-0" before "10-0"), not as
// strings. The publisher XADDs an aggregate's next entry only after the
// previous one's reply, and an aggregate's entries all go to one stream
// (its aggregate type's, with [redispub.DefaultStream]), so they must be
// in outbox-id order there; records of different streams are not
// ordered against each other, and needn't be. An ID that is not "ms-seq"
// (not from Redis) sorts after every valid one of its stream, by string.
//
// Redis does not deduplicate: an entry the relay sends again (after an
// outage, a lost reply) is stored again and counts in Duplicates, never
// as an order violation. Check does not modify its arguments; it sorts
// and calls [outboxtest.Check].
func Check(rows []outboxtest.Row, recs []Record) outboxtest.Ledger {
	type keyed struct {
		rec     Record
		valid   bool
		ms, seq uint64
	}
	ks := make([]keyed, len(recs))
	for i, r := range recs {
		ks[i].rec = r
		ks[i].ms, ks[i].seq, ks[i].valid = parseEntryID(r.ID)
	}
	slices.SortStableFunc(ks, func(a, b keyed) int {
		if c := cmp.Compare(a.rec.Stream, b.rec.Stream); c != 0 {
			return c
		}
		if a.valid != b.valid {
			if a.valid {
				return -1
			}
			return 1
		}
		if !a.valid {
			return cmp.Compare(a.rec.ID, b.rec.ID)
		}
		return cmp.Or(cmp.Compare(a.ms, b.ms), cmp.Compare(a.seq, b.seq))
	})
	ids := make([]string, len(ks))
	for i, k := range ks {
		ids[i], _ = k.rec.MessageID()
	}
	return outboxtest.Check(rows, ids)
}

// parseEntryID splits a stream entry ID "ms-seq" into its two numbers;
// ok is false if id is not of that form.
func parseEntryID(id string) (ms, seq uint64, ok bool) {
	a, b, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}
