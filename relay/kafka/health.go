package kafka

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/relay"
)

var _ relay.HealthChecker = (*Publisher)(nil)

// healthTimeout caps the network timeouts of the health client, so that a
// silent broker fails a check within seconds, whatever the producer's
// timeouts.
const healthTimeout = 5 * time.Second

// maxHealthTopics bounds the topics a health check asks metadata for.
const maxHealthTopics = 16

// healthCheck is the Publisher's health client: a sarama client of its
// own (the producer's is not reachable through sarama's AsyncProducer),
// opened at the first check, with the producer's configuration (TLS, SASL,
// client ID, version) and short timeouts.
type healthCheck struct {
	sem chan struct{} // one check in flight; created lazily under mu

	mu     sync.Mutex
	client sarama.Client
	topics map[string]bool // topics records were acknowledged on
	closed bool
}

// saw records a topic a record was acknowledged on (at most
// maxHealthTopics are kept).
func (h *healthCheck) saw(topic string) {
	h.mu.Lock()
	if !h.topics[topic] && len(h.topics) < maxHealthTopics {
		if h.topics == nil {
			h.topics = map[string]bool{}
		}
		h.topics[topic] = true
	}
	h.mu.Unlock()
}

func (h *healthCheck) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.client != nil {
		_ = h.client.Close()
		h.client = nil
	}
}

// Healthy implements relay.HealthChecker: it asks a broker for the
// metadata of the topics this publisher has published to (up to 16; the
// cluster's metadata before the first publish), over a client of its own
// with the producer's configuration (TLS, SASL, client ID, version),
// network timeouts of at most 5 s and no metadata retries. It returns nil
// when a broker answered; otherwise an error naming the brokers (wrapping
// relay.ErrUnavailable for SASL or authorization failures), ErrClosed
// after Close, or ctx's error (wrapped) if ctx ends first; the check then
// finishes in the background, and at most one runs at a time. It never
// creates a topic and is safe for concurrent use with Publish.
func (p *Publisher) Healthy(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox/kafka: health check: %w", err)
	}
	p.hc.mu.Lock()
	if p.hc.sem == nil {
		p.hc.sem = make(chan struct{}, 1)
	}
	sem := p.hc.sem
	p.hc.mu.Unlock()
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("outbox/kafka: health check: %w", ctx.Err())
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-sem }()
		done <- p.checkHealth()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("outbox/kafka: health check: %w", ctx.Err())
	}
}

func (p *Publisher) checkHealth() error {
	p.hc.mu.Lock()
	if p.hc.closed {
		p.hc.mu.Unlock()
		return ErrClosed
	}
	client := p.hc.client
	topics := make([]string, 0, len(p.hc.topics))
	for t := range p.hc.topics {
		topics = append(topics, t)
	}
	p.hc.mu.Unlock()
	sort.Strings(topics)
	if client == nil {
		c, err := sarama.NewClient(p.brokers, p.healthConfig())
		if err != nil {
			return fmt.Errorf("outbox/kafka: no broker of %v answered: %w", p.brokers, refusal(err))
		}
		p.hc.mu.Lock()
		if p.hc.closed {
			p.hc.mu.Unlock()
			_ = c.Close()
			return ErrClosed
		}
		p.hc.client, client = c, c
		p.hc.mu.Unlock()
	}
	if err := client.RefreshMetadata(topics...); err != nil {
		return fmt.Errorf("outbox/kafka: no broker of %v answered a metadata request: %w", p.brokers, refusal(err))
	}
	return nil
}

// healthConfig is the producer's configuration with short timeouts, no
// metadata retries, no background refresh and no topic creation.
func (p *Publisher) healthConfig() *sarama.Config {
	c := *p.sc
	c.Metadata.Retry.Max = 0
	c.Metadata.Retry.BackoffFunc = nil
	c.Metadata.RefreshFrequency = 0
	c.Metadata.Full = false
	c.Metadata.AllowAutoTopicCreation = false
	c.Metadata.Timeout = healthTimeout
	c.Net.DialTimeout = min(c.Net.DialTimeout, healthTimeout)
	c.Net.ReadTimeout = min(c.Net.ReadTimeout, healthTimeout)
	c.Net.WriteTimeout = min(c.Net.WriteTimeout, healthTimeout)
	return &c
}
