package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sqloutbox/outbox/internal/kafkatxn"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// The tests of internal/kafkatxn, the transaction protocol the relay's
// exactly-once mode (issue 22) is built on, request by request against
// the in-process broker, which implements transactions: what consumers
// at read_committed see, what reached the log anyway (read_uncommitted),
// the manifest, and the fence.

const (
	txnTopic      = "txn.events"
	txnStateTopic = "txn.outbox-txn" // the manifests' carrier: one partition, never written
)

// txnEnv is one test's broker, sarama client and consumers.
type txnEnv struct {
	broker            *kafkatest.Broker
	client            sarama.Client
	committed, uncomm *kafkatest.Consumer
}

func newTxnEnv(t *testing.T) *txnEnv {
	t.Helper()
	b := startBroker(t, 3, txnTopic)
	ctx := testCtx(t, 30*time.Second)
	if err := kafkatest.CreateTopic(ctx, b.Addrs(), txnStateTopic, 1); err != nil {
		t.Fatal(err)
	}
	e := &txnEnv{broker: b, client: txnClient(t, b.Addrs())}
	e.committed, e.uncomm = bothIsolations(t, b.Addrs(), txnTopic)
	return e
}

// txnClient returns a sarama client of addrs at the version the
// transactions need (2.5: RequireStable), closed when the test ends.
func txnClient(t *testing.T, addrs []string) sarama.Client {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_5_0_0
	cl, err := sarama.NewClient(addrs, sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func (e *txnEnv) producer(t *testing.T, ctx context.Context, id string) *kafkatxn.Producer {
	t.Helper()
	p, err := kafkatxn.Init(ctx, kafkatxn.Config{Client: e.client, TransactionalID: id, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("Init %s: %v", id, err)
	}
	t.Cleanup(p.Close)
	return p
}

// records returns one record per value, keyed by key.
func records(key string, values ...string) []*sarama.Record {
	out := make([]*sarama.Record, len(values))
	for i, v := range values {
		out[i] = &sarama.Record{Key: []byte(key), Value: []byte(v)}
	}
	return out
}

// values returns the values of recs, in the order received.
func values(recs []kafkatest.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}

// hasValue reports whether a record of recs has value v.
func hasValue(v string) func([]kafkatest.Record) bool {
	return func(recs []kafkatest.Record) bool { return slices.Contains(values(recs), v) }
}

// commitTxn writes vals to part in one transaction with manifest m, and
// commits it.
func commitTxn(t *testing.T, ctx context.Context, p *kafkatxn.Producer, group string, part int32, m kafkatxn.Manifest, vals ...string) {
	t.Helper()
	if _, err := p.Produce(ctx, txnTopic, part, records("agg", vals...)); err != nil {
		t.Fatalf("Produce: %v", err)
	}
	if err := p.CommitManifest(ctx, group, txnStateTopic, m); err != nil {
		t.Fatalf("CommitManifest: %v", err)
	}
	if err := p.End(ctx, true); err != nil {
		t.Fatalf("End(commit): %v", err)
	}
}

// readManifest reads group's manifest and fails t if there is none.
func readManifest(t *testing.T, ctx context.Context, cl sarama.Client, group string) kafkatxn.Manifest {
	t.Helper()
	m, ok, err := kafkatxn.ReadManifest(ctx, cl, group, txnStateTopic, nil)
	if err != nil || !ok {
		t.Fatalf("ReadManifest %s: ok %v, %v", group, ok, err)
	}
	return m
}

// TestTxnCommitAndManifest: a committed transaction's records reach a
// read_committed consumer, in order, and its manifest reads back; a
// group with none reads as none.
func TestTxnCommitAndManifest(t *testing.T) {
	t.Parallel()
	e := newTxnEnv(t)
	ctx := testCtx(t, time.Minute)
	if _, ok, err := kafkatxn.ReadManifest(ctx, e.client, "txn.none", txnStateTopic, nil); err != nil || ok {
		t.Fatalf("ReadManifest of a group with no commit: ok %v, %v; want none", ok, err)
	}
	p := e.producer(t, ctx, "txn.commit.0")
	want := kafkatxn.Manifest{Epoch: 7, IDs: []int64{3, 4, 9}}
	if _, err := p.Produce(ctx, txnTopic, 0, records("a", "a1", "a2")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Produce(ctx, txnTopic, 1, records("b", "b1")); err != nil {
		t.Fatal(err)
	}
	if err := p.CommitManifest(ctx, "txn.commit.0", txnStateTopic, want); err != nil {
		t.Fatal(err)
	}
	if err := p.End(ctx, true); err != nil {
		t.Fatal(err)
	}
	recs, err := e.committed.WaitForCount(ctx, 3)
	if err != nil {
		t.Fatalf("read_committed: %v; got %v", err, values(recs))
	}
	var a []string
	for _, r := range recs {
		if r.Partition == 0 {
			a = append(a, string(r.Value))
		}
	}
	if !slices.Equal(a, []string{"a1", "a2"}) {
		t.Errorf("partition 0 at read_committed: %v, want [a1 a2]", a)
	}
	if got := readManifest(t, ctx, e.client, "txn.commit.0"); got.Epoch != want.Epoch || !slices.Equal(got.IDs, want.IDs) {
		t.Errorf("manifest %+v, want %+v", got, want)
	}
	// A second transaction of the same producer replaces the manifest.
	next := kafkatxn.Manifest{Epoch: 7, IDs: []int64{10}}
	commitTxn(t, ctx, p, "txn.commit.0", 0, next, "a3")
	if got := readManifest(t, ctx, e.client, "txn.commit.0"); !slices.Equal(got.IDs, next.IDs) {
		t.Errorf("manifest after the second transaction %+v, want %+v", got, next)
	}
}

// TestTxnResetAborts: a transaction whose producer bumps its own epoch
// (Reset, what the relay does after a failed or unknown produce) is
// aborted: its records reached the log (a read_uncommitted consumer sees
// them) but no read_committed consumer ever does, and its manifest does
// not replace the last committed one.
func TestTxnResetAborts(t *testing.T) {
	t.Parallel()
	e := newTxnEnv(t)
	ctx := testCtx(t, time.Minute)
	const group = "txn.reset.0"
	p := e.producer(t, ctx, group)
	first := kafkatxn.Manifest{Epoch: 1, IDs: []int64{1}}
	commitTxn(t, ctx, p, group, 0, first, "kept")
	if _, err := p.Produce(ctx, txnTopic, 0, records("agg", "aborted")); err != nil {
		t.Fatal(err)
	}
	if err := p.CommitManifest(ctx, group, txnStateTopic, kafkatxn.Manifest{Epoch: 1, IDs: []int64{2}}); err != nil {
		t.Fatal(err)
	}
	_, epoch := p.ID()
	if err := p.Reset(ctx); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if _, bumped := p.ID(); bumped <= epoch {
		t.Errorf("epoch after Reset %d, want more than %d", bumped, epoch)
	}
	if got := readManifest(t, ctx, e.client, group); !slices.Equal(got.IDs, first.IDs) {
		t.Errorf("manifest after the aborted transaction %+v, want the committed %+v", got, first)
	}
	// The producer is usable after Reset; its commit is the marker that
	// the read_committed consumer has read past the aborted record.
	commitTxn(t, ctx, p, group, 0, kafkatxn.Manifest{Epoch: 1, IDs: []int64{3}}, "after")
	assertAbortedInvisible(t, ctx, e, "aborted", "after")
}

// assertAbortedInvisible checks that a read_uncommitted consumer received
// the aborted value and a read_committed one did not, once it received
// marker (committed after it on the same partition).
func assertAbortedInvisible(t *testing.T, ctx context.Context, e *txnEnv, aborted, marker string) {
	t.Helper()
	if recs, err := e.uncomm.Wait(ctx, hasValue(aborted)); err != nil {
		t.Fatalf("read_uncommitted never received %q, so the test proves nothing: %v; got %v", aborted, err, values(recs))
	}
	recs, err := e.committed.Wait(ctx, hasValue(marker))
	if err != nil {
		t.Fatalf("read_committed never received %q: %v; got %v", marker, err, values(recs))
	}
	if slices.Contains(values(recs), aborted) {
		t.Errorf("read_committed received the aborted %q: %v", aborted, values(recs))
	}
}

// TestTxnFence: a second Init of the same transactional.id (a new lease
// owner) aborts the first producer's open transaction, and the first
// producer's commit and later requests are refused, its late write is
// not appended at all, and Reset cannot revive it. The new owner's
// manifest read right after Init is the last committed one.
func TestTxnFence(t *testing.T) {
	t.Parallel()
	e := newTxnEnv(t)
	ctx := testCtx(t, time.Minute)
	const id = "txn.fence.0"
	zombie := e.producer(t, ctx, id)
	committed := kafkatxn.Manifest{Epoch: 1, IDs: []int64{5}}
	commitTxn(t, ctx, zombie, id, 1, committed, "z-committed")
	if _, err := zombie.Produce(ctx, txnTopic, 1, records("agg", "z-open")); err != nil {
		t.Fatal(err)
	}

	owner := e.producer(t, ctx, id)
	if got := readManifest(t, ctx, e.client, id); !slices.Equal(got.IDs, committed.IDs) {
		t.Errorf("the new owner's manifest %+v, want %+v", got, committed)
	}
	// Its commit first: the open transaction was aborted by the owner's
	// Init, and the commit is refused.
	if err := zombie.End(ctx, true); !errors.Is(err, kafkatxn.ErrFenced) {
		t.Errorf("zombie End(commit): %v, want ErrFenced", err)
	}
	// Then a late write: refused (the broker answers it as not part of a
	// transaction, INVALID_TXN_STATE, or as fenced; either way nothing is
	// appended: see the read_uncommitted check below), and the rest.
	if _, err := zombie.Produce(ctx, txnTopic, 1, records("agg", "z-late")); err == nil {
		t.Errorf("zombie Produce after the fence: accepted")
	}
	if err := zombie.CommitManifest(ctx, id, txnStateTopic, kafkatxn.Manifest{Epoch: 1, IDs: []int64{6}}); !errors.Is(err, kafkatxn.ErrFenced) {
		t.Errorf("zombie CommitManifest: %v, want ErrFenced", err)
	}
	if err := zombie.End(ctx, true); !errors.Is(err, kafkatxn.ErrAborted) && !errors.Is(err, kafkatxn.ErrFenced) {
		t.Errorf("zombie End(commit) after a refused write: %v, want ErrAborted or ErrFenced", err)
	}
	if err := zombie.Reset(ctx); !errors.Is(err, kafkatxn.ErrFenced) {
		t.Errorf("zombie Reset: %v, want ErrFenced", err)
	}
	commitTxn(t, ctx, owner, id, 1, kafkatxn.Manifest{Epoch: 2, IDs: []int64{7}}, "owner")
	assertAbortedInvisible(t, ctx, e, "z-open", "owner")
	if recs := e.uncomm.Records(); slices.Contains(values(recs), "z-late") {
		t.Errorf("the fenced producer's late record reached the log: %v", values(recs))
	}
	if got := readManifest(t, ctx, e.client, id); !slices.Equal(got.IDs, []int64{7}) {
		t.Errorf("manifest %+v, want the new owner's [7]", got)
	}
}

// TestTxnManyProducers: one producer per relay partition, as the mode
// runs them, commit independently; each group's manifest is its own.
func TestTxnManyProducers(t *testing.T) {
	t.Parallel()
	e := newTxnEnv(t)
	ctx := testCtx(t, time.Minute)
	const n = 8
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			id := fmt.Sprintf("txn.many.%d", i)
			p, err := kafkatxn.Init(ctx, kafkatxn.Config{Client: e.client, TransactionalID: id, Timeout: time.Minute})
			if err == nil {
				defer p.Close()
				_, err = p.Produce(ctx, txnTopic, int32(i%3), records(id, id))
			}
			if err == nil {
				err = p.CommitManifest(ctx, id, txnStateTopic, kafkatxn.Manifest{Epoch: int64(i), IDs: []int64{int64(100 + i)}})
			}
			if err == nil {
				err = p.End(ctx, true)
			}
			errs <- err
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if recs, err := e.committed.WaitForCount(ctx, n); err != nil {
		t.Fatalf("read_committed: %v; got %v", err, values(recs))
	}
	for i := 0; i < n; i++ {
		if got := readManifest(t, ctx, e.client, fmt.Sprintf("txn.many.%d", i)); got.Epoch != int64(i) || !slices.Equal(got.IDs, []int64{int64(100 + i)}) {
			t.Errorf("manifest of producer %d: %+v", i, got)
		}
	}
}

// TestTxnProduceBatches: ProduceBatches writes many partitions' record
// batches in one produce request per leader (3 brokers, 6 partitions: at
// most 3 requests, not 6), resends only the partitions whose answer is
// retriable (each record reaches the log once), and fails only the
// batches refused for good, leaving the transaction unable to commit.
func TestTxnProduceBatches(t *testing.T) {
	t.Parallel()
	const topic, parts = "txn.batches", 6
	cases := []struct {
		name  string
		fault *kfake.Fault // on partition 2's produce, once
		// want: partition 2's batch fails for good (the others are
		// written, the commit is refused); else all commit.
		want2Fails bool
	}{
		{name: "all written"},
		{name: "one partition retried", fault: &kfake.Fault{Err: kerr.NotLeaderForPartition}},
		{name: "one partition refused", fault: &kfake.Fault{Err: kerr.CorruptMessage}, want2Fails: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := kafkatest.Start(kafkatest.Topics(parts, topic), kafkatest.KfakeOptions(kfake.NumBrokers(3)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.Close)
			ctx := testCtx(t, time.Minute)
			if err := kafkatest.CreateTopic(ctx, b.Addrs(), txnStateTopic, 1); err != nil {
				t.Fatal(err)
			}
			cl := txnClient(t, b.Addrs())
			committed, uncomm := bothIsolations(t, b.Addrs(), topic)
			p, err := kafkatxn.Init(ctx, kafkatxn.Config{Client: cl, TransactionalID: "txn.batches", Timeout: time.Minute,
				Retriable: func(err error) bool { return errors.Is(err, sarama.ErrNotLeaderForPartition) }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			leaders := map[int32]bool{}
			for part := range int32(parts) {
				leaders[b.Cluster().LeaderFor(topic, part)] = true
			}
			if len(leaders) < 2 {
				t.Fatalf("the partitions' leaders %v: want several brokers", leaders)
			}
			requests := b.Cluster().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Count: -1, Observe: true})
			if tc.fault != nil {
				f := *tc.fault
				f.Keys, f.Topic, f.Partitions = []kmsg.Key{kmsg.Produce}, topic, []int32{2}
				b.Cluster().Fault(f)
			}
			var batches []kafkatxn.Batch
			var want []string
			for part := range int32(parts) {
				v := fmt.Sprintf("p%d", part)
				batches = append(batches, kafkatxn.Batch{Topic: topic, Partition: part, Records: records("k", v+"a", v+"b")})
				want = append(want, v+"a", v+"b")
			}
			if tc.want2Fails {
				// A partition listed twice is refused too, alone (it
				// also leaves the transaction unable to commit).
				batches = append(batches, kafkatxn.Batch{Topic: topic, Partition: 0, Records: records("k", "twice")})
			}
			written := p.ProduceBatches(ctx, batches)
			if tc.want2Fails && written[parts].Err == nil {
				t.Error("a partition listed twice: no error")
			}
			for part, w := range written[:parts] {
				if fails := part == 2 && tc.want2Fails; (w.Err != nil) != fails {
					t.Errorf("partition %d: %v, want an error: %v", part, w.Err, fails)
				}
			}
			retries := 0
			if tc.fault != nil && !tc.want2Fails {
				retries = 1
			}
			if got := requests.Hits(); got != len(leaders)+retries {
				t.Errorf("%d produce requests, want %d (one per leader, %d brokers lead, plus %d retry)", got, len(leaders)+retries, len(leaders), retries)
			}
			if tc.want2Fails {
				if err := p.End(ctx, true); !errors.Is(err, kafkatxn.ErrAborted) {
					t.Fatalf("End(commit) after a refused batch: %v, want ErrAborted", err)
				}
				return
			}
			if err := p.End(ctx, true); err != nil {
				t.Fatal(err)
			}
			recs, err := committed.WaitForCount(ctx, len(want))
			if err != nil {
				t.Fatalf("read_committed: %v; got %v", err, values(recs))
			}
			got := values(recs)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("read_committed got %v, want %v", got, want)
			}
			// Every record once in the log, the retried partition's too.
			all, err := uncomm.WaitForCount(ctx, len(want))
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != len(want) {
				t.Errorf("read_uncommitted: %d records, want %d: %v", len(all), len(want), values(all))
			}
		})
	}
}
