package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/failpoint"
	"github.com/sqloutbox/outbox/internal/kafkatxn"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// DefaultTransactionTimeout is ExactlyOnce.TransactionTimeout's default:
// Kafka's transaction.timeout.ms default (60 s, ProducerConfig).
const DefaultTransactionTimeout = 60 * time.Second

// eosMaxOpenRequests is Net.MaxOpenRequests in the exactly-once mode: up
// to this many requests of different relay partitions' transactions in
// flight on one broker connection (sarama's default, 5).
const eosMaxOpenRequests = 5

// abortTimeout bounds, past Publish's own deadline, the epoch bump that
// aborts a failed transaction or resolves an unanswered commit (and the
// manifest read that follows): if the broker does not answer by then, the
// messages fail with relay.ErrOutcomeUnknown and the relay reconciles the
// partition later.
const abortTimeout = 5 * time.Second

// StateTopicSuffix ends the name of the topic that carries the
// transactions' manifests: "<TransactionalIDPrefix><Table>" + this. It must
// exist, with at least one partition, before the relay starts: create it
// with CreateStateTopic or `outbox kafka state-topic create`. No record is
// ever written to it, only transactional offset commits for its partition
// 0. Reconcile checks that it exists before any transaction begins
// (ErrStateTopicMissing).
const StateTopicSuffix = ".outbox-txn"

// ErrStateTopicMissing is wrapped (with relay.ErrUnavailable) by
// Reconcile's error when the state topic (StateTopic) does not exist or has
// no partition: no transaction is begun, so nothing reaches the log (a
// transaction whose manifest commit failed would leave its records there
// as aborted ones, once per retry), and the relay's readiness names the
// topic to create until it exists. Create it with CreateStateTopic or
// `outbox kafka state-topic create`.
var ErrStateTopicMissing = errors.New("outbox/kafka: the exactly-once mode's state topic does not exist")

// ErrNotReconciled fails, with relay.ErrOutcomeUnknown (so that the relay
// reconciles the partition), the messages of a relay partition that
// Publish got before Reconcile made a transactional producer for it under
// their lease epoch, or after that producer was given up (fenced, or a
// transaction that could not be aborted). If every Publish fails with it,
// the relay does not see the Publisher as a relay.Reconciler: a wrapper
// around it must implement relay.PublisherWrapper.
var ErrNotReconciled = errors.New("outbox/kafka: relay partition not reconciled under this epoch (a Publisher wrapper without Unwrap hides the exactly-once mode from the relay: see relay.PublisherWrapper)")

// ExactlyOnce turns on the publisher's exactly-once mode (package
// documentation, "Exactly once").
type ExactlyOnce struct {
	// TransactionalIDPrefix starts the transactional.id of every relay
	// partition's producer and the consumer group that carries its
	// manifests: "<prefix><Table>.<partition>". Required, so that services
	// sharing a Kafka cluster and the default table name do not fence
	// each other. Give every relay of one table the same prefix.
	TransactionalIDPrefix string
	// Table is the outbox table the relay publishes (driver.Config.Table).
	// Default driver.DefaultTable.
	Table string
	// TransactionTimeout is transaction.timeout.ms. It must exceed the
	// relay's PublishTimeout (a publish is one transaction; the
	// coordinator aborts one left open longer) and at most the brokers'
	// transaction.max.timeout.ms (15 min by default). It also bounds how
	// long a crashed relay's open transaction holds back read_committed
	// consumers of its Kafka partitions (their last stable offset) if no
	// other relay takes its lease sooner: the next owner's Reconcile
	// aborts it at once, at most LeaseTTL after the crash. Default
	// DefaultTransactionTimeout.
	TransactionTimeout time.Duration
}

// TransactionalID returns the transactional.id (and manifest group) of
// relay partition p: prefix + table + "." + p.
func TransactionalID(prefix, table string, p int) string {
	return prefix + table + "." + strconv.Itoa(p)
}

