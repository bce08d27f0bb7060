package relay

import (
	"sort"
	"sync"

	"github.com/sqloutbox/outbox/internal/dialect"
)

// maxSentRanges bounds how many id ranges a relay remembers as marked
// sent by itself (see sentRanges). A drain by one relay marks consecutive
// ids, which merge into one range; ranges split only where an id was not
// marked by this relay (another instance's partition, a held or retrying
// row, a late commit, an AUTO_INCREMENT gap), so 64 cover many batches.
const maxSentRanges = 64

// sentRanges remembers the ids this relay's own mark-sent statements
// changed, as inclusive ranges of consecutive ids, for the MySQL/MariaDB
// claim (Dialect.ClaimExcluding), which leaves them out of its index range
// instead of walking their delete-marked entries until InnoDB's purge
// removes them.
//
// Only ids of a statement that changed exactly as many rows as it named
// are recorded: each of them then went from pending to sent (or was
// deleted, with DeleteOnPublish) in that statement, and no relay statement
// ever makes a sent row pending again (DeadLetters.Retry puts dead letters
// back in the pending set, never sent rows), so leaving them out never
// hides a pending row. A statement
// that changed fewer rows (a fence that rejected some: those rows stay
// pending) records nothing. Forgetting ranges is always safe: it only
// costs the walk again. This is not "the last id seen": a row with a
// lower id that commits later is not in any range (its id was never
// marked), so it is claimed.
//
// AUTO_INCREMENT ids are never reused on the supported servers (MySQL 8
// and MariaDB 10.6 persist the counter), except after TRUNCATE TABLE,
// which resets it: restart relays after truncating their table, or their
// remembered ranges would leave new rows with reused ids unclaimed. The
// same goes for sent rows an operator sets back to pending by hand.
type sentRanges struct {
	mu sync.Mutex
	r  [][2]int64 // sorted, disjoint
}

// add records ids (any order) as marked sent, dropping the lowest ranges
// beyond maxSentRanges.
func (s *sentRanges) add(ids []int64) {
	if len(ids) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.r = dialect.IDRanges(ids, s.r)
	if n := len(s.r) - maxSentRanges; n > 0 {
		s.r = append(s.r[:0:0], s.r[n:]...)
	}
}

// ranges returns a copy of the remembered ranges.
func (s *sentRanges) ranges() [][2]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][2]int64(nil), s.r...)
}

// has reports whether id is in a remembered range: this relay marked it
// sent, so it is not pending (the WAL source leaves such a row out of its
// check: it came back through the stream after the relay published it).
func (s *sentRanges) has(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.r), func(i int) bool { return s.r[i][1] >= id })
	return i < len(s.r) && s.r[i][0] <= id
}
