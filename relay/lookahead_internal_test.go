package relay

import (
	"testing"
	"time"
)

// TestAdoptAheadNeedsTheSameLeases: a batch claimed ahead is used only
// under the same partitions and lease epochs; it is consumed either way.
func TestAdoptAheadNeedsTheSameLeases(t *testing.T) {
	t.Parallel()
	claimed := map[int]int64{0: 3, 1: 5}
	for _, tc := range []struct {
		name   string
		epochs map[int]int64
		use    bool
	}{
		{"same", map[int]int64{0: 3, 1: 5}, true},
		{"partition lost", map[int]int64{0: 3}, false},
		{"partition taken", map[int]int64{0: 3, 1: 5, 2: 1}, false},
		{"lease renewed under a new epoch", map[int]int64{0: 3, 1: 6}, false},
	} {
		r := &Relay{ahead: &aheadBatch{msgs: []Message{{ID: 7}}, limit: 4, epochs: claimed, took: time.Millisecond}}
		msgs, limit, took := r.adoptAhead(leaseSet{epochs: tc.epochs})
		if (msgs != nil) != tc.use || (tc.use && (took != time.Millisecond || limit != 4)) {
			t.Errorf("%s: adopted %v (limit %d, %v), want used: %v", tc.name, msgs, limit, took, tc.use)
		}
		if r.ahead != nil {
			t.Errorf("%s: the batch read ahead was not consumed", tc.name)
		}
	}
	if msgs, _, _ := (&Relay{}).adoptAhead(leaseSet{epochs: claimed}); msgs != nil {
		t.Errorf("nothing read ahead, adopted %v", msgs)
	}
}
