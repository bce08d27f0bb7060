package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/internal/failpoint"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// This file is the produce path: one Publish call is a run; a run splits
// its batch into streams, one per topic-partition; a stream sends its
// records as record batches, one after another, each only after the one
// before was acknowledged; senders, one per broker connection, put the
// batches that streams hand them at the same time into one Produce
// request. The package documentation says why it is built this way.

// Sizes of the record framing, as sarama counts them (produce_set.go,
// record.go): a record batch header and the worst case of one record's
// varint framing, and of one header's.
const (
	batchOverhead  = 49                                                  // record batch header (v2)
	recordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1 // 36
	headerOverhead = 2 * binary.MaxVarintLen32                           // 10
	// requestSlack is kept free below sarama.MaxRequestSize in one
	// request, as sarama does (produce_set.go: 10 KiB "for safety").
	requestSlack = 10 << 10
)

// maxProducerResets bounds how often one record batch is re-sent under a
// fresh producer ID in one Publish call after the broker refused its
// producer state; then its records fail (and count an attempt), so that a
// broker that keeps refusing cannot hold a batch in a loop.
const maxProducerResets = 3

// topicPartition names one Kafka partition.
type topicPartition struct {
	topic string
	part  int32
}

// partState is the idempotent producer state of one partition: the
// producer ID and epoch its batches carry and the sequence of the next
// batch. gen is the generation of the producer ID (producerIDs); a
// partition whose batch ended in an unknown or refused state needs a
// producer ID of a later generation (minGen) before it sends again, and
// starts its sequence at 0 under it.
type partState struct {
	pid    int64
	epoch  int16
	gen    uint64
	seq    int32
	minGen uint64 // the next batch needs ident.gen >= minGen; 0: none yet
	valid  bool
}

// producerIdent is a producer ID from InitProducerId, numbered by gen.
type producerIdent struct {
	pid   int64
	epoch int16
	gen   uint64
}

// idCall is one InitProducerId request in flight; waiters share it.
type idCall struct {
	done chan struct{}
	err  error
}

// nextSeq adds n to a sequence number; Kafka's sequences wrap to 0 after
// math.MaxInt32 (DefaultRecordBatch.incrementSequence).
func nextSeq(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (1 << 31))
}

// rec is one message of a run, encoded.
type rec struct {
	tp     topicPartition
	record *sarama.Record
	size   int // sarama's ByteSize of the record (v2)
	agg    int // the run's number of its aggregate
	prev   int // the previous message of its aggregate in the batch, -1 if none
	stream int // index of its stream, -1 once failed before streaming
}

// record states in a run.
const (
	statePending uint8 = iota
	stateAcked
	stateResolved // failed, held back or not sent: errs holds why
)

// run is one Publish call.
type run struct {
	p    *Publisher
	msgs []relay.Message
	recs []rec
	ts   time.Time // the records' timestamp

	mu        sync.Mutex
	state     []uint8
	errs      []error
	failedAt  []int         // by aggregate: the first failed message, -1 if none; later ones are held back
	progress  chan struct{} // closed (and replaced) by wakeLocked after records were resolved
	moved     bool          // a record was resolved since progress was last closed
	done      int           // records in answered requests, for failpoint.MidBatch
	midBatch  bool
	firstLeft int // streams that have not yet handed over their first batch
}

// stream is the share of a run's batch on one partition, in batch order.
type stream struct {
	tp        topicPartition
	idx       []int // message indices
	pos       int   // idx[:pos] are resolved
	single    bool  // one record per batch (after the broker refused one as too large)
	firstDone bool  // the stream handed its first batch over, or will not soon (guarded by run.mu)
}

// chunk is the records of one record batch: a run of a stream's records.
type chunk struct {
	idx    []int
	next   int // the stream's pos once the chunk is resolved
	bytes  int
	batch  *sarama.RecordBatch
	pid    int64
	epoch  int16
	seq    int32
	resets int
}