// StateTopic returns the name of the topic whose offset commits carry the
// manifests of prefix and table's transactions.
func StateTopic(prefix, table string) string { return prefix + table + StateTopicSuffix }

// eos is the exactly-once mode's state.
type eos struct {
	cfg   ExactlyOnce
	state string // StateTopic

	mu      sync.Mutex
	owned   map[int]*txnOwner // relay partition -> its producer
	carry   map[int][]int64   // relay partition -> ids of the batch before, unconfirmed (Carry)
	stateOK bool              // the state topic was found (checkStateTopic)
}

// txnOwner is the transactional producer of one relay partition, made
// by Reconcile under one lease epoch.
type txnOwner struct {
	epoch int64
	prod  *kafkatxn.Producer
}

// newEOS validates c.
func newEOS(c ExactlyOnce) (*eos, error) {
	if c.TransactionalIDPrefix == "" {
		return nil, fmt.Errorf("%w: ExactlyOnce.TransactionalIDPrefix is required", ErrConfig)
	}
	if c.Table == "" {
		c.Table = driver.DefaultTable
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if c.TransactionTimeout < time.Second || c.TransactionTimeout > 15*time.Minute {
		return nil, fmt.Errorf("%w: ExactlyOnce.TransactionTimeout %v is outside 1 s to 15 min", ErrConfig, c.TransactionTimeout)
	}
	return &eos{cfg: c, state: StateTopic(c.TransactionalIDPrefix, c.Table), owned: map[int]*txnOwner{}}, nil
}

// Carry implements relay.Pipeliner: the next Publish's transaction of each
// relay partition records ids[partition] in its manifest beside its own
// rows (the batch before, whose mark-sent is not confirmed yet), so that
// the relay marks one batch sent while it publishes the next. Outside the
// exactly-once mode it does nothing.
func (p *Publisher) Carry(ids map[int][]int64) {
	if p.eos == nil {
		return
	}
	p.eos.mu.Lock()
	p.eos.carry = ids
	p.eos.mu.Unlock()
}

// Reconciles implements relay.Reconciler: true in the exactly-once mode.
func (p *Publisher) Reconciles() bool { return p.eos != nil }

// Scope implements relay.Reconciler: the state topic
// (StateTopic(TransactionalIDPrefix, Table)), empty outside the
// exactly-once mode. Relays of one table whose scopes differ refuse to
// run together (relay.ErrModeMismatch).
func (p *Publisher) Scope() string {
	if p.eos == nil {
		return ""
	}
	return p.eos.state
}

// Reconcile implements relay.Reconciler: it makes relay partition part's
// transactional producer under lease epoch epoch (InitProducerId: every
// earlier producer of the partition is fenced, and its open transaction
// completed), then returns the outbox ids of the partition's last
// committed transaction, from its manifest (nil if it never committed
// one). Errors wrap ErrConfig outside the exactly-once mode,
// relay.ErrUnavailable for a refused authorization or a missing state
// topic, and otherwise the broker's.
func (p *Publisher) Reconcile(ctx context.Context, part int, epoch int64) ([]int64, error) {
	e := p.eos
	if e == nil {
		return nil, fmt.Errorf("%w: Reconcile outside the exactly-once mode", ErrConfig)
	}
	if err := p.checkStateTopic(ctx); err != nil {
		return nil, err
	}
	id := TransactionalID(e.cfg.TransactionalIDPrefix, e.cfg.Table, part)
	e.mu.Lock()
	if old := e.owned[part]; old != nil {
		old.prod.Close() // fenced by what follows anyway
		delete(e.owned, part)
	}
	e.mu.Unlock()
	prod, err := kafkatxn.Init(ctx, kafkatxn.Config{Client: p.client, TransactionalID: id, Timeout: e.cfg.TransactionTimeout,
		Backoff: p.txnBackoff, Retriable: retriableProduce})
	if err != nil {
		return nil, txnErr(err)
	}
	m, ok, err := prod.ReadManifest(ctx, id, e.state)
	if err != nil {
		prod.Close()
		return nil, txnErr(err)
	}
	e.mu.Lock()
	if old := e.owned[part]; old != nil { // a concurrent Reconcile of the same partition
		old.prod.Close()
	}
	e.owned[part] = &txnOwner{epoch: epoch, prod: prod}
	e.mu.Unlock()
	if !ok {
		return nil, nil
	}
	return m.IDs, nil
}

// checkStateTopic returns nil once the state topic has been seen with a
// partition (one metadata request, which never creates the topic, until
// then), and otherwise an error wrapping relay.ErrUnavailable and
// ErrStateTopicMissing, or relay.ErrUnavailable and the broker's error.
func (p *Publisher) checkStateTopic(ctx context.Context) error {
	e := p.eos
	e.mu.Lock()
	ok := e.stateOK
	e.mu.Unlock()
	if ok {
		return nil
	}
	n, err := topicPartitions(ctx, p.client, e.state)
	if err != nil {
		return fmt.Errorf("%w: outbox/kafka: reading the metadata of the state topic %s: %w", relay.ErrUnavailable, e.state, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %w: %s (create it with 1 partition before the relay starts: outbox kafka state-topic create --broker <host:port> --kafka-transactional-id-prefix %s --table %s, or kafka-topics.sh --create --topic %s --partitions 1; see docs/kafka.md)",
			relay.ErrUnavailable, ErrStateTopicMissing, e.state, e.cfg.TransactionalIDPrefix, e.cfg.Table, e.state)
	}
	e.mu.Lock()
	e.stateOK = true
	e.mu.Unlock()
	return nil
}

// topicPartitions asks one broker of client for topic's metadata, without
// creating the topic (AllowAutoTopicCreation false, whatever the
// brokers' auto.create.topics.enable), and returns its partition count:
// 0 if the topic does not exist.
func topicPartitions(ctx context.Context, client sarama.Client, topic string) (int, error) {
	b := client.LeastLoadedBroker()
	if b == nil {
		return 0, sarama.ErrOutOfBrokers
	}
	if ok, _ := b.Connected(); !ok {
		if err := b.Open(client.Config()); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
			return 0, err
		}
	}
	req := sarama.NewMetadataRequest(client.Config().Version, []string{topic})
	req.AllowAutoTopicCreation = false
	type answer struct {
		resp *sarama.MetadataResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := b.GetMetadata(req)
		done <- answer{resp, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if a.err != nil {
		return 0, a.err
	}
	for _, t := range a.resp.Topics {
		if t.Name != topic {
			continue
		}
		switch {
		case errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition):
			return 0, nil
		case t.Err != sarama.ErrNoError:
			return 0, refusal(t.Err)
		}
		return len(t.Partitions), nil
	}
	return 0, nil
}

// CreateStateTopic creates the exactly-once mode's state topic of
// cfg.ExactlyOnce (StateTopic(TransactionalIDPrefix, Table)) on
// cfg.Brokers with one partition and the brokers' default replication
// factor (CreateTopics with replication factor -1: Kafka 2.4 or later,
// KIP-464), with cfg's client settings (cfg.Sarama: TLS, SASL, Version;
// default Version 2.5). It reports whether it created the topic: false,
// nil for a topic that exists already (left as it is). Errors wrap
// ErrConfig for a cfg without ExactlyOnce or brokers; otherwise the
// broker's error, wrapped (with relay.ErrUnavailable for a refused
// authorization), or ctx's.
func CreateStateTopic(ctx context.Context, cfg Config) (created bool, err error) {
	state, sc, err := stateTopicConfig(cfg)
	if err != nil {
		return false, err
	}
	type answer struct {
		created bool
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		adm, err := sarama.NewClusterAdmin(cfg.Brokers, sc)
		if err != nil {
			done <- answer{err: fmt.Errorf("outbox/kafka: connecting to %v: %w", cfg.Brokers, refusal(err))}
			return
		}
		defer adm.Close()
		err = adm.CreateTopic(state, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: -1}, false)
		switch {
		case err == nil:
			done <- answer{created: true}
		case errors.Is(err, sarama.ErrTopicAlreadyExists):
			done <- answer{}
		default:
			done <- answer{err: fmt.Errorf("outbox/kafka: creating the state topic %s: %w", state, refusal(err))}
		}
	}()
	select {
	case a := <-done:
		return a.created, a.err
	case <-ctx.Done():
		return false, fmt.Errorf("outbox/kafka: creating the state topic %s: %w", state, ctx.Err())
	}
}

