// Package kafkatxn speaks Kafka's transaction protocol (KIP-98) with
// sarama's request types: the building blocks of the relay's exactly-once
// mode (issue 22), kept apart from the publisher so that they can be
// tested request by request against a real Kafka-protocol broker.
//
// A Producer is one transactional producer: its transactional.id, and the
// producer ID and epoch that InitProducerId gave it. InitProducerId is
// also the fence: it bumps the epoch, so the broker refuses every later
// request of an earlier holder of the same transactional.id
// (PRODUCER_FENCED or INVALID_PRODUCER_EPOCH), and it completes that
// holder's open transaction (a transaction the holder had asked to commit
// is committed, any other is aborted) before it answers. So whoever gets
// a new epoch and then reads the last committed manifest (ReadManifest,
// with RequireStable) learns exactly which rows reached consumers that
// read at read_committed.
//
// One transaction is: Produce to each partition (AddPartitionsToTxn the
// first time the transaction writes to it; ProduceBatches writes many
// partitions' record batches in one produce request per leader),
// CommitManifest (AddOffsetsToTxn
// and TxnOffsetCommit: the rows' outbox ids as the metadata of an offset
// commit for a group named after the producer, committed atomically with
// the records), then End. A produce that failed, or whose outcome is
// unknown, leaves the transaction unable to commit: the caller calls Reset,
// which bumps the epoch (InitProducerId with the current producer ID and
// epoch, as KAFKA-14053 has Java clients do after an unknown produce
// outcome, instead of EndTxn(abort), which a late produce request could
// still overtake) and so aborts it at the coordinator.
//
// sarama's own transactional producer (AsyncProducer with
// Producer.Transaction.ID) is not used: it turns a fenced producer into a
// fatal error that needs a new client (IBM/sarama#2859), its waits take
// no context, and it cannot be driven one request at a time, which the
// publisher's per-aggregate order needs (see relay/kafka).
package kafkatxn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Errors of a Producer. Each wraps the broker's error (a sarama.KError)
// where there is one.
var (
	// ErrFenced: a later InitProducerId for the same transactional.id
	// bumped the epoch (another relay acquired the partition's lease).
	// The Producer is unusable; the caller makes a new one with Init, if
	// it still owns the partition.
	ErrFenced = errors.New("outbox/kafkatxn: producer fenced by a later epoch")
	// ErrOutcomeUnknown: a commit was asked for and no answer came (a
	// lost connection, a deadline). The transaction may have committed;
	// only a new epoch and ReadManifest can tell.
	ErrOutcomeUnknown = errors.New("outbox/kafkatxn: transaction outcome unknown")
	// ErrAborted: the transaction cannot commit (a produce failed or its
	// outcome is unknown, or the coordinator aborted it after
	// transaction.timeout.ms); the caller calls Reset, which aborts it.
	ErrAborted = errors.New("outbox/kafkatxn: transaction cannot commit")
	// ErrUnauthorized: the principal lacks WRITE on the transactional.id
	// or the group's READ (TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
	// GROUP_AUTHORIZATION_FAILED); retrying does not help until an
	// operator grants it.
	ErrUnauthorized = errors.New("outbox/kafkatxn: not authorized")
)

// Config is what a Producer needs.
type Config struct {
	// Client resolves coordinators and partition leaders. Its
	// configuration (Net.*) opens the broker connections; its Version
	// must be at least sarama.V2_5_0_0 (RequireStable, KIP-447).
	Client sarama.Client
	// TransactionalID is the producer's transactional.id; required.
	TransactionalID string
	// Timeout is transaction.timeout.ms: the coordinator aborts a
	// transaction left open longer. Required; at most the broker's
	// transaction.max.timeout.ms (15 minutes by default).
	Timeout time.Duration
	// Backoff is the wait before the n-th retry (n from 1) of a request
	// the coordinator answered with a retriable error
	// (CONCURRENT_TRANSACTIONS while an earlier transaction completes,
	// NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, a lost
	// connection); nil: 20 ms doubling to 500 ms. Retries end with ctx.
	Backoff func(n int) time.Duration
	// Retriable reports whether a produce error (a request error, or a
	// partition's sarama.KError) leaves the record batch to be sent
	// again unchanged (NOT_LEADER_OR_FOLLOWER, a lost connection, ...);
	// nil: none is. ProduceBatches' doc says how.
	Retriable func(error) bool
}