// newRun encodes msgs. Records larger than the producer allows fail
// permanently here, without a round trip, as sarama's own check did.
func (p *Publisher) newRun(msgs []relay.Message) *run {
	r := &run{p: p, msgs: msgs, recs: make([]rec, len(msgs)), ts: time.Now().Truncate(time.Millisecond),
		state: make([]uint8, len(msgs)), errs: make([]error, len(msgs)), progress: make(chan struct{})}
	type aggKey struct{ typ, id string }
	aggs := map[aggKey]int{}
	last := []int{}
	for i := range msgs {
		m := &msgs[i]
		k := aggKey{m.AggregateType, m.AggregateID}
		a, ok := aggs[k]
		if !ok {
			a = len(last)
			aggs[k] = a
			last = append(last, -1)
		}
		topic := m.Topic
		if topic == "" {
			topic = p.route(*m)
		}
		record, size := p.encode(m)
		r.recs[i] = rec{tp: topicPartition{topic: topic}, record: record, size: size, agg: a, prev: last[a], stream: -1}
		last[a] = i
	}
	r.failedAt = make([]int, len(last))
	for a := range r.failedAt {
		r.failedAt[a] = -1
	}
	for i := range r.recs {
		switch size := r.recs[i].size; {
		case r.heldLocked(i):
			r.resolveLocked(i, r.heldBack(i))
		case size > p.sc.Producer.MaxMessageBytes:
			r.resolveLocked(i, fmt.Errorf("%w: outbox/kafka: message %s: a record of %d bytes is larger than Producer.MaxMessageBytes (%d)",
				relay.ErrPermanent, msgs[i].MessageID, size, p.sc.Producer.MaxMessageBytes))
		}
	}
	return r
}

// encode builds m's record: key the aggregate ID, value the payload, then
// the relay's headers and the event's own, sorted by name.
func (p *Publisher) encode(m *relay.Message) (*sarama.Record, int) {
	hs := p.headers(m)
	value := m.Payload
	if value == nil {
		value = []byte{} // an empty event, not a null value (a tombstone)
	}
	rec := &sarama.Record{Key: []byte(m.AggregateID), Value: value, Headers: make([]*sarama.RecordHeader, len(hs))}
	size := recordOverhead + len(rec.Key) + len(rec.Value)
	for i := range hs {
		rec.Headers[i] = &hs[i]
		size += len(hs[i].Key) + len(hs[i].Value) + headerOverhead
	}
	return rec, size
}

// resolveLocked records the outcome of message i (nil: acknowledged) and
// wakes streams waiting for it. A failure marks its aggregate dead, so
// its later messages in the run are held back. r.mu must be held.
func (r *run) resolveLocked(i int, err error) {
	if r.state[i] != statePending {
		return
	}
	if err == nil {
		r.state[i] = stateAcked
	} else {
		r.state[i] = stateResolved
		r.errs[i] = err
		if a := r.recs[i].agg; r.failedAt[a] < 0 || i < r.failedAt[a] {
			r.failedAt[a] = i
		}
	}
	r.moved = true
}

// wakeLocked wakes the streams waiting for progress, if any record was
// resolved since the last call. r.mu must be held.
func (r *run) wakeLocked() {
	if r.moved {
		r.moved = false
		close(r.progress)
		r.progress = make(chan struct{})
	}
}

// heldLocked reports whether an earlier message of i's aggregate failed
// in the run. r.mu must be held.
func (r *run) heldLocked(i int) bool {
	f := r.failedAt[r.recs[i].agg]
	return f >= 0 && f < i
}

// heldBack is the error of message i, not sent because an earlier message
// of its aggregate in the batch failed.
func (r *run) heldBack(i int) error {
	m := &r.msgs[i]
	return fmt.Errorf("%w (aggregate %s/%s: an earlier message of the batch failed)", relay.ErrHeldBack, m.AggregateType, m.AggregateID)
}

