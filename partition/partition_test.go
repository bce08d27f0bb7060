package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// refMurmur2 is an independent reference implementation used to cross-check
// Murmur2. It deliberately mirrors the Java source's style instead of the
// production code's: signed int32 arithmetic (Go wraps on overflow like Java),
// >>> emulated by converting to uint32, blocks read with encoding/binary, and
// the tail handled by cumulative, non-fallthrough switch arms.
func refMurmur2(data []byte) int32 {
	const (
		seed = int32(-1756908916) // 0x9747b28c as a Java int
		m    = int32(0x5bd1e995)
		r    = 24
	)
	ushr := func(x int32, s uint) int32 { return int32(uint32(x) >> s) }

	length := len(data)
	h := seed ^ int32(length)
	length4 := length / 4
	for i := 0; i < length4; i++ {
		k := int32(binary.LittleEndian.Uint32(data[i*4:]))
		k *= m
		k ^= ushr(k, r)
		k *= m
		h *= m
		h ^= k
	}
	base := length &^ 3
	switch length % 4 {
	case 3:
		h ^= int32(data[base+2]) << 16
		h ^= int32(data[base+1]) << 8
		h ^= int32(data[base])
		h *= m
	case 2:
		h ^= int32(data[base+1]) << 8
		h ^= int32(data[base])
		h *= m
	case 1:
		h ^= int32(data[base])
		h *= m
	}
	h ^= ushr(h, 13)
	h *= m
	h ^= ushr(h, 15)
	return h
}

// murmurVectors are known Java Utils.murmur2 outputs. Together they cover
// every tail length (len % 4 = 0, 1, 2, 3).
var murmurVectors = []struct {
	key  string
	want int32
}{
	// Kafka Java client, UtilsTest.testMurmur2.
	{"21", -973932308},                                              // tail 2
	{"foobar", -790332482},                                          // tail 2
	{"a-little-bit-long-string", -985981536},                        // tail 0
	{"a-little-bit-longer-string", -1486304829},                     // tail 2
	{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971}, // tail 0
	{"abc", 479470107},                                              // tail 3
	// librdkafka rdmurmur2.c unittest_murmur2 ("java_murmur2_results").
	{"kafka", -798503068},              // 0xd067cf64, tail 1
	{"giberish123456789", -1890243828}, // 0x8f552b0c, tail 1
	{"1234", -1614185708},              // 0x9fc97b14, tail 0
	{"234", -406844982},                // 0xe7c009ca, tail 3
	{"34", -2026295078},                // 0x873930da, tail 2
	{"4", 0x5a4b5ca1},                  // tail 1
	{"PreAmbleWillBeRemoved,ThePrePartThatIs", 0x78424f1c}, // tail 2
	{"reAmbleWillBeRemoved,ThePrePartThatIs", 0x4a62b377},  // tail 1
	{"eAmbleWillBeRemoved,ThePrePartThatIs", -521871202},   // 0xe0e4e09e, tail 0
	{"AmbleWillBeRemoved,ThePrePartThatIs", 0x62b8b43f},    // tail 3
	{"", 0x106e08d9}, // empty input
	// Further Java-derived vectors (as published in Akka's Murmur2Spec).
	{"1", -1993445489},     // tail 1
	{"12", 126087238},      // tail 2
	{"123", -267702483},    // tail 3
	{"12345", -1188365604}, // tail 1
}

func TestMurmur2Vectors(t *testing.T) {
	t.Parallel()
	tails := map[int]bool{}
	for _, tc := range murmurVectors {
		tails[len(tc.key)%4] = true
		t.Run(strconv.Quote(tc.key), func(t *testing.T) {
			t.Parallel()
			if got := Murmur2([]byte(tc.key)); got != tc.want {
				t.Errorf("Murmur2(%q) = %d, want %d", tc.key, got, tc.want)
			}
			if got := refMurmur2([]byte(tc.key)); got != tc.want {
				t.Errorf("refMurmur2(%q) = %d, want %d (reference implementation is wrong)", tc.key, got, tc.want)
			}
		})
	}
	for tail := 0; tail < 4; tail++ {
		if !tails[tail] {
			t.Errorf("no vector with len %% 4 == %d", tail)
		}
	}
}

func TestMurmur2NilEqualsEmpty(t *testing.T) {
	t.Parallel()
	if got, want := Murmur2(nil), Murmur2([]byte{}); got != want {
		t.Fatalf("Murmur2(nil) = %d, Murmur2([]byte{}) = %d", got, want)
	}
}

