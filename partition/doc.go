// Package partition maps outbox records to partitions: Kafka topic partitions
// for keyed records, and relay partitions that split the outbox table between
// relay instances.
//
// # Why murmur2
//
// The outbox relay publishes to Kafka, and other producers may write the same
// keys to the same topics. Placement only agrees if everyone uses the same
// partitioner. [Murmur2] is byte-for-byte the Apache Kafka Java client's
// org.apache.kafka.common.utils.Utils.murmur2, and [KafkaPartition] is the
// Java client's default partitioner for keyed records
// (BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % n).
// librdkafka's "murmur2_random" partitioner (the Java-compatible choice for
// librdkafka-based clients) computes the same value for non-NULL keys, so a
// key lands on the same partition whether it was produced by the Java
// client, librdkafka or this package. The relay partition ([Of]) reuses the
// same hash so there is a single, well-specified function to reason about.
//
// # Why the hash is ours and not a Kafka client's
//
// Both Kafka clients in this project's graph implement the same murmur2,
// but neither exports it: IBM/sarama (which relay/kafka uses) and
// twmb/franz-go keep their murmur2 unexported and offer only partitioners
// that take a record and a partition count (and send a nil key to a
// random or sticky partition). This package needs the hash itself, for
// [Of], and it is imported by driver, on the write path of every
// transaction: the driver must not depend on a Kafka client, because an
// application may publish elsewhere, and the library's module does not
// require franz-go at all. So the ~40 lines are ours, and tests hold them
// to the others: the Java client's published vectors and sarama's
// NewMurmur2Partitioner (relay/kafka), and franz-go's
// StickyKeyPartitioner bit for bit on every bit a partition uses
// (integration/partition, in the test module, which may depend on
// franz-go). [Of] must never change: the value is stored on rows already
// written.
//
// # Ordering unit and relay partitions
//
// The ordering unit of the outbox is the aggregate, identified by the pair
// (aggregate type, aggregate ID): events of one aggregate are relayed in the
// order they were written, events of different aggregates are unordered
// with respect to each other. [Of] hashes aggregateType + "\x00" +
// aggregateID into one of count relay partitions (default [DefaultCount]), so
// an aggregate always belongs to exactly one partition and therefore to
// exactly one relay instance at a time (the one holding that partition's
// lease). The relay partition is computed when the row is written and stored
// on the outbox row; relays select rows by the stored value and never
// recompute it, which is why all writers and relays must use the same count.
//
// # toPositive versus abs
//
// Kafka turns the signed 32-bit hash into a non-negative number with
// Utils.toPositive, i.e. h & 0x7fffffff, which for negative h yields h + 2^31.
// Taking an absolute value instead gives a different partition for most
// negative hashes. sarama's hash partitioner (IBM/sarama partitioner.go, as of
// v1.61.1) does exactly that in its default mode: it computes
// int32(hash) % n and negates a negative result, i.e. |h| mod n. Its
// NewHashPartitioner also hashes with FNV-1a rather than murmur2, and even
// NewCustomHashPartitioner given a murmur2 hash.Hash32 keeps the abs step;
// only sarama's NewMurmur2Partitioner and (for the hash, still FNV-1a)
// NewReferenceHashPartitioner mask with 0x7fffffff like Java. Example,
// verified in the tests: murmur2("foobar") = -790332482; with 6 partitions
// Java and this package choose (-790332482 & 0x7fffffff) % 6 =
// 1357151166 % 6 = 0, while the abs form chooses 790332482 % 6 = 2.
package partition