// route resolves each message's partition from its topic's partition
// count (the Java client's murmur2 over the aggregate ID) and groups the
// messages into streams. A topic whose metadata names no partitions fails
// its messages with relay.ErrUnavailable. It returns ctx's error (or
// ErrClosed) if the metadata did not arrive in time: nothing was sent.
func (r *run) route(ctx context.Context) ([]*stream, error) {
	counts := map[string]int32{}
	var streams []*stream
	byTP := map[topicPartition]int{}
	for i := range r.recs {
		rc := &r.recs[i]
		n, ok := counts[rc.tp.topic]
		if !ok {
			var err error
			n, err = r.p.partitionCount(ctx, rc.tp.topic)
			switch {
			case err == nil:
			case ctx.Err() != nil || errors.Is(err, ErrClosed) || classifyRequestError(err) != unavailable:
				return nil, err // nothing sent yet: the batch fails as a whole
			default: // an unknown or refused topic
				n = -1
				r.failTopic(rc.tp.topic, err)
			}
			counts[rc.tp.topic] = n
		}
		if n < 0 {
			continue
		}
		rc.tp.part = partition.KafkaPartition(rc.record.Key, n)
		si, ok := byTP[rc.tp]
		if !ok {
			si = len(streams)
			byTP[rc.tp] = si
			streams = append(streams, &stream{tp: rc.tp})
		}
		rc.stream = si
		streams[si].idx = append(streams[si].idx, i)
	}
	return streams, nil
}

// failTopic fails every message routed to topic with err (an
// unreachable or refused route: relay.ErrUnavailable).
func (r *run) failTopic(topic string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.wakeLocked()
	for i := range r.recs {
		if r.recs[i].tp.topic == topic {
			hint := TopicHint(topic, err)
			if hint == "" {
				hint = ": topic " + topic
			}
			r.resolveLocked(i, fmt.Errorf("%w: outbox/kafka%s: %w", relay.ErrUnavailable, hint, err))
		}
	}
}

// stream sends s's records in order until all are resolved or ctx ends
// (then the rest fail as not sent or unresolved, wrapping a
// *relay.BatchError).
func (r *run) stream(ctx context.Context, si int, s *stream) {
	defer r.first(s)
	for {
		c, wait, done := r.nextChunk(si, s)
		if done {
			return
		}
		if c == nil {
			r.first(s)
			select { // an earlier message of an aggregate is in flight in another stream
			case <-wait:
				continue
			case <-ctx.Done():
				r.abandon(s, nil, false, ctx.Err())
				return
			}
		}
		if !r.send(ctx, s, c) {
			return
		}
	}
}

// first records that s handed its first record batch to a sender, or has
// to wait for something else first; once every stream of the run did,
// the senders start (see Publisher.plug), so that the first batches of
// all partitions of a broker travel in one request.
func (r *run) first(s *stream) {
	r.mu.Lock()
	if s.firstDone {
		r.mu.Unlock()
		return
	}
	s.firstDone = true
	r.firstLeft--
	last := r.firstLeft == 0
	r.mu.Unlock()
	if last {
		r.p.unplug()
	}
}

// nextChunk returns the next record batch of s: its next records that
// may go now, up to sarama's Producer.MaxMessageBytes. A record may go
// once the previous message of its aggregate in the batch is acknowledged
// or is before it in the same stream; a record whose aggregate failed
// earlier in the batch is held back (resolved here). If no record may go
// yet it returns a channel that is closed at the run's next progress; done
// once every record of s is resolved.
func (r *run) nextChunk(si int, s *stream) (c *chunk, wait <-chan struct{}, done bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.wakeLocked() // records held back here
	for s.pos < len(s.idx) && r.state[s.idx[s.pos]] != statePending {
		s.pos++
	}
	if s.pos == len(s.idx) {
		return nil, nil, true
	}
	c = &chunk{bytes: batchOverhead}
	j := s.pos
	for ; j < len(s.idx); j++ {
		i := s.idx[j]
		if r.state[i] != statePending {
			continue
		}
		rc := &r.recs[i]
		if r.heldLocked(i) {
			r.resolveLocked(i, r.heldBack(i))
			continue
		}
		if p := rc.prev; p >= 0 && r.recs[p].stream != si && r.state[p] != stateAcked {
			break // the aggregate's previous message is elsewhere, not yet acknowledged
		}
		if len(c.idx) > 0 && (s.single || c.bytes+rc.size >= r.p.sc.Producer.MaxMessageBytes) {
			break
		}
		c.idx = append(c.idx, i)
		c.bytes += rc.size
	}
	c.next = j
	if len(c.idx) == 0 {
		if j == len(s.idx) {
			return nil, nil, true
		}
		return nil, r.progress, false
	}
	return c, nil, false
}