// CheckStateTopic returns nil if the exactly-once mode's state topic of
// cfg.ExactlyOnce exists with at least one partition; an error wrapping
// ErrStateTopicMissing if it does not; errors wrapping ErrConfig as
// CreateStateTopic's; otherwise the broker's error, wrapped, or ctx's. It
// never creates the topic.
func CheckStateTopic(ctx context.Context, cfg Config) error {
	state, sc, err := stateTopicConfig(cfg)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		client, err := sarama.NewClient(cfg.Brokers, sc)
		if err != nil {
			done <- fmt.Errorf("outbox/kafka: connecting to %v: %w", cfg.Brokers, refusal(err))
			return
		}
		defer client.Close()
		n, err := topicPartitions(ctx, client, state)
		switch {
		case err != nil:
			done <- fmt.Errorf("outbox/kafka: reading the metadata of the state topic %s: %w", state, err)
		case n == 0:
			done <- fmt.Errorf("%w: %s", ErrStateTopicMissing, state)
		default:
			done <- nil
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("outbox/kafka: checking the state topic %s: %w", state, ctx.Err())
	}
}

// stateTopicConfig validates cfg for CreateStateTopic and CheckStateTopic
// and returns the state topic's name and the client configuration.
func stateTopicConfig(cfg Config) (string, *sarama.Config, error) {
	if cfg.ExactlyOnce == nil {
		return "", nil, fmt.Errorf("%w: the state topic needs Config.ExactlyOnce", ErrConfig)
	}
	e, err := newEOS(*cfg.ExactlyOnce)
	if err != nil {
		return "", nil, err
	}
	if len(cfg.Brokers) == 0 {
		return "", nil, fmt.Errorf("%w: no brokers", ErrConfig)
	}
	sc := sarama.NewConfig()
	if cfg.Sarama != nil {
		c := *cfg.Sarama
		sc = &c
	} else {
		sc.Version = sarama.V2_5_0_0
	}
	sc.Metadata.AllowAutoTopicCreation = false
	return e.state, sc, nil
}

