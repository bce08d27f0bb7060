package inboxkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// groupSettings make a SIGKILLed member's partitions move on quickly.
func groupSettings() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(2 * time.Second),
		kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.FetchMaxWait(50 * time.Millisecond),
	}
}

// startBroker starts an in-process broker with one topic of its own.
func startBroker(t testing.TB, partitions int32) (*kafkatest.Broker, string) {
	t.Helper()
	topic := randomName("t.")
	b, err := kafkatest.Start(kafkatest.Topics(partitions, topic),
		kafkatest.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, topic
}

// produce writes n records per aggregate (seq 1..n) with the relay's
// headers, keyed by aggregate, and returns the last seq per aggregate.
func produce(t testing.TB, brokers []string, topic string, aggregates, n int) map[string]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	want := map[string]int{}
	var recs []*kgo.Record
	for seq := 1; seq <= n; seq++ {
		for a := 0; a < aggregates; a++ {
			agg := fmt.Sprintf("agg-%03d", a)
			recs = append(recs, record(agg, seq))
			want[agg] = seq
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return want
}

func record(agg string, seq int) *kgo.Record {
	return &kgo.Record{Key: []byte(agg), Value: []byte(fmt.Sprintf(`{"seq":%d}`, seq)), Headers: []kgo.RecordHeader{
		{Key: emit.HeaderMessageID, Value: []byte(randomName("m-"))},
		{Key: emit.HeaderAggregateType, Value: []byte("order")},
		{Key: emit.HeaderAggregateID, Value: []byte(agg)},
		{Key: emit.HeaderEventType, Value: []byte("order.step")},
	}}
}

// fastRetry is a 1 ms constant backoff.
func fastRetry() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

// runRunner runs r until the test ends (or stop is called); stop waits
// for Run to return.
func runRunner(t testing.TB, r *inboxkafka.Runner) (stop func()) { return ledgertest.Serve(t, r.Run) }

func testCtx(t testing.TB, d time.Duration) context.Context { return ledgertest.Context(t, d) }

// Environment of the ledger's children (besides ledgertest's).
const (
	envBrokers = "INBOXKAFKA_BROKERS"
	envGroup   = "INBOXKAFKA_GROUP"
	envTopic   = "INBOXKAFKA_TOPIC"
)

// TestMain lets the test binary double as a consumer process or a relay
// process, so tests can SIGKILL them.
func TestMain(m *testing.M) { ledgertest.Main(m, consumerChild, relayChild) }

// kafkaEnv is the children's Kafka environment.
func kafkaEnv(brokers []string, group, topic string) []string {
	return []string{envBrokers + "=" + strings.Join(brokers, ","), envGroup + "=" + group, envTopic + "=" + topic}
}

// consumerChild runs a Runner of the ledger's consumer (ledgertest) on
// the Kafka group and topic of the environment.
func consumerChild() int {
	return ledgertest.ConsumerChild(func(ctx context.Context, c *ledgertest.Consumer) error {
		r, err := inboxkafka.NewRunner(inboxkafka.Config{
			BatchSize: c.Batch, Brokers: strings.Split(os.Getenv(envBrokers), ","), Group: os.Getenv(envGroup),
			Topics: []string{os.Getenv(envTopic)}, Inbox: c.Inbox, DB: c.DB, Handler: c.Handler, Backoff: fastRetry,
			Observer: fileObserver{c}, Logger: c.Logger, CommitInterval: 100 * time.Millisecond, Kgo: groupSettings(),
		})
		if err != nil {
			return err
		}
		if err := r.Run(ctx); err != nil {
			return err
		}
		fmt.Printf("consumer child stats: %+v\n", r.Stats())
		return nil
	})
}

// fileObserver records each stored outcome under "<topic>/<partition>/<offset>".
type fileObserver struct{ c *ledgertest.Consumer }

func (o fileObserver) Processed(r inboxkafka.Result) {
	o.c.Record(!r.Parked && r.Outcome == inbox.Duplicate, fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset))
}
func (fileObserver) AttemptFailed(string, int32, int, error) {}
func (fileObserver) Lag(string, int32, int64)                {}
func (fileObserver) PartitionRevoked(string, int32)          {}

// relayChild runs the ledger's relay publishing to the environment's topic.
func relayChild() int {
	topic := os.Getenv(envTopic)
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: strings.Split(os.Getenv(envBrokers), ","),
		Topic: func(relay.Message) string { return topic }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pub.Close()
	return ledgertest.RelayChild(pub)
}