// send sends c until its records are resolved. It returns false if the
// stream must stop: ctx ended or the publisher is closing (the stream's
// unresolved records are then failed as not sent or unresolved).
func (r *run) send(ctx context.Context, s *stream, c *chunk) bool {
	p := r.p
	var attempt int
	retry := func() bool {
		r.first(s)
		attempt++
		if err := p.backoff(ctx, attempt); err != nil {
			r.abandon(s, c, false, err)
			return false
		}
		return true
	}
	for {
		if p.isClosed() {
			r.abandon(s, c, false, ErrClosed)
			return false
		}
		if err := p.prepare(ctx, s.tp, c, r); err != nil {
			switch {
			case ctx.Err() != nil || errors.Is(err, ErrClosed):
				r.abandon(s, c, false, err)
				return false
			case errors.Is(err, relay.ErrUnavailable):
				r.fail(s, c, err)
				return true
			}
			if !retry() {
				return false
			}
			continue
		}
		leader, err := p.leader(ctx, s.tp)
		if err != nil {
			switch {
			case ctx.Err() != nil || errors.Is(err, ErrClosed):
				r.abandon(s, c, false, err)
				return false
			case classifyRequestError(err) == unavailable:
				r.fail(s, c, fmt.Errorf("%w: outbox/kafka: topic %s partition %d: %w", relay.ErrUnavailable, s.tp.topic, s.tp.part, err))
				return true
			}
			if !retry() {
				return false
			}
			continue
		}
		res, sent := p.produce(ctx, leader, &pending{tp: s.tp, batch: c.batch, bytes: c.bytes, run: r, n: len(c.idx)}, func() { r.first(s) })
		if !sent { // ctx ended first
			r.abandon(s, c, res.taken, ctx.Err())
			return false
		}
		var kerr error = res.kerr
		class := classifyKError(res.kerr)
		if res.err != nil {
			kerr = res.err
			class = classifyRequestError(res.err)
		}
		where := func(e error) error {
			return fmt.Errorf("outbox/kafka: topic %s partition %d: %w", s.tp.topic, s.tp.part, e)
		}
		switch class {
		case appended:
			p.acked(s.tp, c)
			r.resolveChunk(s, c, nil)
			return true
		case resend:
			p.refresh(s.tp.topic)
			if !retry() {
				return false
			}
		case producerState:
			p.invalidate(s.tp)
			if c.resets++; c.resets > maxProducerResets {
				r.fail(s, c, where(kerr))
				return true
			}
		case tooLarge:
			if len(c.idx) > 1 {
				s.single = true // one record per batch finds the one too large
				return true
			}
			r.fail(s, c, fmt.Errorf("%w: %w", relay.ErrPermanent, where(kerr)))
			return true
		case unavailable:
			p.invalidate(s.tp)
			r.fail(s, c, fmt.Errorf("%w%s: %w", relay.ErrUnavailable, TopicHint(s.tp.topic, kerr), where(kerr)))
			return true
		case permanent:
			p.invalidate(s.tp)
			r.fail(s, c, fmt.Errorf("%w: %w", relay.ErrPermanent, where(kerr)))
			return true
		default:
			p.invalidate(s.tp)
			r.fail(s, c, where(kerr))
			return true
		}
	}
}

// resolveChunk records err (nil: acknowledged) for every record of c and
// moves s past it.
func (r *run) resolveChunk(s *stream, c *chunk, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.wakeLocked()
	for _, i := range c.idx {
		r.resolveLocked(i, err)
	}
	s.pos = c.next
}