// topicPartition names one Kafka partition.
type topicPartition struct {
	topic string
	part  int32
}

// Producer is one transactional producer. Within one transaction,
// Produce or ProduceBatches to different partitions and CommitManifest
// may run at the same time; Init, Reset and End must not overlap
// anything.
type Producer struct {
	cfg   Config
	sc    *sarama.Config
	pid   int64
	epoch int16

	mu     sync.Mutex
	conns  map[string]*sarama.Broker // this producer's own connections, by address
	seq    map[topicPartition]int32  // next sequence, under pid and epoch
	added  map[topicPartition]bool   // partitions added to the open transaction
	groups map[string]bool           // groups added to the open transaction
	broken error                     // why the open transaction cannot commit; nil: it can
	fenced bool
}

// Init returns a Producer with a new epoch for cfg.TransactionalID: every
// earlier producer of that id is fenced and its open transaction
// completed. It returns an error wrapping ErrUnauthorized if the
// principal may not use the transactional.id, ctx's error if it ends
// first, or the last error of the coordinator lookup.
func Init(ctx context.Context, cfg Config) (*Producer, error) {
	if cfg.Client == nil || cfg.TransactionalID == "" || cfg.Timeout <= 0 {
		return nil, errors.New("outbox/kafkatxn: Init needs a Client, a TransactionalID and a Timeout")
	}
	if cfg.Backoff == nil {
		cfg.Backoff = defaultBackoff
	}
	p := &Producer{cfg: cfg, sc: cfg.Client.Config(), pid: -1, epoch: -1}
	if err := p.initID(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func defaultBackoff(n int) time.Duration {
	d := 20 * time.Millisecond << min(n-1, 5)
	return min(d, 500*time.Millisecond)
}

// ID returns the producer ID and epoch the broker gave this Producer.
func (p *Producer) ID() (pid int64, epoch int16) { return p.pid, p.epoch }

// Reset aborts the open transaction, if any, by bumping the epoch
// (InitProducerId with the current producer ID and epoch), and makes the
// Producer ready for the next one. It wraps ErrFenced if another producer
// took the transactional.id meanwhile.
func (p *Producer) Reset(ctx context.Context) error {
	if p.isFenced() {
		return fmt.Errorf("%w: %s", ErrFenced, p.cfg.TransactionalID)
	}
	return p.initID(ctx)
}

func (p *Producer) isFenced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fenced
}

// conn returns this producer's own connection to shared's address
// (opening it the first time): each producer talks to the brokers over
// connections of its own, as each Java producer does, so that the
// transactions of many relay partitions do not queue behind each other on
// the client's one connection per broker.
func (p *Producer) conn(shared *sarama.Broker) *sarama.Broker {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		p.conns = map[string]*sarama.Broker{}
	}
	b := p.conns[shared.Addr()]
	if b == nil {
		b = sarama.NewBroker(shared.Addr())
		_ = b.Open(p.sc) // connects in the background; the first request waits for it
		p.conns[shared.Addr()] = b
	}
	return b
}

// drop closes b and forgets it, if it is still this producer's
// connection to its address.
func (p *Producer) drop(b *sarama.Broker) {
	p.mu.Lock()
	if p.conns[b.Addr()] == b {
		delete(p.conns, b.Addr())
	}
	p.mu.Unlock()
	_ = b.Close()
}

// Close closes the producer's connections. It does not end an open
// transaction (a later Init of the same transactional.id, or the
// coordinator's timeout, does). The Producer must not be used after.
func (p *Producer) Close() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, b := range conns {
		_ = b.Close()
	}
}

