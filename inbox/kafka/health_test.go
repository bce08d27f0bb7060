package inboxkafka_test

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestMissingTopicFailsFast: with FailFast, Run on a topic that does not
// exist returns ErrTopicNotFound naming it; Ready says the same.
func TestMissingTopicFailsFast(t *testing.T) {
	t.Parallel()
	b, _ := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	missing := randomName("nowhere.")
	r := newRunner(t, b.Addrs(), randomName("g-"), missing, c, func(cfg *inboxkafka.Config) { cfg.FailFast = true })
	if err := r.Ready(); !errors.Is(err, inboxkafka.ErrNotReady) {
		t.Fatalf("Ready before Run = %v, want ErrNotReady", err)
	}
	err := r.Run(testCtx(t, 60*time.Second))
	if !errors.Is(err, inboxkafka.ErrTopicNotFound) || !errors.Is(err, inbox.ErrSourceMissing) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Run = %v, want ErrTopicNotFound naming %s", err, missing)
	}
	if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, missing) {
		t.Fatalf("health handler: %d %q", code, body)
	}
}

// TestMissingTopicWarnsOnceThenConsumes: without FailFast, a runner on a
// topic that does not exist logs one WARN naming it and is not ready
// (ErrTopicNotFound); once the topic is created it consumes and is ready.
func TestMissingTopicWarnsOnceThenConsumes(t *testing.T) {
	t.Parallel()
	b, _ := startBroker(t, 1)
	c := ledgertest.NewDB(t, pgx)
	missing := randomName("nowhere.")
	logs := &ledgertest.LogRecorder{}
	r := newRunner(t, b.Addrs(), randomName("g-"), missing, c, func(cfg *inboxkafka.Config) { cfg.Logger = slog.New(logs) })
	runRunner(t, r)
	ctx := testCtx(t, 120*time.Second)
	testdb.Eventually(t, ctx, "the missing topic reported", func() bool { return errors.Is(r.Ready(), inboxkafka.ErrTopicNotFound) })
	if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, missing) {
		t.Fatalf("health handler: %d %q", code, body)
	}

	adm, err := kadm.NewOptClient(kgo.SeedBrokers(b.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, missing); err != nil {
		t.Fatal(err)
	}
	want := produce(t, b.Addrs(), missing, 2, 5)
	testdb.Eventually(t, ctx, "every record applied and the runner ready", func() bool {
		return r.Stats().Applied == 10 && r.Ready() == nil
	})
	if code, body := ledgertest.Probe(r.HealthHandler()); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("health handler: %d %q", code, body)
	}
	if n := logs.Count(slog.LevelWarn, "does not exist"); n != 1 {
		t.Fatalf("%d WARN lines about the missing topic, want 1", n)
	}
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}

// TestFetchErrorOnEveryPartitionWarnsOnce: when every partition's fetch
// fails with the same error (the broker refuses the topic: one cause for
// all), the runner logs one WARN naming the partitions, not one per
// partition and poll, is not ready meanwhile, and is ready again once
// fetches succeed.
func TestFetchErrorOnEveryPartitionWarnsOnce(t *testing.T) {
	t.Parallel()
	const parts = 8
	b, topic := startBroker(t, parts)
	c := ledgertest.NewDB(t, pgx)
	logs := &ledgertest.LogRecorder{}
	r := newRunner(t, b.Addrs(), randomName("g-"), topic, c, func(cfg *inboxkafka.Config) { cfg.Logger = slog.New(logs) })
	runRunner(t, r)
	ctx := testCtx(t, 120*time.Second)
	want := produce(t, b.Addrs(), topic, 16, 2)
	testdb.Eventually(t, ctx, "the first records applied", func() bool { return r.Stats().Applied == 32 && r.Ready() == nil })

	var refused, refusing atomic.Int64
	refusing.Store(1)
	b.Cluster().ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		b.Cluster().KeepControl()
		if refusing.Load() == 0 {
			return nil, nil, false
		}
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
				refused.Add(1)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	testdb.Eventually(t, ctx, "the refusal reported", func() bool { return r.Ready() != nil && refused.Load() >= 5*parts })
	if err := r.Ready(); !errors.Is(err, inboxkafka.ErrNotReady) || !strings.Contains(err.Error(), "TOPIC_AUTHORIZATION_FAILED") {
		t.Errorf("Ready = %v, want ErrNotReady naming the broker's error", err)
	}
	if n := logs.Count(slog.LevelWarn, "fetch error"); n != 1 {
		t.Errorf("%d WARN lines for %d partitions refused %d times, want 1", n, parts, refused.Load()/parts)
	}
	refusing.Store(0)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for agg := range want {
		for seq := 3; seq <= 4; seq++ {
			if err := cl.ProduceSync(ctx, record(agg, seq)).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		want[agg] = 4
	}
	testdb.Eventually(t, ctx, "every record applied and the runner ready", func() bool { return r.Stats().Applied == 64 && r.Ready() == nil })
	if probs := ledgertest.Check(ledgertest.Read(t, c.DB, c.Ledger), want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
}