func TestMurmur2MatchesReferenceRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(0x5eed, 0xca11ab1e))
	buf := make([]byte, 64)
	for length := 0; length <= 64; length++ {
		for iter := 0; iter < 200; iter++ {
			data := buf[:length]
			for i := range data {
				data[i] = byte(rng.Uint32()) // full byte range, incl. >= 0x80 (sign-extension trap)
			}
			if got, want := Murmur2(data), refMurmur2(data); got != want {
				t.Fatalf("len %d: Murmur2(%x) = %d, reference = %d", length, data, got, want)
			}
		}
	}
}

// saramaAbsPartition mirrors the non-reference branch of sarama's
// hashPartitioner.Partition (IBM/sarama partitioner.go): signed remainder,
// negated if negative.
func saramaAbsPartition(h, n int32) int32 {
	p := h % n
	if p < 0 {
		p = -p
	}
	return p
}

func TestKafkaPartition(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key  string
		n    int32
		want int32
	}{
		// (-790332482 & 0x7fffffff) = 1357151166; 1357151166 % 6 = 0.
		{"foobar", 6, 0},
		{"foobar", 1, 0},
		// 1357151166 % 5 = 1.
		{"foobar", 5, 1},
		// 479470107 is positive: 479470107 % 6 = 3, % 10 = 7.
		{"abc", 6, 3},
		{"abc", 10, 7},
		// (-973932308 & 0x7fffffff) = 1173551340; % 6 = 0, % 100 = 40.
		{"21", 6, 0},
		{"21", 100, 40},
		// (-58897971 & 0x7fffffff) = 2088585677; % 12 = 5.
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", 12, 5},
		// numPartitions <= 0 must not panic.
		{"foobar", 0, 0},
		{"foobar", -3, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%d", tc.key, tc.n), func(t *testing.T) {
			t.Parallel()
			if got := KafkaPartition([]byte(tc.key), tc.n); got != tc.want {
				t.Errorf("KafkaPartition(%q, %d) = %d, want %d", tc.key, tc.n, got, tc.want)
			}
		})
	}
}

func TestKafkaPartitionInRange(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	key := make([]byte, 16)
	for i := 0; i < 10000; i++ {
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		n := int32(1 + rng.IntN(1000))
		h := Murmur2(key)
		got := KafkaPartition(key, n)
		if got < 0 || got >= n {
			t.Fatalf("KafkaPartition(%x, %d) = %d out of range", key, n, got)
		}
		if want := (h & 0x7fffffff) % n; got != want {
			t.Fatalf("KafkaPartition(%x, %d) = %d, want %d", key, n, got, want)
		}
	}
}

// TestToPositiveVersusAbs pins the example quoted in the package doc: for
// "foobar" with 6 partitions Java's toPositive gives 0, abs gives 2.
func TestToPositiveVersusAbs(t *testing.T) {
	t.Parallel()
	h := Murmur2([]byte("foobar"))
	if h != -790332482 {
		t.Fatalf("Murmur2(foobar) = %d", h)
	}
	if got := KafkaPartition([]byte("foobar"), 6); got != 0 {
		t.Errorf("KafkaPartition(foobar, 6) = %d, want 0", got)
	}
	if got := saramaAbsPartition(h, 6); got != 2 {
		t.Errorf("abs-style partition(foobar, 6) = %d, want 2", got)
	}
	// toPositive differs from abs also for MinInt32.
	if got := toPositive(-1 << 31); got != 0 {
		t.Errorf("toPositive(MinInt32) = %d, want 0", got)
	}
}

func TestOfEqualsHashOfConcatenation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		typ, id string
	}{
		{"", ""},
		{"", "x"},
		{"x", ""},
		{"order", "42"},
		{"Order", "0b6f1a4e-9d3c-4a8e-b0a1-2c3d4e5f6a7b"},
		{"abc", "defg"},  // separator completes the first block
		{"ab", "cdefgh"}, // separator mid-block
		{"abcd", "efgh"}, // separator starts a block
		{"a", "b"},
		{"customer-account", "ünïcödé-🙂"},
		{"t\x00", "\x00id"}, // embedded NULs are just bytes
	}
	for _, tc := range tests {
		for _, count := range []int{1, 2, 7, DefaultCount, 1000, MaxCount} {
			concat := []byte(tc.typ + "\x00" + tc.id)
			want := int((Murmur2(concat) & 0x7fffffff)) % count
			if got := Of(tc.typ, tc.id, count); got != want {
				t.Errorf("Of(%q, %q, %d) = %d, want %d", tc.typ, tc.id, count, got, want)
			}
		}
	}
}

func TestOfMatchesConcatenationRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(42, 4242))
	randStr := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return string(b)
	}
	for lt := 0; lt <= 13; lt++ {
		for li := 0; li <= 40; li++ {
			typ, id := randStr(lt), randStr(li)
			concat := []byte(typ + "\x00" + id)
			// A count far above MaxCount (Of does not clamp) keeps almost
			// every bit of the hash, so this checks more than a small count.
			const big = math.MaxInt32
			if got, want := Of(typ, id, big), int(refMurmur2(concat)&0x7fffffff)%big; got != want {
				t.Fatalf("Of(%q, %q, MaxInt32) = %d, want %d", typ, id, got, want)
			}
		}
	}
}

func TestOfNonPositiveCountUsesDefault(t *testing.T) {
	t.Parallel()
	for _, count := range []int{0, -1, math.MinInt} {
		for i := 0; i < 100; i++ {
			id := strconv.Itoa(i)
			if got, want := Of("order", id, count), Of("order", id, DefaultCount); got != want {
				t.Errorf("Of(order, %s, %d) = %d, want %d (DefaultCount)", id, count, got, want)
			}
		}
	}
}

func TestOfDistribution(t *testing.T) {
	t.Parallel()
	const (
		n     = 100_000
		count = DefaultCount
	)
	var buckets [count]int
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%08x-%04x-4000-8000-%012x", uint32(i)*2654435761, i&0xffff, i)
		p := Of("order", id, count)
		if p < 0 || p >= count {
			t.Fatalf("Of(order, %s) = %d out of [0, %d)", id, p, count)
		}
		buckets[p]++
	}
	expected := float64(n) / count
	lo, hi := expected*0.9, expected*1.1
	for p, c := range buckets {
		if float64(c) < lo || float64(c) > hi {
			t.Errorf("partition %d holds %d ids, want within ±10%% of %.0f [%.0f, %.0f]", p, c, expected, lo, hi)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		count   int
		wantErr bool
	}{
		{-1, true},
		{0, true},
		{1, false},
		{DefaultCount, false},
		{MaxCount, false},
		{MaxCount + 1, true},
		{math.MaxInt, true},
	}
	for _, tc := range tests {
		t.Run(strconv.Itoa(tc.count), func(t *testing.T) {
			t.Parallel()
			err := Validate(tc.count)
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidCount) {
					t.Fatalf("Validate(%d) = %v, want error wrapping ErrInvalidCount", tc.count, err)
				}
				if err == ErrInvalidCount {
					t.Errorf("Validate(%d) returned the bare sentinel; want it wrapped with the value", tc.count)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate(%d) = %v, want nil", tc.count, err)
			}
		})
	}
}

func TestOfZeroAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun is sensitive to concurrent allocation.
	typ, id := "order", "0b6f1a4e-9d3c-4a8e-b0a1-2c3d4e5f6a7b"
	if a := testing.AllocsPerRun(1000, func() { _ = Of(typ, id, DefaultCount) }); a != 0 {
		t.Errorf("Of allocates %.1f times per call, want 0", a)
	}
	key := []byte(id)
	if a := testing.AllocsPerRun(1000, func() { _ = Murmur2(key) }); a != 0 {
		t.Errorf("Murmur2 allocates %.1f times per call, want 0", a)
	}
}

var sink int

func BenchmarkMurmur2(b *testing.B) {
	key := []byte("0b6f1a4e-9d3c-4a8e-b0a1-2c3d4e5f6a7b") // 36-byte UUID string
	b.ReportAllocs()
	b.SetBytes(int64(len(key)))
	for b.Loop() {
		sink += int(Murmur2(key))
	}
}

func BenchmarkOf(b *testing.B) {
	typ, id := "order", "0b6f1a4e-9d3c-4a8e-b0a1-2c3d4e5f6a7b"
	b.ReportAllocs()
	for b.Loop() {
		sink += Of(typ, id, DefaultCount)
	}
}

func ExampleKafkaPartition() {
	// The Kafka Java client would put a record keyed "foobar" on partition 0
	// of a 6-partition topic, and "abc" on partition 3.
	fmt.Println(KafkaPartition([]byte("foobar"), 6))
	fmt.Println(KafkaPartition([]byte("abc"), 6))
	// Output:
	// 0
	// 3
}
