package kafka_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// testCtx returns a context that ends after d or with the test.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// startBroker starts a private kfake broker with topics of the given
// partition count; it is closed when the test ends.
func startBroker(t *testing.T, partitions int32, topics ...string) *kafkatest.Broker {
	t.Helper()
	var opts []kafkatest.Option
	if len(topics) > 0 {
		opts = append(opts, kafkatest.Topics(partitions, topics...))
	}
	b, err := kafkatest.Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// newPublisher builds a Publisher and closes it when the test ends (before
// the broker, which was started earlier). A Close that hangs fails the
// test; an error from Close (sarama reports records that failed after
// their Publish gave up) is only logged: tests that care check Close
// themselves.
func newPublisher(t *testing.T, cfg kafka.Config) *kafka.Publisher {
	t.Helper()
	p, err := kafka.NewPublisher(cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() {
		switch err := closeWithin(p, 30*time.Second); {
		case errors.Is(err, errCloseHung):
			t.Error(err)
		case err != nil:
			t.Logf("Close: %v", err)
		}
	})
	return p
}

var errCloseHung = errors.New("Publisher.Close did not return in time")

// closeWithin closes p and fails with errCloseHung if Close takes longer
// than d (the Close goroutine is then leaked; the test fails anyway).
func closeWithin(p *kafka.Publisher, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return errCloseHung
	}
}

// newConsumer consumes topics from their start until the test ends.
func newConsumer(t *testing.T, b *kafkatest.Broker, topics ...string) *kafkatest.Consumer {
	t.Helper()
	c, err := kafkatest.NewConsumer(b.Addrs(), topics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// byMessageID indexes consumed records by their outbox-message-id header and
// fails the test on a duplicate.
func byMessageID(t *testing.T, recs []kafkatest.Record) map[string]kafkatest.Record {
	t.Helper()
	out := make(map[string]kafkatest.Record, len(recs))
	for _, r := range recs {
		id := r.Headers["outbox-message-id"]
		if prev, dup := out[id]; dup {
			t.Errorf("message %q consumed twice: %s[%d]@%d and %s[%d]@%d", id,
				prev.Topic, prev.Partition, prev.Offset, r.Topic, r.Partition, r.Offset)
		}
		out[id] = r
	}
	return out
}

// asPublishErrors reports whether err is (or wraps) relay.PublishErrors.
func asPublishErrors(err error) (relay.PublishErrors, bool) {
	var pe relay.PublishErrors
	ok := errors.As(err, &pe)
	return pe, ok
}

// wireSpy records what the producer put on the wire, as the broker
// received it: the acks of every Produce request, the producer ID of every
// record batch, and how many InitProducerId requests came in. It only
// observes; the broker handles every request normally.
type wireSpy struct {
	mu          sync.Mutex
	acks        []int16
	producerIDs []int64
	initPIDs    int
}

func spyOn(c *kfake.Cluster) *wireSpy {
	s := &wireSpy{}
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		pr, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return nil, nil, false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.acks = append(s.acks, pr.Acks)
		for _, tp := range pr.Topics {
			for _, pp := range tp.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(pp.Records); err == nil {
					s.producerIDs = append(s.producerIDs, rb.ProducerID)
				}
			}
		}
		return nil, nil, false
	})
	c.ControlKey(kmsg.InitProducerID.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		s.mu.Lock()
		s.initPIDs++
		s.mu.Unlock()
		return nil, nil, false
	})
	return s
}

func (s *wireSpy) snapshot() (acks []int16, producerIDs []int64, initPIDs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int16(nil), s.acks...), append([]int64(nil), s.producerIDs...), s.initPIDs
}

// clientIDProxy is a TCP proxy in front of a broker that records the client
// ID in the header of the first request on every connection (Kafka request
// header: int32 size, int16 api key, int16 version, int32 correlation id,
// nullable int16-length string client id; the client id stays a classic
// string even in flexible header v2). Only the clients' bootstrap
// connections pass through it; the broker advertises its own address.
type clientIDProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	ids    []string
	conns  []net.Conn
	closed bool
}

func startClientIDProxy(t *testing.T, target string) *clientIDProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &clientIDProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *clientIDProxy) Addr() string { return p.ln.Addr().String() }

func (p *clientIDProxy) IDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.ids...)
}

// track remembers c for close, or closes it at once if the proxy is closed.
func (p *clientIDProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return
	}
	p.conns = append(p.conns, c)
}

func (p *clientIDProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *clientIDProxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(c, body); err != nil {
		return
	}
	if len(body) >= 10 {
		n := int16(binary.BigEndian.Uint16(body[8:10]))
		id := "<null>"
		if n >= 0 && len(body) >= 10+int(n) {
			id = string(body[10 : 10+int(n)])
		}
		p.mu.Lock()
		p.ids = append(p.ids, id)
		p.mu.Unlock()
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.track(up)
	defer up.Close()
	if _, err := up.Write(append(size[:], body...)); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(c, up)
		_ = c.Close()
	}()
	_, _ = io.Copy(up, c)
	_ = up.Close()
	<-done
}

func (p *clientIDProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
