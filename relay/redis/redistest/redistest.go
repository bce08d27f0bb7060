package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	redispub "github.com/sqloutbox/outbox/relay/redis"
)

// UniqueName returns prefix followed by 12 random hex digits, a key
// prefix no other test picks, e.g. UniqueName("outboxtest:") + ":".
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// DeleteKeys deletes every key matching pattern (a SCAN MATCH glob such
// as "outboxtest:1f2e3d4c5b6a:*") and returns how many it deleted. It
// walks the keyspace with SCAN (never KEYS) and deletes in chunks; a key
// written while it runs may be left. The error is the server's.
func DeleteKeys(ctx context.Context, c redis.Cmdable, pattern string) (int, error) {
	n := 0
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return n, fmt.Errorf("redistest: scanning %s: %w", pattern, err)
		}
		if len(keys) > 0 {
			d, err := c.Del(ctx, keys...).Result()
			n += int(d)
			if err != nil {
				return n, fmt.Errorf("redistest: deleting %s: %w", pattern, err)
			}
		}
		if cursor = next; cursor == 0 {
			return n, nil
		}
	}
}

// Record is one stream entry a [Consumer] read.
type Record struct {
	// Stream is the entry's stream key; ID its entry ID ("ms-seq"),
	// increasing within the stream.
	Stream string
	ID     string
	// Payload is the value of the publisher's payload field
	// (redispub.PayloadField) as received; nil if the entry has none.
	Payload []byte
	// Headers holds every other field: the relay's emit.Header* headers
	// and the event's own, as the publisher writes them.
	Headers map[string]string
	// Received is time.Now() taken right after the XREAD that returned
	// the entry, before any processing.
	Received time.Time
	// Values is the entry's fields as go-redis returned them.
	Values map[string]any
}

// MessageID returns the record's outbox message ID (the
// [emit.HeaderMessageID] field the publisher sets) and whether it has one.
func (r Record) MessageID() (string, bool) {
	id, ok := r.Headers[emit.HeaderMessageID]
	return id, ok
}

// PublisherRecord returns the record as the conformance suite
// (publishertest) wants it: the payload, the headers, and r itself as Raw.
func (r Record) PublisherRecord() publishertest.Record {
	return publishertest.Record{Payload: r.Payload, Headers: r.Headers, Raw: r}
}

// PublisherRecords converts recs with [Record.PublisherRecord], in order.
func PublisherRecords(recs []Record) []publishertest.Record {
	return publishertest.RecordsOf(recs, Record.PublisherRecord)
}

// ByMessageID groups recs by outbox message ID, each group in the order
// of recs (a group of two or more is a duplicate delivery). Records
// without a message ID are left out.
// It is [outboxtest.ByMessageID].
func ByMessageID(recs []Record) map[string][]Record {
	return outboxtest.ByMessageID(recs, Record.MessageID)
}

// DefaultBlock is how long one XREAD of a [Consumer] blocks when no entry
// is there. An entry ends the wait at once, so it bounds idle round trips,
// not latency.
const DefaultBlock = time.Second

// Consumer reads streams from their first entry (XREAD from "0", then
// from the last ID read, BLOCK [DefaultBlock], up to 1,000 entries a
// call) on a client of its own in a background goroutine, and records
// every entry in the order read: within a stream in ID order. Streams that
// do not exist yet are read once they do. It reads, never acknowledges
// or deletes (no consumer group). The zero value is not usable: call
// [NewConsumer]. Safe for concurrent use.
type Consumer struct {
	cl     *redis.Client
	cancel context.CancelFunc
	done   chan struct{}

	recs *outboxtest.Recorder[Record]

	mu   sync.Mutex
	errs []error
}