// fail resolves c's records with err; their aggregates are held back for
// the rest of the run.
func (r *run) fail(s *stream, c *chunk, err error) { r.resolveChunk(s, c, err) }

// abandon resolves every record of s not yet resolved as not sent (c nil
// or not taken into a request) or unresolved (taken: the broker may have
// written it), wrapping a *relay.BatchError with cause: the relay counts
// no attempt and re-sends them later. An unresolved batch leaves the
// partition's producer state unknown, so its next batch takes a fresh
// producer ID.
func (r *run) abandon(s *stream, c *chunk, taken bool, cause error) {
	if taken {
		r.p.invalidate(s.tp)
	}
	inChunk := map[int]bool{}
	if c != nil && taken {
		for _, i := range c.idx {
			inChunk[i] = true
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.wakeLocked()
	for _, i := range s.idx {
		what := "not sent"
		if inChunk[i] {
			what = "sent, outcome unknown"
		}
		r.resolveLocked(i, &relay.BatchError{Err: fmt.Errorf("outbox/kafka: topic %s partition %d: %s: %w", s.tp.topic, s.tp.part, what, cause)})
	}
	s.pos = len(s.idx)
}

// answered counts n records whose request was answered, and fires
// failpoint.MidBatch once half of the run's records are.
func (r *run) answered(n int) {
	r.mu.Lock()
	r.done += n
	fire := !r.midBatch && r.done*2 >= len(r.recs)
	if fire {
		r.midBatch = true
	}
	r.mu.Unlock()
	if fire {
		failpoint.Inject(failpoint.MidBatch)
	}
}

// result is Publish's return value once every stream returned (see
// Publish).
func (r *run) result(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	nAcked, perMessage := 0, false
	var firstUnavailable, firstBatch error
	for i, e := range r.errs {
		if r.state[i] == stateAcked {
			nAcked++
			continue
		}
		var be *relay.BatchError
		switch {
		case e == nil: // cannot happen: every stream resolves its records
			e = &relay.BatchError{Err: errors.New("outbox/kafka: message not resolved")}
			r.errs[i] = e
			if firstBatch == nil {
				firstBatch = e
			}
		case errors.As(e, &be):
			if firstBatch == nil {
				firstBatch = e
			}
		case errors.Is(e, relay.ErrUnavailable):
			if firstUnavailable == nil {
				firstUnavailable = e
			}
		case errors.Is(e, relay.ErrHeldBack):
		default:
			perMessage = true
		}
	}
	switch {
	case nAcked == len(r.errs):
		return nil
	case nAcked == 0 && !perMessage && firstUnavailable != nil:
		return fmt.Errorf("outbox/kafka: every message of the batch failed on its route: %w", firstUnavailable)
	case nAcked == 0 && !perMessage && firstBatch != nil:
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("outbox/kafka: %d messages not acknowledged: %w", len(r.errs), err)
		}
		return firstBatch
	}
	return relay.PublishErrors(r.errs)
}

// ---- producer IDs and partition state ----

// prepare sets c's record batch up for tp's producer state: the producer
// ID, epoch and sequence it is sent with. A partition whose last batch
// ended in an unknown or refused state first waits for a producer ID of a
// later generation and starts its sequence at 0 under it.
func (p *Publisher) prepare(ctx context.Context, tp topicPartition, c *chunk, r *run) error {
	p.mu.Lock()
	ps := p.parts[tp]
	if ps == nil {
		ps = &partState{minGen: 1}
		p.parts[tp] = ps
	}
	minGen := ps.minGen
	valid := ps.valid
	p.mu.Unlock()
	if !valid {
		id, err := p.producerID(ctx, minGen)
		if err != nil {
			return err
		}
		p.mu.Lock()
		*ps = partState{pid: id.pid, epoch: id.epoch, gen: id.gen, valid: true}
		p.mu.Unlock()
	}
	p.mu.Lock()
	pid, epoch, seq := ps.pid, ps.epoch, ps.seq
	p.mu.Unlock()
	if c.batch != nil && c.pid == pid && c.epoch == epoch && c.seq == seq {
		return nil // a resend: the same batch, byte for byte
	}
	// A record is in one record batch at a time: a batch is rebuilt (split,
	// or a fresh producer ID) only once the broker answered the last one.
	records := make([]*sarama.Record, len(c.idx))
	for j, i := range c.idx {
		records[j] = r.recs[i].record
		records[j].OffsetDelta = int64(j)
	}
	c.pid, c.epoch, c.seq = pid, epoch, seq
	c.batch = &sarama.RecordBatch{
		Version:          2,
		Codec:            p.sc.Producer.Compression,
		CompressionLevel: p.sc.Producer.CompressionLevel,
		FirstTimestamp:   r.ts,
		MaxTimestamp:     r.ts,
		ProducerID:       pid,
		ProducerEpoch:    epoch,
		FirstSequence:    seq,
		LastOffsetDelta:  int32(len(records) - 1),
		Records:          records,
	}
	return nil
}

// acked advances tp's sequence past c.
func (p *Publisher) acked(tp topicPartition, c *chunk) {
	p.hc.saw(tp.topic)
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.parts[tp]; ps != nil && ps.valid && ps.pid == c.pid && ps.epoch == c.epoch {
		ps.seq = nextSeq(c.seq, len(c.idx))
	}
}

// invalidate makes tp's next batch wait for a producer ID of a later
// generation than the one it used.
func (p *Publisher) invalidate(tp topicPartition) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.parts[tp]; ps != nil && ps.valid {
		ps.valid = false
		ps.minGen = ps.gen + 1
	}
}

