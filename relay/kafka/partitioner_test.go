package kafka_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/relay/kafka"
)

// javaMurmur2 are Apache Kafka Java client Utils.murmur2 outputs
// (UtilsTest.testMurmur2 and librdkafka's java_murmur2_results).
var javaMurmur2 = []struct {
	key  string
	hash int32
}{
	{"21", -973932308},
	{"foobar", -790332482},
	{"a-little-bit-long-string", -985981536},
	{"a-little-bit-longer-string", -1486304829},
	{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
	{"abc", 479470107},
	{"kafka", -798503068},
	{"giberish123456789", -1890243828},
	{"1234", -1614185708},
	{"234", -406844982},
	{"34", -2026295078},
}

func partitionOf(t *testing.T, p sarama.Partitioner, key sarama.Encoder, n int32) int32 {
	t.Helper()
	got, err := p.Partition(&sarama.ProducerMessage{Topic: "t", Key: key}, n)
	if err != nil {
		t.Fatalf("Partition(%v, %d): %v", key, n, err)
	}
	return got
}

// TestPartitionerJavaVectors: the partition is Java's
// toPositive(murmur2(key)) % n, computed here from the Java hash values, for
// every partition count up to 64. "foobar" with 6 partitions is 0 (an
// abs-based partitioner would say 2).
func TestPartitionerJavaVectors(t *testing.T) {
	t.Parallel()
	p := kafka.NewPartitioner("any-topic")
	if got := partitionOf(t, p, sarama.StringEncoder("foobar"), 6); got != 0 {
		t.Errorf("Partition(foobar, 6) = %d, want 0", got)
	}
	for _, v := range javaMurmur2 {
		for n := int32(1); n <= 64; n++ {
			want := (v.hash & 0x7fffffff) % n
			if got := partitionOf(t, p, sarama.StringEncoder(v.key), n); got != want {
				t.Errorf("Partition(%q, %d) = %d, want Java's %d", v.key, n, got, want)
			}
			if got := partitionOf(t, kafka.Partitioner{}, sarama.ByteEncoder(v.key), n); got != want {
				t.Errorf("Partitioner{} with ByteEncoder(%q), %d = %d, want %d", v.key, n, got, want)
			}
		}
	}
}

// TestPartitionerAgreesWithSaramaMurmur2: for random keyed records the
// result matches sarama's own Java-compatible NewMurmur2Partitioner (an
// independent implementation), and never leaves [0, n).
func TestPartitionerAgreesWithSaramaMurmur2(t *testing.T) {
	t.Parallel()
	ref := sarama.NewMurmur2Partitioner("t")
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		key := make([]byte, rng.IntN(40))
		for i := range key {
			key[i] = byte(rng.UintN(256))
		}
		n := int32(1 + rng.IntN(300))
		got := partitionOf(t, kafka.Partitioner{}, sarama.ByteEncoder(key), n)
		if want := partitionOf(t, ref, sarama.ByteEncoder(key), n); got != want {
			t.Fatalf("Partition(%x, %d) = %d, sarama's murmur2 partitioner says %d", key, n, got, want)
		}
		if got < 0 || got >= n {
			t.Fatalf("Partition(%x, %d) = %d out of range", key, n, got)
		}
	}
}

// TestPartitionerNilKey: an unkeyed record goes to partition 0, always.
func TestPartitionerNilKey(t *testing.T) {
	t.Parallel()
	for _, n := range []int32{1, 2, 6, 1000} {
		got, err := kafka.Partitioner{}.Partition(&sarama.ProducerMessage{Topic: "t"}, n)
		if err != nil || got != 0 {
			t.Errorf("Partition(nil key, %d) = %d, %v; want 0, nil", n, got, err)
		}
	}
}

// TestPartitionerEmptyKey: an empty (non-nil) key is hashed like Java's
// zero-length key, not treated as "no key".
func TestPartitionerEmptyKey(t *testing.T) {
	t.Parallel()
	ref := sarama.NewMurmur2Partitioner("t")
	for n := int32(1); n <= 32; n++ {
		got := partitionOf(t, kafka.Partitioner{}, sarama.StringEncoder(""), n)
		if want := partitionOf(t, ref, sarama.StringEncoder(""), n); got != want {
			t.Errorf("Partition(\"\", %d) = %d, want %d", n, got, want)
		}
	}
}

type failingEncoder struct{}

var errEncode = errors.New("encode failed")

func (failingEncoder) Encode() ([]byte, error) { return nil, errEncode }
func (failingEncoder) Length() int             { return 0 }

// TestPartitionerKeyEncodeError: an encoder error is returned, with -1.
func TestPartitionerKeyEncodeError(t *testing.T) {
	t.Parallel()
	got, err := kafka.Partitioner{}.Partition(&sarama.ProducerMessage{Topic: "t", Key: failingEncoder{}}, 4)
	if !errors.Is(err, errEncode) || got != -1 {
		t.Errorf("Partition with a failing key encoder = %d, %v; want -1, %v", got, err, errEncode)
	}
}

// TestPartitionerRequiresConsistency: sarama must not move a key when a
// partition is briefly unavailable.
func TestPartitionerRequiresConsistency(t *testing.T) {
	t.Parallel()
	if !(kafka.Partitioner{}).RequiresConsistency() {
		t.Error("RequiresConsistency() = false")
	}
	if !kafka.NewPartitioner("x").RequiresConsistency() {
		t.Error("NewPartitioner(...).RequiresConsistency() = false")
	}
	var _ sarama.PartitionerConstructor = kafka.NewPartitioner
}
