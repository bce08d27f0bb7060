package partition

// Constants of the Kafka variant of MurmurHash2, as fixed by the Apache Kafka
// Java client's org.apache.kafka.common.utils.Utils.murmur2.
const (
	murmurSeed uint32 = 0x9747b28c // Java: final int seed = 0x9747b28c
	murmurM    uint32 = 0x5bd1e995 // Java: final int m = 0x5bd1e995
	murmurR           = 24         // Java: final int r = 24
)

// Murmur2 returns the 32-bit MurmurHash2 of data exactly as computed by the
// Apache Kafka Java client's org.apache.kafka.common.utils.Utils.murmur2
// (seed 0x9747b28c, m 0x5bd1e995, r 24, little-endian 4-byte blocks), so the
// result is bit-for-bit the Java int for the same bytes. A nil or empty
// slice is hashed as the zero-length input (it is not treated as "no key").
//
// The value is signed, like the Java int; use [KafkaPartition] (or mask with
// 0x7fffffff, Java's Utils.toPositive) before taking a remainder. Murmur2 does
// not allocate and is safe for concurrent use.
func Murmur2(data []byte) int32 {
	n := len(data)
	// Java: int h = seed ^ length (length is an int; only its low 32 bits matter).
	h := murmurSeed ^ uint32(n)

	blocks := n &^ 3
	for i := 0; i < blocks; i += 4 {
		b := data[i : i+4 : i+4]
		h = mixBlock(h, uint32(b[0])|uint32(b[1])<<8|uint32(b[2])<<16|uint32(b[3])<<24)
	}
	return int32(finish(h, data[blocks:]))
}

// mixBlock folds one little-endian 4-byte block k into the running hash h.
func mixBlock(h, k uint32) uint32 {
	k *= murmurM
	k ^= k >> murmurR
	k *= murmurM
	h *= murmurM
	h ^= k
	return h
}

// finish folds the 0..3 trailing bytes into h (the Java switch on
// length % 4 with fallthrough) and applies the final avalanche
// h ^= h >>> 13; h *= m; h ^= h >>> 15.
func finish(h uint32, tail []byte) uint32 {
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= murmurM
	}
	h ^= h >> 13
	h *= murmurM
	h ^= h >> 15
	return h
}

// toPositive is Kafka's Utils.toPositive: it clears the sign bit
// (n & 0x7fffffff). Unlike an absolute value it maps math.MinInt32 to 0 and
// maps a negative n to n + 2^31, not -n.
func toPositive(n int32) int32 { return n & 0x7fffffff }

// KafkaPartition returns the partition, in [0, numPartitions), that the
// Apache Kafka Java client's default partitioner assigns to a record whose
// serialized key is key: toPositive(murmur2(key)) % numPartitions, per
// org.apache.kafka.clients.producer.internals.BuiltInPartitioner.partitionForKey
// (formerly DefaultPartitioner). librdkafka's "murmur2" and "murmur2_random"
// partitioners compute the same value for non-NULL keys.
//
// numPartitions is the topic's partition count and must be > 0; if it is
// <= 0 KafkaPartition returns 0 rather than panicking. key must be the exact
// serialized key bytes the producer sends. Records without a key are not
// covered: Kafka places them with the sticky/uniform strategy, not a hash.
func KafkaPartition(key []byte, numPartitions int32) int32 {
	if numPartitions <= 0 {
		return 0
	}
	return toPositive(Murmur2(key)) % numPartitions
}