// producerID returns a producer ID of generation minGen or later,
// requesting one (InitProducerId, shared by every waiter) if the current
// one is older.
func (p *Publisher) producerID(ctx context.Context, minGen uint64) (producerIdent, error) {
	p.mu.Lock()
	if p.ident.gen >= minGen {
		id := p.ident
		p.mu.Unlock()
		return id, nil
	}
	call := p.idCall
	if call == nil {
		call = &idCall{done: make(chan struct{})}
		p.idCall = call
		go p.fetchProducerID(call)
	}
	p.mu.Unlock()
	select {
	case <-call.done:
	case <-ctx.Done():
		return producerIdent{}, ctx.Err()
	case <-p.closing:
		return producerIdent{}, ErrClosed
	}
	if call.err != nil {
		return producerIdent{}, call.err
	}
	return p.producerID(ctx, minGen)
}

// fetchProducerID runs one InitProducerId request and installs its
// answer as the next generation.
func (p *Publisher) fetchProducerID(call *idCall) {
	id, err := p.initProducerID()
	p.mu.Lock()
	if err == nil {
		p.ident = producerIdent{pid: id.pid, epoch: id.epoch, gen: p.ident.gen + 1}
	}
	p.idCall = nil
	call.err = err
	p.mu.Unlock()
	close(call.done)
}

// initProducerID asks a broker for a producer ID (idempotence without
// transactions: any broker allocates one). An authorization refusal
// (CLUSTER_AUTHORIZATION_FAILED: the principal lacks IDEMPOTENT_WRITE on
// brokers before 2.8) wraps relay.ErrUnavailable.
func (p *Publisher) initProducerID() (producerIdent, error) {
	b := p.client.LeastLoadedBroker()
	if b == nil {
		if err := p.client.RefreshMetadata(); err != nil {
			return producerIdent{}, fmt.Errorf("outbox/kafka: no broker for InitProducerId: %w", err)
		}
		if b = p.client.LeastLoadedBroker(); b == nil {
			return producerIdent{}, fmt.Errorf("outbox/kafka: no broker for InitProducerId: %w", sarama.ErrOutOfBrokers)
		}
	}
	_ = b.Open(p.sc) // ErrAlreadyConnected when it is
	resp, err := b.InitProducerID(&sarama.InitProducerIDRequest{Version: p.initVersion})
	if err != nil {
		_ = b.Close()
		return producerIdent{}, fmt.Errorf("outbox/kafka: InitProducerId: %w", err)
	}
	if resp.Err != sarama.ErrNoError {
		if classifyKError(resp.Err) == unavailable {
			return producerIdent{}, fmt.Errorf("%w: outbox/kafka: InitProducerId: %w", relay.ErrUnavailable, resp.Err)
		}
		return producerIdent{}, fmt.Errorf("outbox/kafka: InitProducerId: %w", resp.Err)
	}
	return producerIdent{pid: resp.ProducerID, epoch: resp.ProducerEpoch}, nil
}

