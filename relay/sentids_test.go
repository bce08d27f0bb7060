package relay

import (
	"fmt"
	"testing"
)

func TestSentRanges(t *testing.T) {
	var s sentRanges
	s.add(nil)
	if r := s.ranges(); len(r) != 0 {
		t.Fatalf("empty: %v", r)
	}
	s.add([]int64{5, 3, 4})
	s.add([]int64{6, 7})
	s.add([]int64{10})
	if got := fmt.Sprint(s.ranges()); got != "[[3 7] [10 10]]" {
		t.Fatalf("ranges %s, want [[3 7] [10 10]]", got)
	}
	r := s.ranges()
	r[0][0] = 99 // a copy
	if got := fmt.Sprint(s.ranges()); got != "[[3 7] [10 10]]" {
		t.Fatalf("ranges changed through a copy: %s", got)
	}
	// Beyond maxSentRanges the lowest ranges are forgotten (always safe:
	// only the walk comes back).
	var many sentRanges
	for i := int64(0); i < maxSentRanges+10; i++ {
		many.add([]int64{2 * i})
	}
	got := many.ranges()
	if len(got) != maxSentRanges || got[0][0] != 20 || got[len(got)-1][0] != 2*(maxSentRanges+9) {
		t.Fatalf("%d ranges from %v to %v, want %d from 20", len(got), got[0], got[len(got)-1], maxSentRanges)
	}
}

func TestSentRangesHas(t *testing.T) {
	t.Parallel()
	var s sentRanges
	if s.has(1) {
		t.Fatal("an empty set has 1")
	}
	s.add([]int64{3, 4, 5, 6, 7, 10, 20, 21})
	for _, tc := range []struct {
		id   int64
		want bool
	}{{2, false}, {3, true}, {5, true}, {7, true}, {8, false}, {9, false}, {10, true}, {11, false}, {19, false}, {20, true}, {21, true}, {22, false}, {-1, false}} {
		if got := s.has(tc.id); got != tc.want {
			t.Errorf("has(%d) = %v, want %v (ranges %v)", tc.id, got, tc.want, s.ranges())
		}
	}
}