// txnBackoff is the wait before the n-th retry of a transaction request:
// the publisher's resend backoff.
func (p *Publisher) txnBackoff(n int) time.Duration {
	return p.sc.Producer.Retry.BackoffFunc(n, p.sc.Producer.Retry.Max)
}

// retriableProduce reports whether a produce error leaves the record
// batch to be sent again unchanged (classify.go: resend).
func retriableProduce(err error) bool {
	return !errors.Is(err, kafkatxn.ErrFenced) && classifyRequestError(err) == resend
}

// txnErr marks an error of the transaction protocol that no retry fixes
// (authorization, an unknown state topic) as relay.ErrUnavailable.
func txnErr(err error) error {
	var k sarama.KError
	if errors.Is(err, kafkatxn.ErrUnauthorized) || errors.As(err, &k) && classifyKError(k) == unavailable {
		return fmt.Errorf("%w: %w", relay.ErrUnavailable, err)
	}
	return err
}

// publishTxn is Publish in the exactly-once mode: one transaction per
// relay partition of msgs, run at the same time; see the package
// documentation for each outcome.
func (p *Publisher) publishTxn(ctx context.Context, msgs []relay.Message) error {
	errs := make(relay.PublishErrors, len(msgs))
	byPart := map[int][]int{}
	var parts []int
	for i := range msgs {
		rp := msgs[i].Partition
		if _, ok := byPart[rp]; !ok {
			parts = append(parts, rp)
		}
		byPart[rp] = append(byPart[rp], i)
	}
	var wg sync.WaitGroup
	for _, rp := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.txn(ctx, rp, msgs, byPart[rp], errs)
		}()
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if failed == 0 {
		return nil
	}
	return errs
}