// ---- metadata ----

// partitionCount returns topic's number of partitions, from the client's
// metadata (refreshed when the topic is not known yet, with sarama's
// Metadata.Retry settings). Its error wraps sarama's; ctx's error or
// ErrClosed if those end first (the lookup finishes in the background).
func (p *Publisher) partitionCount(ctx context.Context, topic string) (int32, error) {
	type answer struct {
		n   int32
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		parts, err := p.client.Partitions(topic)
		if err == nil && len(parts) == 0 {
			err = sarama.ErrUnknownTopicOrPartition
		}
		ch <- answer{int32(len(parts)), err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			return 0, fmt.Errorf("partitions of topic %s: %w", topic, a.err)
		}
		return a.n, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("outbox/kafka: metadata of topic %s: %w", topic, ctx.Err())
	case <-p.closing:
		return 0, ErrClosed
	}
}

// leader returns tp's leader broker (refreshing the metadata if it is not
// known), or ctx's error or ErrClosed if those end first.
func (p *Publisher) leader(ctx context.Context, tp topicPartition) (*sarama.Broker, error) {
	type answer struct {
		b   *sarama.Broker
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		b, err := p.client.Leader(tp.topic, tp.part)
		ch <- answer{b, err}
	}()
	select {
	case a := <-ch:
		return a.b, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.closing:
		return nil, ErrClosed
	}
}

// refresh refreshes topic's metadata in the background (one refresh per
// topic at a time), after a batch was refused by a broker that is no
// longer the leader or whose connection failed.
func (p *Publisher) refresh(topic string) {
	p.mu.Lock()
	if p.refreshing[topic] || p.closed {
		p.mu.Unlock()
		return
	}
	p.refreshing[topic] = true
	p.mu.Unlock()
	go func() {
		_ = p.client.RefreshMetadata(topic)
		p.mu.Lock()
		delete(p.refreshing, topic)
		p.mu.Unlock()
	}()
}

// backoff waits before the attempt-th resend of a batch: sarama's
// Producer.Retry.BackoffFunc, or Retry.Backoff. It returns ctx's error or
// ErrClosed if those end first.
func (p *Publisher) backoff(ctx context.Context, attempt int) error {
	d := p.sc.Producer.Retry.Backoff
	if f := p.sc.Producer.Retry.BackoffFunc; f != nil {
		d = f(attempt, p.sc.Producer.Retry.Max)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closing:
		return ErrClosed
	}
}

// ---- senders ----

// pending is one record batch handed to a sender.
type pending struct {
	tp    topicPartition
	batch *sarama.RecordBatch
	bytes int
	run   *run
	n     int

	taken, cancelled bool // guarded by Publisher.mu
	done             chan produceResult
}

// produceResult is the answer for one record batch.
type produceResult struct {
	kerr  sarama.KError // the partition's error code
	err   error         // the request's error (no answer)
	taken bool          // the batch went into a request
}

// sender sends the batches handed to it for one broker, one Produce
// request at a time (at most one request in flight per broker, as
// sarama's Net.MaxOpenRequests = 1 asks), each request carrying every
// batch waiting when it starts, at most one per partition: a broker
// appends each partition's batch atomically.
type sender struct {
	b     *sarama.Broker
	queue []*pending
}

