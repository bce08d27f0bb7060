// Package partition_test checks the library's hand-written Kafka murmur2
// (partition.Murmur2, partition.KafkaPartition, partition.Of) against
// franz-go's Java-compatible key partitioner, an independent, well-kept
// implementation. It lives in the integration module because the library's
// module does not depend on franz-go (see partition/murmur2.go for why the
// hash is ours).
package partition_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/partition"
)

// franzPartition is franz-go's StickyKeyPartitioner(nil) choice for a
// record with key among n partitions: (murmur2(key) & 0x7fffffff) % n, the
// Java client's default for keyed records.
func franzPartition(key []byte, n int) int {
	return kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(&kgo.Record{Key: key}, n)
}

// keys returns n pseudo-random keys of 0..70 bytes (every tail length, all
// byte values) and aggregate-shaped keys, the same on every run.
func keys(n int) [][]byte {
	rng := rand.New(rand.NewPCG(13, 5))
	// No nil key: franz-go treats a nil key as "no key" (sticky, not
	// hashed); partition.KafkaPartition hashes it as the empty key.
	out := [][]byte{{}, []byte("21"), []byte("foobar")}
	for i := range n {
		if i%2 == 0 {
			k := make([]byte, rng.IntN(71))
			for j := range k {
				k[j] = byte(rng.UintN(256))
			}
			out = append(out, k)
		} else {
			out = append(out, []byte(fmt.Sprintf("order-%d", rng.Uint64())))
		}
	}
	return out
}

// TestMurmur2AgreesWithFranzGo: with 2^31 partitions franz-go's
// partitioner returns the hash's 31 low bits, untouched, so this compares
// partition.Murmur2 bit for bit on every bit a partition choice uses (the
// sign bit is cleared by both, as by Java's Utils.toPositive; the full 32
// bits are checked against the Java client's published vectors in
// relay/kafka's partitioner tests).
func TestMurmur2AgreesWithFranzGo(t *testing.T) {
	t.Parallel()
	for _, k := range keys(50000) {
		got := int(partition.Murmur2(k) & 0x7fffffff)
		if want := franzPartition(k, 1<<31); got != want {
			t.Fatalf("Murmur2(%x) & 0x7fffffff = %d, franz-go's murmur2 gives %d", k, got, want)
		}
	}
}

// TestKafkaPartitionAgreesWithFranzGo: the Kafka partition of a key is
// franz-go's for every partition count tried.
func TestKafkaPartitionAgreesWithFranzGo(t *testing.T) {
	t.Parallel()
	counts := []int32{1, 2, 3, 6, 7, 12, 64, 100, 256, 1000, 4096}
	for _, k := range keys(5000) {
		for _, n := range counts {
			if got, want := partition.KafkaPartition(k, n), franzPartition(k, int(n)); int(got) != want {
				t.Fatalf("KafkaPartition(%x, %d) = %d, franz-go says %d", k, n, got, want)
			}
		}
	}
}

// TestOfAgreesWithFranzGo: the relay partition stored on every outbox row
// (partition.Of, computed by writers without building the key) is the
// murmur2 partition of aggregateType + "\x00" + aggregateID, so it stays
// what it was for rows already written.
func TestOfAgreesWithFranzGo(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 20000 {
		typ := []string{"order", "user", "", "a-much-longer-aggregate-type"}[i%4]
		id := fmt.Sprintf("%016x", rng.Uint64())[:1+rng.IntN(16)]
		for _, n := range []int{1, 16, 64, 256, 1024} {
			key := []byte(typ + "\x00" + id)
			if got, want := partition.Of(typ, id, n), franzPartition(key, n); got != want {
				t.Fatalf("Of(%q, %q, %d) = %d, franz-go's murmur2 partition of the key is %d", typ, id, n, got, want)
			}
		}
	}
}