// initID runs InitProducerId at the transaction coordinator until it
// answers with an ID, retrying what is retriable.
func (p *Producer) initID(ctx context.Context) error {
	req := &sarama.InitProducerIDRequest{Version: initVersion(p.sc.Version), TransactionalID: &p.cfg.TransactionalID,
		TransactionTimeout: p.cfg.Timeout, ProducerID: -1, ProducerEpoch: -1}
	if req.Version >= 3 && p.pid >= 0 {
		req.ProducerID, req.ProducerEpoch = p.pid, p.epoch // KIP-360: bump this producer's epoch
	}
	resp, err := retryCoordinator(ctx, p, "InitProducerId", func(b *sarama.Broker) (*sarama.InitProducerIDResponse, sarama.KError, error) {
		r, err := b.InitProducerID(req)
		if err != nil {
			return nil, 0, err
		}
		return r, r.Err, nil
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pid, p.epoch = resp.ProducerID, resp.ProducerEpoch
	p.seq, p.added, p.groups, p.broken = map[topicPartition]int32{}, map[topicPartition]bool{}, map[string]bool{}, nil
	return nil
}

// initVersion is the InitProducerId version for a broker of version v:
// 3 (KIP-360, bumping an epoch) from Kafka 2.5, else 1.
func initVersion(v sarama.KafkaVersion) int16 {
	if v.IsAtLeast(sarama.V2_5_0_0) {
		return 3
	}
	return 1
}

// Produce writes records to topic's partition part inside the open
// transaction, as one record batch in one produce request (the broker
// appends it whole or not at all), and returns the offset of its first
// record: ProduceBatches with one Batch.
func (p *Producer) Produce(ctx context.Context, topic string, part int32, records []*sarama.Record) (int64, error) {
	r := p.ProduceBatches(ctx, []Batch{{Topic: topic, Partition: part, Records: records}})
	return r[0].Offset, r[0].Err
}

// Batch is one partition's records for ProduceBatches, written as one
// record batch.
type Batch struct {
	Topic     string
	Partition int32
	Records   []*sarama.Record
}

// Written is ProduceBatches' outcome for one Batch: the offset of its
// first record once the broker appended it (Err nil), or why not.
type Written struct {
	Offset int64
	Err    error
}

// ProduceBatches writes each of batches (at most one per partition) as
// one record batch inside the open transaction, and returns the outcome
// of each, in the same order. The partitions not added to the transaction
// yet are added first, in one AddPartitionsToTxn request; then the
// batches go to their partitions' leaders in one produce request per
// leader (Kafka takes one record batch per partition per request from a
// transactional producer), the leaders at the same time. So a transaction
// that writes to many partitions of one broker costs one produce request,
// not one per partition. An answer Config.Retriable accepts for a
// partition (or a request with no answer, for each of its partitions)
// sends that partition's record batch again, unchanged, with the same
// sequence, after Backoff and a metadata refresh, in one request with
// the other partitions to retry, until ctx ends: the broker recognizes a
// batch it already appended by its sequence (DUPLICATE_SEQUENCE_NUMBER
// counts as written). Any other error, a partition listed twice, and
// ctx's end fail that batch and leave the transaction unable to commit
// (End then wraps ErrAborted); the other batches' outcomes stand. A
// fenced producer's errors wrap ErrFenced.
func (p *Producer) ProduceBatches(ctx context.Context, batches []Batch) []Written {
	out := make([]Written, len(batches))
	add := map[string][]int32{}
	seen := map[topicPartition]bool{}
	var todo []int // indexes of batches still to write
	for i, b := range batches {
		tp := topicPartition{b.Topic, b.Partition}
		if seen[tp] {
			out[i].Err = p.breakTxn(fmt.Errorf("outbox/kafkatxn: produce to %s/%d: the partition is listed twice in one ProduceBatches", b.Topic, b.Partition))
			continue
		}
		seen[tp] = true
		add[b.Topic] = append(add[b.Topic], b.Partition)
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return out
	}
	if err := p.AddPartitions(ctx, add); err != nil {
		for _, i := range todo {
			out[i].Err = err
		}
		return out
	}
	now := time.Now().Truncate(time.Millisecond)
	rbs := make([]*sarama.RecordBatch, len(batches))
	p.mu.Lock()
	for _, i := range todo {
		b := batches[i]
		for j, r := range b.Records {
			r.OffsetDelta = int64(j)
		}
		rbs[i] = &sarama.RecordBatch{Version: 2, IsTransactional: true, ProducerID: p.pid, ProducerEpoch: p.epoch,
			FirstSequence: p.seq[topicPartition{b.Topic, b.Partition}], FirstTimestamp: now, MaxTimestamp: now,
			LastOffsetDelta: int32(len(b.Records) - 1), Records: b.Records,
			Codec: p.sc.Producer.Compression, CompressionLevel: p.sc.Producer.CompressionLevel}
	}
	p.mu.Unlock()
	last := make([]error, len(batches)) // each batch's last retriable error
	for n := 1; len(todo) > 0; n++ {
		errs := p.produceRound(ctx, batches, rbs, todo)
		var again []int
		for k, i := range todo {
			b := batches[i]
			switch err := errs[k].err; {
			case err == nil:
				p.mu.Lock()
				p.seq[topicPartition{b.Topic, b.Partition}] = rbs[i].FirstSequence + int32(len(b.Records))
				p.mu.Unlock()
				out[i].Offset = errs[k].offset
			case ctx.Err() != nil || p.cfg.Retriable == nil || !p.cfg.Retriable(err):
				out[i].Err = p.breakTxn(fmt.Errorf("outbox/kafkatxn: produce to %s/%d: %w", b.Topic, b.Partition, err))
			default:
				last[i] = err
				again = append(again, i)
			}
		}
		todo = again
		if len(todo) == 0 {
			break
		}
		topics := map[string]bool{}
		for _, i := range todo {
			if t := batches[i].Topic; !topics[t] {
				topics[t] = true
				_ = p.cfg.Client.RefreshMetadata(t)
			}
		}
		t := time.NewTimer(p.cfg.Backoff(n))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			for _, i := range todo {
				b := batches[i]
				out[i].Err = p.breakTxn(fmt.Errorf("outbox/kafkatxn: produce to %s/%d: %w (last: %w)", b.Topic, b.Partition, ctx.Err(), last[i]))
			}
			return out
		}
	}
	return out
}

// roundResult is produceRound's outcome for one batch.
type roundResult struct {
	offset int64
	err    error
}

// produceRound sends the record batches rbs[todo[k]] once: one produce
// request per leader, the leaders at the same time. It returns the
// outcome of each, by k: the offset of its first record, or the request's
// error, or its partition's error code (a sarama.KError; fenced codes
// wrapped in ErrFenced).
func (p *Producer) produceRound(ctx context.Context, batches []Batch, rbs []*sarama.RecordBatch, todo []int) []roundResult {
	res := make([]roundResult, len(todo))
	type request struct {
		leader *sarama.Broker
		ks     []int // positions in todo
		req    *sarama.ProduceRequest
	}
	var reqs []*request
	byLeader := map[*sarama.Broker]*request{}
	for k, i := range todo {
		b := batches[i]
		leader, err := p.cfg.Client.Leader(b.Topic, b.Partition)
		if err != nil {
			res[k].err = err
			continue
		}
		r := byLeader[leader]
		if r == nil {
			r = &request{leader: leader, req: &sarama.ProduceRequest{TransactionalID: &p.cfg.TransactionalID, RequiredAcks: sarama.WaitForAll,
				Timeout: int32(p.sc.Producer.Timeout / time.Millisecond), Version: 3}}
			byLeader[leader] = r
			reqs = append(reqs, r)
		}
		r.req.AddBatch(b.Topic, b.Partition, rbs[i])
		r.ks = append(r.ks, k)
	}
	send := func(r *request) {
		if err := ctx.Err(); err != nil {
			for _, k := range r.ks {
				res[k].err = err // not sent: call would send it in the background
			}
			return
		}
		resp, err := call(ctx, func() (*sarama.ProduceResponse, error) {
			b := p.conn(r.leader)
			resp, err := b.Produce(r.req)
			if err != nil {
				p.drop(b) // a broken connection: the next try dials again
			}
			return resp, err
		})
		for _, k := range r.ks {
			b := batches[todo[k]]
			if err != nil {
				res[k].err = err
				continue
			}
			blk := resp.GetBlock(b.Topic, b.Partition)
			switch {
			case blk == nil:
				res[k].err = errors.New("no answer for the partition")
			case blk.Err == sarama.ErrNoError, blk.Err == sarama.ErrDuplicateSequenceNumber:
				res[k].offset = blk.Offset
			case blk.Err == sarama.ErrProducerFenced, blk.Err == sarama.ErrInvalidProducerEpoch:
				res[k].err = fmt.Errorf("%w: %w", ErrFenced, blk.Err)
			default:
				res[k].err = blk.Err
			}
		}
	}
	if len(reqs) == 1 {
		send(reqs[0])
		return res
	}
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() { send(r) })
	}
	wg.Wait()
	return res
}