// produce hands pd to the sender of broker b and waits for its answer.
// queued is called once pd is queued. If ctx ends first it returns sent
// false, and res.taken says whether the batch had gone into a request
// (its outcome is then unknown).
func (p *Publisher) produce(ctx context.Context, b *sarama.Broker, pd *pending, queued func()) (res produceResult, sent bool) {
	pd.done = make(chan produceResult, 1)
	p.mu.Lock()
	s := p.senders[b]
	start := s == nil
	if start {
		s = &sender{b: b}
		p.senders[b] = s
	}
	s.queue = append(s.queue, pd)
	p.mu.Unlock()
	if start {
		go p.runSender(s)
	}
	queued()
	select {
	case res = <-pd.done:
		return res, true
	case <-ctx.Done():
		p.mu.Lock()
		taken := pd.taken
		pd.cancelled = !taken
		p.mu.Unlock()
		return produceResult{taken: taken}, false
	}
}

// runSender sends s's queue until it is empty, then retires s.
func (p *Publisher) runSender(s *sender) {
	for {
		p.mu.Lock()
		if plug := p.plugged; plug != nil {
			p.mu.Unlock()
			<-plug
			continue
		}
		var take []*pending
		seen := map[topicPartition]bool{}
		total := 0
		rest := s.queue[:0]
		for _, pd := range s.queue {
			switch {
			case pd.cancelled:
			case seen[pd.tp] || (len(take) > 0 && total+pd.bytes > int(sarama.MaxRequestSize)-requestSlack):
				rest = append(rest, pd)
			default:
				pd.taken = true
				seen[pd.tp] = true
				total += pd.bytes
				take = append(take, pd)
			}
		}
		s.queue = rest
		if len(take) == 0 {
			delete(p.senders, s.b)
			p.mu.Unlock()
			return
		}
		p.inflight++
		p.mu.Unlock()

		req := &sarama.ProduceRequest{RequiredAcks: sarama.WaitForAll, Timeout: int32(p.sc.Producer.Timeout / time.Millisecond), Version: p.reqVersion}
		for _, pd := range take {
			req.AddBatch(pd.tp.topic, pd.tp.part, pd.batch)
		}
		resp, err := s.b.Produce(req)
		if err != nil && classifyRequestError(err) == resend {
			// No answer: drop the connection, so that the next request opens
			// a fresh one (the client reopens a broker it hands out) instead
			// of queueing behind a dead or stalled one.
			_ = s.b.Close()
		}

		p.mu.Lock()
		if p.inflight--; p.inflight == 0 && p.settled != nil {
			close(p.settled)
			p.settled = nil
		}
		p.mu.Unlock()
		runs := map[*run]int{}
		for _, pd := range take {
			res := produceResult{taken: true, err: err}
			if err == nil {
				if blk := resp.GetBlock(pd.tp.topic, pd.tp.part); blk != nil {
					res.kerr = blk.Err
				} else {
					res.err = fmt.Errorf("outbox/kafka: the broker's answer lacks topic %s partition %d", pd.tp.topic, pd.tp.part)
				}
			}
			runs[pd.run] += pd.n
			pd.done <- res
		}
		for r, n := range runs {
			r.answered(n)
		}
	}
}

// settle waits until no Produce request of an earlier Publish call is in
// flight (one that call gave up waiting for), so that a batch never
// overtakes an earlier batch of the same partition still on its way. It
// returns an error wrapping ctx's if ctx ends first.
func (p *Publisher) settle(ctx context.Context) error {
	p.mu.Lock()
	if p.inflight == 0 {
		p.mu.Unlock()
		return nil
	}
	if p.settled == nil {
		p.settled = make(chan struct{})
	}
	ch := p.settled
	p.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("outbox/kafka: a produce request of the previous batch is still unanswered: %w", ctx.Err())
	}
}

// plug holds every sender back until unplug, while a Publish call's
// streams hand over their first record batches (run.first).
func (p *Publisher) plug() {
	p.mu.Lock()
	if p.plugged == nil {
		p.plugged = make(chan struct{})
	}
	p.mu.Unlock()
}

// unplug lets the senders go; it is safe to call twice.
func (p *Publisher) unplug() {
	p.mu.Lock()
	if p.plugged != nil {
		close(p.plugged)
		p.plugged = nil
	}
	p.mu.Unlock()
}
