package kafkatxn

import (
	"errors"
	"slices"
	"testing"
)

func TestManifestRoundTrip(t *testing.T) {
	t.Parallel()
	dense := make([]int64, 3000)
	for i := range dense {
		dense[i] = int64(1_000_000 + i)
	}
	for _, m := range []Manifest{
		{Epoch: 0},
		{Epoch: 1, IDs: []int64{1}},
		{Epoch: 42, IDs: []int64{5, 6, 7, 900, 1 << 40, 1<<63 - 1}},
		{Epoch: 1<<63 - 1, IDs: dense},
	} {
		s, err := m.Encode()
		if err != nil {
			t.Fatalf("Encode(%d ids): %v", len(m.IDs), err)
		}
		got, err := DecodeManifest(s)
		if err != nil {
			t.Fatalf("DecodeManifest(%.40q): %v", s, err)
		}
		if got.Epoch != m.Epoch || !slices.Equal(got.IDs, m.IDs) {
			t.Errorf("round trip of %d ids: epoch %d, %d ids; want %d", len(m.IDs), got.Epoch, len(got.IDs), m.Epoch)
		}
	}
}

func TestManifestRefused(t *testing.T) {
	t.Parallel()
	for _, m := range []Manifest{
		{IDs: []int64{0}},
		{IDs: []int64{3, 3}},
		{IDs: []int64{5, 4}},
		{IDs: []int64{-1}},
	} {
		if _, err := m.Encode(); !errors.Is(err, ErrManifest) {
			t.Errorf("Encode(%v): %v, want ErrManifest", m.IDs, err)
		}
	}
	for _, s := range []string{"", "x", "o1.", "o1.7", "o1.x.AQ", "o1.7.!!", "o1.7.AA", "o1.7.gA", "o2.7.AQ"} {
		if _, err := DecodeManifest(s); !errors.Is(err, ErrManifest) {
			t.Errorf("DecodeManifest(%q): %v, want ErrManifest", s, err)
		}
	}
}

// TestManifestFits: Fits returns the longest prefix that encodes within
// MaxMetadataBytes, for ids of 1-byte and of 9-byte deltas.
func TestManifestFits(t *testing.T) {
	t.Parallel()
	for _, step := range []int64{1, 1 << 56} {
		var ids []int64
		for i := int64(1); i <= 5000 && i*step > 0 && i*step < 1<<62; i++ {
			ids = append(ids, i*step)
		}
		n := Fits(99, ids)
		if n == 0 || n >= len(ids) && step == 1 {
			t.Fatalf("step %d: Fits %d of %d", step, n, len(ids))
		}
		s, err := Manifest{Epoch: 99, IDs: ids[:n]}.Encode()
		if err != nil || len(s) > MaxMetadataBytes {
			t.Errorf("step %d: the prefix Fits returned (%d ids) encodes to %d bytes: %v", step, n, len(s), err)
		}
		if n < len(ids) {
			if _, err := (Manifest{Epoch: 99, IDs: ids[:n+1]}).Encode(); !errors.Is(err, ErrManifest) {
				t.Errorf("step %d: Fits returned %d, but %d ids encode: %v", step, n, n+1, err)
			}
		}
	}
}