// AddPartitions adds partitions (topic -> partitions) to the open
// transaction in one AddPartitionsToTxn request, leaving out those already
// added; Produce adds a partition it writes to first if it was not. Adding
// a transaction's partitions up front costs one round trip for all of
// them instead of one per partition. An error leaves the transaction
// unable to commit.
func (p *Producer) AddPartitions(ctx context.Context, partitions map[string][]int32) error {
	want := map[string][]int32{}
	var tps []topicPartition
	p.mu.Lock()
	for topic, parts := range partitions {
		for _, part := range parts {
			tp := topicPartition{topic, part}
			if !p.added[tp] && !slices.Contains(tps, tp) {
				want[topic] = append(want[topic], part)
				tps = append(tps, tp)
			}
		}
	}
	p.mu.Unlock()
	if len(tps) == 0 {
		return nil
	}
	req := &sarama.AddPartitionsToTxnRequest{Version: 1, TransactionalID: p.cfg.TransactionalID, ProducerID: p.pid, ProducerEpoch: p.epoch,
		TopicPartitions: want}
	_, err := retryCoordinator(ctx, p, "AddPartitionsToTxn", func(b *sarama.Broker) (*sarama.AddPartitionsToTxnResponse, sarama.KError, error) {
		r, err := b.AddPartitionsToTxn(req)
		if err != nil {
			return nil, 0, err
		}
		for _, errs := range r.Errors {
			for _, pe := range errs {
				// OPERATION_NOT_ATTEMPTED: another partition's error
				// stopped this one; report that one instead.
				if pe.Err != sarama.ErrNoError && pe.Err != sarama.ErrOperationNotAttempted {
					return r, pe.Err, nil
				}
			}
		}
		return r, sarama.ErrNoError, nil
	})
	if err != nil {
		return p.breakTxn(err)
	}
	p.mu.Lock()
	for _, tp := range tps {
		p.added[tp] = true
	}
	p.mu.Unlock()
	return nil
}

