package kafkatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func produce(t *testing.T, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func TestProduceConsume(t *testing.T) {
	t.Parallel()
	const topic = "kafkatest.roundtrip"
	b, err := Start(Topics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if len(b.Addrs()) != 1 {
		t.Fatalf("Addrs = %v, want one broker", b.Addrs())
	}
	c, err := NewConsumer(b.Addrs(), []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const n = 20
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{
			Topic:   topic,
			Key:     []byte(fmt.Sprintf("k%d", i%3)),
			Value:   []byte(fmt.Sprintf(`{"i":%d}`, i)),
			Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(fmt.Sprint(i))}},
		})
	}
	before := time.Now()
	produce(t, b.Addrs(), recs...)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := c.WaitForCount(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("got %d records, want %d", len(got), n)
	}
	seen := map[string]bool{}
	lastOffset := map[int32]int64{}
	keyPartition := map[string]int32{}
	for _, r := range got {
		if r.Topic != topic {
			t.Errorf("topic %q", r.Topic)
		}
		if r.Received.Before(before) {
			t.Errorf("received %v before produce started %v", r.Received, before)
		}
		if last, ok := lastOffset[r.Partition]; ok && r.Offset <= last {
			t.Errorf("partition %d: offset %d after %d", r.Partition, r.Offset, last)
		}
		lastOffset[r.Partition] = r.Offset
		if p, ok := keyPartition[string(r.Key)]; ok && p != r.Partition {
			t.Errorf("key %s on partitions %d and %d", r.Key, p, r.Partition)
		}
		keyPartition[string(r.Key)] = r.Partition
		var i int
		if _, err := fmt.Sscanf(string(r.Value), `{"i":%d}`, &i); err != nil {
			t.Fatalf("value %q: %v", r.Value, err)
		}
		if r.Headers["h"] != fmt.Sprint(i) {
			t.Errorf("record %d: header h = %q", i, r.Headers["h"])
		}
		seen[string(r.Value)] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct values, want %d", len(seen), n)
	}
	if errs := c.Errors(); len(errs) > 0 {
		t.Errorf("fetch errors: %v", errs)
	}
}

func TestWaitDeadline(t *testing.T) {
	t.Parallel()
	b, err := Start(Topics(1, "kafkatest.empty"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := NewConsumer(b.Addrs(), []string{"kafkatest.empty"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.WaitForCount(ctx, 1); err == nil {
		t.Fatal("WaitForCount on an empty topic returned nil error")
	}
	c.Close() // twice is fine
}

func TestCreateTopicAndConsumeFromEnd(t *testing.T) {
	t.Parallel()
	const topic = "kafkatest.created"
	b, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopic(ctx, b.Addrs(), topic, 3); err != nil {
		t.Fatal(err)
	}
	if err := CreateTopic(ctx, b.Addrs(), topic, 3); err != nil {
		t.Fatalf("second CreateTopic: %v", err)
	}
	produce(t, b.Addrs(), &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("old")})
	ends, err := EndOffsets(ctx, b.Addrs(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != 3 {
		t.Fatalf("EndOffsets = %v, want 3 partitions", ends)
	}
	c, err := NewConsumerAt(b.Addrs(), map[string]map[int32]int64{topic: ends})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	produce(t, b.Addrs(), &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("new")})
	got, err := c.WaitForCount(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(got[0].Value) != "new" {
		t.Fatalf("first record consumed = %q, want only the one produced after EndOffsets", got[0].Value)
	}
}

func TestKfakeOptions(t *testing.T) {
	t.Parallel()
	b, err := Start(KfakeOptions(kfake.SeedTopics(2, "kafkatest.raw")))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := EndOffsets(ctx, b.Addrs(), "kafkatest.raw")
	if err != nil {
		t.Fatal(err)
	}
	if len(ends) != 2 {
		t.Fatalf("EndOffsets = %v, want the 2 partitions kfake.SeedTopics created", ends)
	}
	if _, err := EndOffsets(ctx, b.Addrs(), "kafkatest.nosuch"); err == nil {
		t.Fatal("EndOffsets of a missing topic returned nil error")
	}
}
