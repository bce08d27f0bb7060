package kafkatxn

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxMetadataBytes is the largest manifest a broker keeps with default
// settings: an offset commit's metadata is refused with
// OFFSET_METADATA_TOO_LARGE above the broker's offset.metadata.max.bytes,
// 4096 by default (Kafka broker configuration reference).
const MaxMetadataBytes = 4096

// manifestPrefix starts every manifest; a later format changes it, so
// that a reader never mistakes one format for another.
const manifestPrefix = "o1."

// ErrManifest is wrapped by the errors of DecodeManifest and of a
// manifest too large to encode: the committed offset's metadata is not a
// manifest this package wrote, or the rows do not fit in one.
var ErrManifest = errors.New("outbox/kafkatxn: bad transaction manifest")

// Manifest is what one transaction records, atomically with its records,
// as the metadata of a transactional offset commit: the relay partition's
// lease epoch it was published under and the outbox ids of the rows it
// carried, ascending.
type Manifest struct {
	Epoch int64
	IDs   []int64
}

// Encode returns m as offset metadata: "o1.<epoch>.<ids>", the ids as
// unsigned varints of their ascending deltas (the first from 0), in
// unpadded base64url. It wraps ErrManifest if the ids are not ascending
// and positive, or if the result is longer than MaxMetadataBytes (about
// 3,000 ids of a dense id range fit; see Fits).
func (m Manifest) Encode() (string, error) {
	buf := make([]byte, 0, len(m.IDs)*2)
	prev := int64(0)
	for _, id := range m.IDs {
		if id <= prev {
			return "", fmt.Errorf("%w: id %d after %d (ids must be positive and ascending)", ErrManifest, id, prev)
		}
		buf = binary.AppendUvarint(buf, uint64(id-prev))
		prev = id
	}
	s := manifestPrefix + strconv.FormatInt(m.Epoch, 10) + "." + base64.RawURLEncoding.EncodeToString(buf)
	if len(s) > MaxMetadataBytes {
		return "", fmt.Errorf("%w: %d ids take %d bytes, more than %d", ErrManifest, len(m.IDs), len(s), MaxMetadataBytes)
	}
	return s, nil
}

// DecodeManifest parses what Encode wrote. It wraps ErrManifest for
// anything else.
func DecodeManifest(s string) (Manifest, error) {
	rest, ok := strings.CutPrefix(s, manifestPrefix)
	if !ok {
		return Manifest{}, fmt.Errorf("%w: %.40q does not start with %q", ErrManifest, s, manifestPrefix)
	}
	epochText, idsText, ok := strings.Cut(rest, ".")
	if !ok {
		return Manifest{}, fmt.Errorf("%w: no epoch in %.40q", ErrManifest, s)
	}
	epoch, err := strconv.ParseInt(epochText, 10, 64)
	if err != nil {
		return Manifest{}, fmt.Errorf("%w: epoch: %w", ErrManifest, err)
	}
	buf, err := base64.RawURLEncoding.DecodeString(idsText)
	if err != nil {
		return Manifest{}, fmt.Errorf("%w: ids: %w", ErrManifest, err)
	}
	m := Manifest{Epoch: epoch}
	prev := int64(0)
	for len(buf) > 0 {
		d, n := binary.Uvarint(buf)
		if n <= 0 || d == 0 || d > uint64(1<<63-1-prev) {
			return Manifest{}, fmt.Errorf("%w: id %d is not a positive delta", ErrManifest, len(m.IDs))
		}
		prev += int64(d)
		m.IDs = append(m.IDs, prev)
		buf = buf[n:]
	}
	return m, nil
}

// Fits returns how many of ids, from the first, fit in one manifest with
// epoch: all of them, or the longest prefix whose encoding is at most
// MaxMetadataBytes. ids must be ascending and positive.
func Fits(epoch int64, ids []int64) int {
	budget := (MaxMetadataBytes - len(manifestPrefix) - len(strconv.FormatInt(epoch, 10)) - 1) * 3 / 4 // base64: 4 chars per 3 bytes
	var tmp [binary.MaxVarintLen64]byte
	prev, used := int64(0), 0
	for i, id := range ids {
		used += binary.PutUvarint(tmp[:], uint64(id-prev))
		if used > budget {
			return i
		}
		prev = id
	}
	return len(ids)
}