// CommitManifest records m in the open transaction, as the metadata of a
// transactional offset commit of group for partition 0 of topic (which
// must exist: a broker refuses offsets for unknown partitions): readers
// see it once the transaction commits, and never if it aborts. Offsets
// are only a carrier here; the offset stored is m's last id (0 if none).
func (p *Producer) CommitManifest(ctx context.Context, group, topic string, m Manifest) error {
	meta, err := m.Encode()
	if err != nil {
		return err
	}
	p.mu.Lock()
	added := p.groups[group]
	p.mu.Unlock()
	if !added {
		req := &sarama.AddOffsetsToTxnRequest{Version: 1, TransactionalID: p.cfg.TransactionalID, ProducerID: p.pid, ProducerEpoch: p.epoch, GroupID: group}
		if _, err := retryCoordinator(ctx, p, "AddOffsetsToTxn", func(b *sarama.Broker) (*sarama.AddOffsetsToTxnResponse, sarama.KError, error) {
			r, err := b.AddOffsetsToTxn(req)
			if err != nil {
				return nil, 0, err
			}
			return r, r.Err, nil
		}); err != nil {
			return p.breakTxn(err)
		}
		p.mu.Lock()
		p.groups[group] = true
		p.mu.Unlock()
	}
	offset := int64(0)
	if len(m.IDs) > 0 {
		offset = m.IDs[len(m.IDs)-1]
	}
	req := &sarama.TxnOffsetCommitRequest{Version: 3, TransactionalID: p.cfg.TransactionalID, GroupID: group,
		ProducerID: p.pid, ProducerEpoch: p.epoch, GenerationID: -1,
		Topics: map[string][]*sarama.PartitionOffsetMetadata{topic: {{Partition: 0, Offset: offset, LeaderEpoch: -1, Metadata: &meta}}}}
	_, err = retryGroup(ctx, p, group, "TxnOffsetCommit", func(b *sarama.Broker) (*sarama.TxnOffsetCommitResponse, sarama.KError, error) {
		r, err := b.TxnOffsetCommit(req)
		if err != nil {
			return nil, 0, err
		}
		for _, pe := range r.Topics[topic] {
			if pe.Err != sarama.ErrNoError {
				return r, pe.Err, nil
			}
		}
		return r, sarama.ErrNoError, nil
	})
	if err != nil {
		return p.breakTxn(err)
	}
	return nil
}

