package partition

import (
	"errors"
	"fmt"
)

// DefaultCount is the default number of relay partitions: the number of
// buckets [Of] spreads outbox rows over so that relay instances can divide the
// work by leasing whole partitions.
//
// 32 is large enough to balance across a handful to a dozen relay instances
// while still giving each instance at least 2-3 partitions (32/12 ≈ 2.7), so a
// lost or added instance moves only a small share of the load; and small
// enough that the lease table (one row per partition) and the per-partition
// polling queries stay tiny.
//
// The relay partition is computed once, at write time, and stored on each
// outbox row, so every writer and every relay instance must agree on the
// count: it is stored in the outbox table (driver.Outbox.PartitionCount),
// and writers and relays read it from there. Changing it for a live outbox
// is not a configuration flip: it requires a drain barrier (all rows
// written under the old count delivered before rows under the new count are
// relayed), which relay.Repartition provides.
const DefaultCount = 32

// MaxCount is the largest relay partition count [Validate] accepts. It bounds
// the size of the lease table and the number of per-partition queries.
const MaxCount = 4096

// ErrInvalidCount is the sentinel wrapped by [Validate] when a relay
// partition count is outside [1, MaxCount]. Test for it with errors.Is.
var ErrInvalidCount = errors.New("partition: invalid relay partition count")

// Validate reports whether count is a usable relay partition count. It
// returns nil when 1 <= count <= MaxCount, and otherwise an error wrapping
// [ErrInvalidCount] that names the offending value. Configuration should be
// validated once at startup; [Of] assumes a validated count and never clamps.
func Validate(count int) error {
	if count < 1 || count > MaxCount {
		return fmt.Errorf("%w: %d (must be between 1 and %d)", ErrInvalidCount, count, MaxCount)
	}
	return nil
}

// Of returns the relay partition, in [0, count), of the aggregate identified
// by (aggregateType, aggregateID) — the outbox's ordering unit: all events of
// one aggregate land in the same relay partition and are relayed in order.
//
// The result is toPositive(murmur2(aggregateType + "\x00" + aggregateID)) % count,
// with murmur2 and toPositive as in the Kafka Java client's Utils.murmur2 and
// Utils.toPositive (see [Murmur2]). The NUL separator keeps ("ab","c") and
// ("a","bc") apart. The concatenation is hashed incrementally, so Of does not
// allocate; the result is identical to hashing the concatenated bytes.
//
// count is the relay partition count and is assumed to have passed
// [Validate]. As a guard against a panic, count <= 0 is treated as
// [DefaultCount]; a count above [MaxCount] is used as given (not clamped).
func Of(aggregateType, aggregateID string, count int) int {
	if count <= 0 {
		count = DefaultCount
	}
	var s stream
	s.init(len(aggregateType) + 1 + len(aggregateID))
	s.writeString(aggregateType)
	s.writeByte(0)
	s.writeString(aggregateID)
	h := toPositive(int32(s.sum()))
	return int(h) % count
}

// stream computes Murmur2 over input supplied in pieces whose total length is
// known up front (murmur2 seeds with the length). It lives on the stack.
type stream struct {
	h   uint32
	buf [4]byte // pending bytes of a not-yet-complete block
	n   int     // number of valid bytes in buf
}

func (s *stream) init(total int) {
	s.h = murmurSeed ^ uint32(total)
	s.n = 0
}

func (s *stream) writeByte(c byte) {
	s.buf[s.n] = c
	s.n++
	if s.n == 4 {
		s.h = mixBlock(s.h, uint32(s.buf[0])|uint32(s.buf[1])<<8|uint32(s.buf[2])<<16|uint32(s.buf[3])<<24)
		s.n = 0
	}
}

func (s *stream) writeString(p string) {
	// Complete a pending partial block first.
	for s.n != 0 && len(p) > 0 {
		s.writeByte(p[0])
		p = p[1:]
	}
	// Whole blocks straight from the string.
	for len(p) >= 4 {
		s.h = mixBlock(s.h, uint32(p[0])|uint32(p[1])<<8|uint32(p[2])<<16|uint32(p[3])<<24)
		p = p[4:]
	}
	// Stash the remainder (at most 3 bytes, and buf is empty here).
	for i := 0; i < len(p); i++ {
		s.buf[s.n] = p[i]
		s.n++
	}
}

// sum finalizes the hash. It must be called once, after exactly the total
// number of bytes given to init has been written.
func (s *stream) sum() uint32 {
	return finish(s.h, s.buf[:s.n])
}