// txn publishes msgs[idx] (one relay partition's share, in batch order)
// as one transaction and writes each message's outcome to errs[idx[k]].
func (p *Publisher) txn(ctx context.Context, rp int, msgs []relay.Message, idx []int, errs relay.PublishErrors) {
	e := p.eos
	epoch := msgs[idx[0]].Epoch
	e.mu.Lock()
	o := e.owned[rp]
	carry := e.carry[rp]
	e.mu.Unlock()
	failAll := func(err error) {
		for _, i := range idx {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	if o == nil || o.epoch != epoch {
		failAll(fmt.Errorf("%w: %w: relay partition %d, epoch %d", relay.ErrOutcomeUnknown, ErrNotReconciled, rp, epoch))
		return
	}
	// The manifest lists the share's rows and the carried ones (the batch
	// before, not yet confirmed marked: relay.Pipeliner), ascending. It
	// must fit in one offset commit's metadata: a share too long for it is
	// cut, and the rest goes in the next cycle's transaction (ErrAborted:
	// no attempt, no hold). Cutting a prefix keeps every aggregate's
	// order.
	own := make([]int64, len(idx))
	for k, i := range idx {
		own[k] = msgs[i].ID
	}
	n := fitShare(epoch, carry, own)
	if n < len(idx) {
		for _, i := range idx[n:] {
			errs[i] = fmt.Errorf("%w (outbox/kafka: its relay partition's share of the batch is longer than one transaction's manifest holds)", relay.ErrAborted)
		}
		idx, own = idx[:n], own[:n]
	}
	if len(idx) == 0 {
		return
	}
	ids := manifestIDs(carry, own)
	// The manifest goes to the group coordinator while the records go to
	// the partitions' leaders: the transaction commits both or neither,
	// so they need no order between them, and the batch costs three
	// round trips in a row (add, write, end), not five.
	manifest := make(chan error, 1)
	go func() {
		err := o.prod.CommitManifest(ctx, TransactionalID(e.cfg.TransactionalIDPrefix, e.cfg.Table, rp), e.state, kafkatxn.Manifest{Epoch: epoch, IDs: ids})
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			err = fmt.Errorf("%w (the manifests' topic %s must exist, with 1 partition: create it, for example with kafka-topics.sh --create --topic %s --partitions 1)", err, e.state, e.state)
		}
		manifest <- txnErr(err)
	}()
	failedAt, ferr := p.produceTxn(ctx, o.prod, msgs, idx)
	merr := <-manifest
	if failedAt < 0 && ferr == nil {
		ferr = merr
		if ferr == nil {
			failpoint.Inject(failpoint.BeforeCommit)
			ferr = o.prod.End(ctx, true)
			if ferr == nil {
				return // committed: every entry stays nil
			}
			if errors.Is(ferr, kafkatxn.ErrOutcomeUnknown) {
				p.resolveCommit(ctx, rp, o, ids, idx, errs, ferr)
				return
			}
		}
	}
	// Not committed. The transaction is aborted by bumping the epoch. If
	// the producer was fenced (another owner, or the coordinator after
	// TransactionTimeout), ctx ended, or the abort failed, the partition
	// is left to Reconcile: ErrOutcomeUnknown makes the relay call it
	// before it claims from the partition again.
	var abortErr error
	switch {
	case errors.Is(ferr, kafkatxn.ErrFenced):
		abortErr = ferr
	case ctx.Err() != nil:
		abortErr = ctx.Err()
	default:
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
		abortErr = o.prod.Reset(rctx)
		cancel()
	}
	if abortErr != nil {
		p.forget(rp, o)
		if errors.Is(abortErr, kafkatxn.ErrFenced) {
			failAll(fmt.Errorf("%w: %w: outbox/kafka: relay partition %d: %w", relay.ErrOutcomeUnknown, relay.ErrFenced, rp, abortErr))
			return
		}
		failAll(fmt.Errorf("%w: outbox/kafka: relay partition %d: the transaction failed (%w) and is reconciled before the next one (%w)",
			relay.ErrOutcomeUnknown, rp, ferr, abortErr))
		return
	}
	if failedAt < 0 {
		// Its manifest or commit failed: no message's fault.
		if errors.Is(ferr, relay.ErrUnavailable) {
			failAll(ferr)
		} else {
			failAll(fmt.Errorf("outbox/kafka: relay partition %d: %w", rp, &relay.BatchError{Err: ferr}))
		}
		return
	}
	// One message failed: it carries the error, its aggregate's later
	// messages are held back, the others were aborted with it.
	fm := &msgs[idx[failedAt]]
	errs[idx[failedAt]] = ferr
	for _, i := range idx[failedAt+1:] {
		if m := &msgs[i]; m.AggregateType == fm.AggregateType && m.AggregateID == fm.AggregateID {
			errs[i] = fmt.Errorf("%w (aggregate %s/%s: an earlier message of the batch failed)", relay.ErrHeldBack, m.AggregateType, m.AggregateID)
		}
	}
	failAll(fmt.Errorf("%w: outbox/kafka: relay partition %d: message %s failed: %w", relay.ErrAborted, rp, fm.MessageID, ferr))
}

// manifestIDs is the union of carry and own, ascending, without repeats.
func manifestIDs(carry, own []int64) []int64 {
	ids := make([]int64, 0, len(carry)+len(own))
	ids = append(ids, carry...)
	ids = append(ids, own...)
	slices.Sort(ids)
	return slices.Compact(ids)
}

// fitShare returns how many of own, from the first, fit in one manifest
// with epoch beside carry (kafkatxn.Fits of their union). The carried ids
// fit by themselves (they fitted in the manifest of their own batch,
// with no carry of their own at most as large), so with none of own it
// is 0 at worst.
func fitShare(epoch int64, carry, own []int64) int {
	if len(carry) == 0 {
		return kafkatxn.Fits(epoch, own)
	}
	if ids := manifestIDs(carry, own); kafkatxn.Fits(epoch, ids) == len(ids) {
		return len(own)
	}
	lo, hi := 0, len(own) // own[:lo] fits, own[:hi+1] does not
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if ids := manifestIDs(carry, own[:mid]); kafkatxn.Fits(epoch, ids) == len(ids) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// resolveCommit learns the outcome of a commit that went unanswered: it
// bumps the epoch (which completes the transaction either way) and reads
// the manifest back. If it lists ids, the transaction committed.
func (p *Publisher) resolveCommit(ctx context.Context, rp int, o *txnOwner, ids []int64, idx []int, errs relay.PublishErrors, cause error) {
	e := p.eos
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	err := o.prod.Reset(rctx)
	var m kafkatxn.Manifest
	var ok bool
	if err == nil {
		m, ok, err = o.prod.ReadManifest(rctx, TransactionalID(e.cfg.TransactionalIDPrefix, e.cfg.Table, rp), e.state)
	}
	switch {
	case err != nil:
		p.forget(rp, o)
		e := fmt.Errorf("%w: outbox/kafka: relay partition %d: %w (resolving it: %w)", relay.ErrOutcomeUnknown, rp, cause, err)
		if errors.Is(err, kafkatxn.ErrFenced) {
			e = fmt.Errorf("%w: %w", relay.ErrFenced, e)
		}
		for _, i := range idx {
			errs[i] = e
		}
	case ok && m.Epoch == o.epoch && slices.Equal(m.IDs, ids):
		// committed: every entry stays nil
	default:
		for _, i := range idx {
			errs[i] = fmt.Errorf("%w: outbox/kafka: relay partition %d: the unanswered commit did not commit: %w", relay.ErrAborted, rp, cause)
		}
	}
}

// forget drops relay partition rp's producer, if it is still o, so that
// the partition is reconciled before its next transaction.
func (p *Publisher) forget(rp int, o *txnOwner) {
	e := p.eos
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.owned[rp] == o {
		delete(e.owned, rp)
	}
	o.prod.Close()
}

// closeEOS closes every relay partition's producer (Publisher.Close).
func (p *Publisher) closeEOS() {
	e := p.eos
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for rp, o := range e.owned {
		o.prod.Close()
		delete(e.owned, rp)
	}
}

// maxTxnRequestBytes caps the records of one produce request that
// produceTxn builds from several partitions' record batches (one record
// batch per partition per request): well under the brokers' default
// socket.request.max.bytes (100 MiB) and sarama's MaxRequestSize (100
// MiB). A single record batch larger than it (Producer.MaxMessageBytes
// above it) still goes alone.
const maxTxnRequestBytes = 16 << 20

// produceTxn writes msgs[idx] in the open transaction of prod: each Kafka
// partition's records in batch order, as few record batches as
// Producer.MaxMessageBytes allows, one after another. The partitions'
// record batches go together, one produce request per leader
// (kafkatxn.Producer.ProduceBatches) for each partition's first record
// batch, then one for each partition's second, and so on, unless an
// aggregate of the share has records on several partitions (its events
// name different topics): then one partition after another, in the order
// of their first records. It returns the position in idx of
// the first message whose record batch failed and the error (-1, nil if
// every record was written); for a failure before anything was routed (an
// unknown topic), the first message of that topic; -1 and the error if
// the partitions could not be added to the transaction (no message's
// fault).
func (p *Publisher) produceTxn(ctx context.Context, prod *kafkatxn.Producer, msgs []relay.Message, idx []int) (int, error) {
	type share struct {
		tp  topicPartition
		pos []int // positions in idx
	}
	var shares []*share
	byTP := map[topicPartition]*share{}
	aggTP := map[[2]string]topicPartition{}
	spread := false
	counts := map[string]int32{} // each topic's partition count, asked once per share
	for k, i := range idx {
		m := &msgs[i]
		topic := m.Topic
		if topic == "" {
			topic = p.route(*m)
		}
		n, ok := counts[topic]
		if !ok {
			var err error
			if n, err = p.partitionCount(ctx, topic); err != nil {
				if classifyRequestError(err) == unavailable {
					err = fmt.Errorf("%w: outbox/kafka: topic %s: %w", relay.ErrUnavailable, topic, err)
				}
				return k, err
			}
			counts[topic] = n
		}
		tp := topicPartition{topic, partition.KafkaPartition([]byte(m.AggregateID), n)}
		key := [2]string{m.AggregateType, m.AggregateID}
		if prev, ok := aggTP[key]; ok && prev != tp {
			spread = true
		}
		aggTP[key] = tp
		s := byTP[tp]
		if s == nil {
			s = &share{tp: tp}
			byTP[tp] = s
			shares = append(shares, s)
		}
		s.pos = append(s.pos, k)
	}
	// All of the transaction's partitions in one request, before any
	// record: one round trip, not one per partition.
	add := map[string][]int32{}
	for _, s := range shares {
		add[s.tp.topic] = append(add[s.tp.topic], s.tp.part)
	}
	if err := prod.AddPartitions(ctx, add); err != nil {
		return -1, classifyTxnProduce(err) // the transaction's, no message's
	}
	// Each share's records, cut into record batches of at most
	// Producer.MaxMessageBytes, in order.
	type chunk struct {
		start   int // position in s.pos of its first message
		records []*sarama.Record
		bytes   int
	}
	// A record too large for any record batch fails its message
	// (ErrPermanent) before anything is written: the earliest such message
	// of the whole share, whichever partition it is on.
	chunks := make([][]chunk, len(shares))
	tooLarge, tooLargeSize := -1, 0
	for j, s := range shares {
		var c chunk
		for k, pos := range s.pos {
			rec, size := p.encode(&msgs[idx[pos]])
			if size > p.sc.Producer.MaxMessageBytes {
				if tooLarge < 0 || pos < tooLarge {
					tooLarge, tooLargeSize = pos, size
				}
				break // this share is not written
			}
			if len(c.records) > 0 && c.bytes+size >= p.sc.Producer.MaxMessageBytes {
				chunks[j] = append(chunks[j], c)
				c = chunk{}
			}
			if len(c.records) == 0 {
				c = chunk{start: k, bytes: batchOverhead}
			}
			c.records = append(c.records, rec)
			c.bytes += size
		}
		chunks[j] = append(chunks[j], c)
	}
	if tooLarge >= 0 {
		return tooLarge, fmt.Errorf("%w: outbox/kafka: message %s: a record of %d bytes is larger than Producer.MaxMessageBytes (%d)",
			relay.ErrPermanent, msgs[idx[tooLarge]].MessageID, tooLargeSize, p.sc.Producer.MaxMessageBytes)
	}
	// send writes the given shares' chunks in rounds: round r writes the
	// r-th chunk of every share, all in one ProduceBatches (one produce
	// request per leader), up to maxTxnRequestBytes of records per call.
	// A round with a failure is the last: the transaction cannot commit,
	// so what is left would only reach the log as aborted records. It
	// returns the position in idx of the earliest message whose record
	// batch failed, and the error (-1, nil if every record was written).
	send := func(js []int) (int, error) {
		first, ferr := -1, error(nil)
		for r := 0; first < 0; r++ {
			var round []int // shares with a chunk r still to write
			for _, j := range js {
				if r < len(chunks[j]) {
					round = append(round, j)
				}
			}
			if len(round) == 0 {
				break
			}
			for len(round) > 0 {
				var call []int
				var batches []kafkatxn.Batch
				bytes := 0
				for len(round) > 0 && (len(call) == 0 || bytes+chunks[round[0]][r].bytes <= maxTxnRequestBytes) {
					j := round[0]
					round = round[1:]
					call = append(call, j)
					batches = append(batches, kafkatxn.Batch{Topic: shares[j].tp.topic, Partition: shares[j].tp.part, Records: chunks[j][r].records})
					bytes += chunks[j][r].bytes
				}
				for n, w := range prod.ProduceBatches(ctx, batches) {
					j := call[n]
					if w.Err == nil {
						p.hc.saw(shares[j].tp.topic)
						continue
					}
					if k := shares[j].pos[chunks[j][r].start]; first < 0 || k < first {
						first, ferr = k, classifyTxnProduce(w.Err)
					}
				}
			}
		}
		return first, ferr
	}
	if spread {
		// One partition after another: an aggregate's records on several
		// partitions go in its batch order.
		for j := range shares {
			if k, err := send([]int{j}); err != nil {
				return k, err
			}
		}
		return -1, nil
	}
	all := make([]int, len(shares))
	for j := range all {
		all[j] = j
	}
	return send(all)
}

// classifyTxnProduce wraps a failed transactional produce the way the
// default mode classifies a refused record batch: relay.ErrUnavailable
// for a refused route, relay.ErrPermanent for an invalid record; a fenced
// producer stays kafkatxn.ErrFenced; anything else counts an attempt.
func classifyTxnProduce(err error) error {
	if errors.Is(err, kafkatxn.ErrFenced) {
		return err
	}
	switch classifyRequestError(err) {
	case unavailable:
		return fmt.Errorf("%w: %w", relay.ErrUnavailable, err)
	case permanent, tooLarge:
		return fmt.Errorf("%w: %w", relay.ErrPermanent, err)
	}
	return err
}