// End commits (commit true) or aborts the open transaction (EndTxn). A
// transaction whose produce or manifest failed cannot commit: End(true)
// then returns an error wrapping ErrAborted without asking, and the caller
// calls Reset. A commit with no answer wraps ErrOutcomeUnknown; a fenced
// producer's ErrFenced.
func (p *Producer) End(ctx context.Context, commit bool) error {
	p.mu.Lock()
	broken, empty := p.broken, len(p.added) == 0 && len(p.groups) == 0
	p.mu.Unlock()
	if commit && broken != nil {
		return fmt.Errorf("%w: %w", ErrAborted, broken)
	}
	if empty {
		return nil // nothing was added: no transaction is open at the coordinator
	}
	req := &sarama.EndTxnRequest{Version: 1, TransactionalID: p.cfg.TransactionalID, ProducerID: p.pid, ProducerEpoch: p.epoch, TransactionResult: commit}
	_, err := retryCoordinator(ctx, p, "EndTxn", func(b *sarama.Broker) (*sarama.EndTxnResponse, sarama.KError, error) {
		r, err := b.EndTxn(req)
		if err != nil {
			return nil, 0, err
		}
		return r, r.Err, nil
	})
	if err != nil {
		if commit && !errors.Is(err, ErrFenced) && !errors.Is(err, ErrUnauthorized) {
			return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		}
		return err
	}
	p.mu.Lock()
	p.added, p.groups, p.broken = map[topicPartition]bool{}, map[string]bool{}, nil
	p.mu.Unlock()
	return nil
}

// breakTxn records that the open transaction cannot commit, and returns
// err.
func (p *Producer) breakTxn(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken == nil {
		p.broken = err
	}
	if errors.Is(err, ErrFenced) {
		p.fenced = true
	}
	return err
}

// kerr wraps a broker's error code in the package's error for it.
func (p *Producer) kerr(what string, k sarama.KError) error {
	switch k {
	case sarama.ErrProducerFenced, sarama.ErrInvalidProducerEpoch:
		return fmt.Errorf("%w: %s %s: %w", ErrFenced, what, p.cfg.TransactionalID, k)
	case sarama.ErrTransactionalIDAuthorizationFailed, sarama.ErrGroupAuthorizationFailed, sarama.ErrTopicAuthorizationFailed, sarama.ErrClusterAuthorizationFailed:
		return fmt.Errorf("%w: %s %s: %w", ErrUnauthorized, what, p.cfg.TransactionalID, k)
	}
	return fmt.Errorf("outbox/kafkatxn: %s %s: %w", what, p.cfg.TransactionalID, k)
}

// retriable reports whether a coordinator's answer k means "ask again"
// (after a new coordinator lookup for the coordinator errors).
func retriable(k sarama.KError) (retry, relookup bool) {
	switch k {
	case sarama.ErrNotCoordinatorForConsumer, sarama.ErrConsumerCoordinatorNotAvailable:
		return true, true
	case sarama.ErrConcurrentTransactions, sarama.ErrOffsetsLoadInProgress, sarama.ErrUnstableOffsetCommit, sarama.ErrRequestTimedOut:
		return true, false
	}
	return false, false
}

// retryCoordinator sends a request with f to the transaction coordinator
// of p's transactional.id until it answers without a retriable error.
func retryCoordinator[T any](ctx context.Context, p *Producer, what string, f func(*sarama.Broker) (T, sarama.KError, error)) (T, error) {
	id := p.cfg.TransactionalID
	return retry(ctx, p, what, func() (*sarama.Broker, error) { return p.cfg.Client.TransactionCoordinator(id) },
		func() error { return p.cfg.Client.RefreshTransactionCoordinator(id) }, f)
}