// NewConsumer starts reading streams (at least one key) with a client
// made from a copy of opts (its address, credentials, TLS; go-redis's
// own retries are turned off). It errors if no stream is given or the
// server does not answer a PING within 5 s; a read error later (a key of
// another type: WRONGTYPE) is kept in [Consumer.Errors] and the read is
// retried after 50 ms. Close it when done.
func NewConsumer(opts *redis.Options, streams ...string) (*Consumer, error) {
	if len(streams) == 0 {
		return nil, errors.New("redistest: NewConsumer needs at least one stream")
	}
	o := *opts
	o.MaxRetries = -1
	o.ContextTimeoutEnabled = true
	cl := redis.NewClient(&o)
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	if err := cl.Ping(pctx).Err(); err != nil {
		_ = cl.Close()
		return nil, fmt.Errorf("redistest: Redis at %s: %w", o.Addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Consumer{cl: cl, cancel: cancel, done: make(chan struct{}), recs: outboxtest.NewRecorder[Record]("redistest")}
	go c.loop(ctx, streams)
	return c, nil
}

func (c *Consumer) loop(ctx context.Context, streams []string) {
	defer close(c.done)
	args := make([]string, 2*len(streams))
	copy(args, streams)
	for i := range streams {
		args[len(streams)+i] = "0"
	}
	retry := time.NewTimer(0)
	<-retry.C
	for {
		res, err := c.cl.XRead(ctx, &redis.XReadArgs{Streams: args, Count: 1000, Block: DefaultBlock}).Result()
		now := time.Now()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, redis.Nil) {
			continue
		}
		var recs []Record
		for _, s := range res {
			for _, x := range s.Messages {
				r := Record{Stream: s.Stream, ID: x.ID, Headers: make(map[string]string, len(x.Values)), Received: now, Values: x.Values}
				for k, v := range x.Values {
					str, _ := v.(string)
					if k == redispub.PayloadField {
						r.Payload = []byte(str)
						continue
					}
					r.Headers[k] = str
				}
				recs = append(recs, r)
			}
			if n := len(s.Messages); n > 0 {
				for i := range streams {
					if args[i] == s.Stream {
						args[len(streams)+i] = s.Messages[n-1].ID
					}
				}
			}
		}
		if err != nil {
			c.mu.Lock()
			c.errs = append(c.errs, err)
			c.mu.Unlock()
		}
		c.recs.Add(recs...)
		if err != nil {
			// A retry pause after a failed read, not a synchronisation.
			retry.Reset(50 * time.Millisecond)
			select {
			case <-retry.C:
			case <-ctx.Done():
				return
			}
		}
	}
}

// Records returns a copy of the records read so far, in the order read.
func (c *Consumer) Records() []Record { return c.recs.Records() }

// Errors returns the read errors seen so far (each read was retried).
func (c *Consumer) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// Wait blocks until cond, called with the records so far after every
// change (and once at the start), returns true, or ctx ends; then it
// returns a copy of the records so far and an error wrapping ctx's error
// (match it with errors.Is(err, context.DeadlineExceeded)). cond must not
// block, and must not modify the slice it is given: that is the
// consumer's own (not copied on every change, so that waiting on a long
// run stays cheap); keep what it needs, such as how far it has scanned.
// It is [outboxtest.Recorder.Wait].
func (c *Consumer) Wait(ctx context.Context, cond func([]Record) bool) ([]Record, error) {
	return c.recs.Wait(ctx, cond)
}

// WaitForCount waits, as [Consumer.Wait], until at least n records
// (duplicates counted) were read.
func (c *Consumer) WaitForCount(ctx context.Context, n int) ([]Record, error) {
	return c.recs.WaitForCount(ctx, n)
}

// WaitForMessageIDs waits, as [Consumer.Wait], until a record of every
// given outbox message ID was read, and returns all records so far
// (those of other IDs and duplicates included). With no IDs it returns at
// once. On timeout the error names how many IDs are still missing.
func (c *Consumer) WaitForMessageIDs(ctx context.Context, ids ...string) ([]Record, error) {
	return c.recs.WaitForMessageIDs(ctx, Record.MessageID, ids...)
}

// Close stops the consumer, closes its client and waits for its
// goroutine. Records stay readable; the streams are left as they are
// ([DeleteKeys] removes them). It is safe to call twice.
func (c *Consumer) Close() {
	c.cancel()
	_ = c.cl.Close()
	<-c.done
}
