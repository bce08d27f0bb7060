// Package inboxmetrics records what an inbox does as Prometheus metrics:
// an [inbox.Observer] to give to inbox.Config.Observer, whatever the
// broker the messages come from (the runners of inbox/kafka, inbox/nats,
// inbox/rabbitmq and inbox/redis, or a consumer's own loop), counting
// Retry's work too. inboxkafka.Metrics adds the Kafka lag to it. The
// brokers report their own backlog: RabbitMQ's queue depth
// (rabbitmq_prometheus), a JetStream consumer's num_pending, a Redis
// consumer group's lag (XINFO GROUPS).
package inboxmetrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sqloutbox/outbox/inbox"
)

// Names of the metrics Metrics exports. All carry the constant labels
// given to New.
const (
	// MetricProcessed is a counter of messages whose handler's
	// transaction committed (outcome Applied, Retry included).
	MetricProcessed = "outbox_inbox_processed_total"
	// MetricDuplicates is a counter of messages the inbox recognised as
	// already applied; no handler ran.
	MetricDuplicates = "outbox_inbox_duplicates_total"
	// MetricHeld is a counter of messages stored behind a parked message
	// of their aggregate (not applied).
	MetricHeld = "outbox_inbox_held_total"
	// MetricParked is a counter of messages parked after failing.
	MetricParked = "outbox_inbox_parked_total"
	// MetricHandlerErrors is a counter of failed handler attempts.
	MetricHandlerErrors = "outbox_inbox_handler_errors_total"
	// MetricHandlerDuration is a histogram, in seconds, of the applied
	// messages' transactions (hold check, dedupe row, handler, commit).
	MetricHandlerDuration = "outbox_inbox_handler_duration_seconds"
)

// HandlerDurationBuckets are MetricHandlerDuration's buckets: 0.1 ms
// doubling to 6.6 s (17 buckets), a SQLite commit to a slow handler.
var HandlerDurationBuckets = prometheus.ExponentialBuckets(0.0001, 2, 17)

// ErrInvalidLabels is returned (wrapped) by New for no labels or an
// empty label value.
var ErrInvalidLabels = errors.New("inboxmetrics: invalid labels")

// Metrics counts an inbox's outcomes. It implements inbox.Observer (its
// methods only update atomic collectors: they never block and are safe
// for concurrent use) and prometheus.Collector.
type Metrics struct {
	processed, duplicates, held, parked, handlerErrors prometheus.Counter
	duration                                           prometheus.Histogram
}

var _ inbox.Observer = (*Metrics)(nil)

// New creates the metrics with the constant labels (at least one, each
// with a non-empty value: {"consumer": "billing"}, so that two consumers
// of one process are told apart) and registers them with reg
// (prometheus.DefaultRegisterer if nil). It returns
// ErrInvalidLabels (wrapped) or the registration error, wrapped (a
// prometheus.AlreadyRegisteredError for the same labels twice); it never
// panics.
func New(reg prometheus.Registerer, labels prometheus.Labels) (*Metrics, error) {
	m, err := Unregistered(labels)
	if err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("inboxmetrics: registering the metrics of %v: %w", labels, err)
	}
	return m, nil
}

// Unregistered is New without the registration, for a collector that
// embeds Metrics and registers itself (inboxkafka.Metrics).
func Unregistered(labels prometheus.Labels) (*Metrics, error) {
	if len(labels) == 0 {
		return nil, fmt.Errorf("%w: at least one label (consumer or group) is needed", ErrInvalidLabels)
	}
	for k, v := range labels {
		if v == "" {
			return nil, fmt.Errorf("%w: label %q is empty", ErrInvalidLabels, k)
		}
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	return &Metrics{
		processed:     counter(MetricProcessed, "Inbox messages whose handler transaction committed."),
		duplicates:    counter(MetricDuplicates, "Inbox messages recognised as already applied (no handler ran)."),
		held:          counter(MetricHeld, "Inbox messages stored behind a parked message of their aggregate."),
		parked:        counter(MetricParked, "Inbox messages parked after their handler failed."),
		handlerErrors: counter(MetricHandlerErrors, "Failed inbox handler attempts."),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricHandlerDuration,
			Help: "Seconds of successful inbox Handle calls (dedupe row, handler, commit).", ConstLabels: labels,
			Buckets: HandlerDurationBuckets}),
	}, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.processed, m.duplicates, m.held, m.parked, m.handlerErrors, m.duration}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// Applied implements inbox.Observer: a handler's transaction committed.
func (m *Metrics) Applied(_ inbox.Message, took time.Duration) {
	m.processed.Inc()
	m.duration.Observe(took.Seconds())
}

// Duplicate implements inbox.Observer.
func (m *Metrics) Duplicate(inbox.Message) { m.duplicates.Inc() }

// Held implements inbox.Observer.
func (m *Metrics) Held(inbox.Message) { m.held.Inc() }

// HandlerFailed implements inbox.Observer: one failed handler attempt.
func (m *Metrics) HandlerFailed(inbox.Message, error) { m.handlerErrors.Inc() }

// Parked implements inbox.Observer.
func (m *Metrics) Parked(inbox.Message, error) { m.parked.Inc() }