// retryGroup is retryCoordinator for group's coordinator.
func retryGroup[T any](ctx context.Context, p *Producer, group, what string, f func(*sarama.Broker) (T, sarama.KError, error)) (T, error) {
	return retry(ctx, p, what, func() (*sarama.Broker, error) { return p.cfg.Client.Coordinator(group) },
		func() error { return p.cfg.Client.RefreshCoordinator(group) }, f)
}

func retry[T any](ctx context.Context, p *Producer, what string, coordinator func() (*sarama.Broker, error), refresh func() error,
	f func(*sarama.Broker) (T, sarama.KError, error)) (T, error) {
	var zero T
	var last error
	for n := 1; ; n++ {
		type answer struct {
			v   T
			k   sarama.KError
			err error
		}
		a, err := call(ctx, func() (answer, error) {
			shared, err := coordinator()
			if err != nil {
				return answer{}, err
			}
			b := p.conn(shared)
			v, k, err := f(b)
			if err != nil {
				p.drop(b) // a broken connection: the next try dials again
			}
			return answer{v, k, err}, err
		})
		switch {
		case ctx.Err() != nil:
			if last != nil {
				return zero, fmt.Errorf("outbox/kafkatxn: %s %s: %w (last: %w)", what, p.cfg.TransactionalID, ctx.Err(), last)
			}
			return zero, fmt.Errorf("outbox/kafkatxn: %s %s: %w", what, p.cfg.TransactionalID, ctx.Err())
		case err != nil:
			last = err
			_ = refresh()
		case a.k == sarama.ErrNoError:
			return a.v, nil
		default:
			again, relookup := retriable(a.k)
			if !again {
				return zero, p.kerr(what, a.k)
			}
			last = a.k
			if relookup {
				_ = refresh()
			}
		}
		t := time.NewTimer(p.cfg.Backoff(n))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// call runs f and returns its result, or ctx's error if ctx ends first (f
// then finishes in the background: sarama's requests take no context, and
// end by its Net timeouts).
func call[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// ReadManifest returns the manifest last committed for group on
// partition 0 of topic, asking the group's coordinator with
// RequireStable (KIP-447), so that a transaction still completing is
// waited for (UNSTABLE_OFFSET_COMMIT is retried), never read half done.
// ok is false if none was ever committed. It wraps ErrManifest if the
// metadata is not a manifest. It opens a connection of its own for the
// one request; (*Producer).ReadManifest uses the producer's.
func ReadManifest(ctx context.Context, client sarama.Client, group, topic string, backoff func(int) time.Duration) (m Manifest, ok bool, err error) {
	if backoff == nil {
		backoff = defaultBackoff
	}
	p := &Producer{cfg: Config{Client: client, TransactionalID: group, Backoff: backoff}, sc: client.Config()}
	defer p.Close()
	return p.ReadManifest(ctx, group, topic)
}

// ReadManifest is the package's ReadManifest over p's connections.
func (p *Producer) ReadManifest(ctx context.Context, group, topic string) (m Manifest, ok bool, err error) {
	req := &sarama.OffsetFetchRequest{Version: 7, ConsumerGroup: group, RequireStable: true}
	req.AddPartition(topic, 0)
	blk, err := retryGroup(ctx, p, group, "OffsetFetch", func(b *sarama.Broker) (*sarama.OffsetFetchResponseBlock, sarama.KError, error) {
		r, err := b.FetchOffset(req)
		if err != nil {
			return nil, 0, err
		}
		if r.Err != sarama.ErrNoError {
			return nil, r.Err, nil
		}
		blk := r.GetBlock(topic, 0)
		if blk == nil {
			return nil, 0, fmt.Errorf("outbox/kafkatxn: OffsetFetch %s: no answer for %s/0", group, topic)
		}
		return blk, blk.Err, nil
	})
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		return Manifest{}, false, nil // no commit ever made the group
	}
	if err != nil {
		return Manifest{}, false, err
	}
	if blk.Offset < 0 {
		return Manifest{}, false, nil
	}
	m, err = DecodeManifest(blk.Metadata)
	if err != nil {
		return Manifest{}, false, fmt.Errorf("outbox/kafkatxn: the offset of group %s on %s/0: %w", group, topic, err)
	}
	return m, true, nil
}
