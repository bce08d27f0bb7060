package inboxkafka

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sqloutbox/outbox/inbox"
)

// Names of the metrics Metrics exports. All carry the constant label group
// (the consumer group).
const (
	// MetricProcessed is a counter of records whose handler's transaction
	// committed (outcome Applied).
	MetricProcessed = "outbox_inbox_processed_total"
	// MetricDuplicates is a counter of records the inbox recognised as
	// already applied; no handler ran.
	MetricDuplicates = "outbox_inbox_duplicates_total"
	// MetricHeld is a counter of records stored behind a parked message of
	// their aggregate (not applied).
	MetricHeld = "outbox_inbox_held_total"
	// MetricParked is a counter of records parked after failing.
	MetricParked = "outbox_inbox_parked_total"
	// MetricHandlerErrors is a counter of failed handler attempts.
	MetricHandlerErrors = "outbox_inbox_handler_errors_total"
	// MetricHandlerDuration is a histogram, in seconds, of the applied
	// messages' transactions (hold check, dedupe row, handler, commit).
	MetricHandlerDuration = "outbox_inbox_handler_duration_seconds"
	// MetricLag is a gauge per topic and partition (labels topic,
	// partition) of records fetched-but-not-finished plus not yet fetched:
	// the high watermark minus the offset after the last finished record.
	// A revoked partition's series is removed.
	MetricLag = "outbox_inbox_lag"
)

// 0.1 ms doubling to 6.6 s (17 buckets): a SQLite commit to a slow handler.
var handlerDurationBuckets = prometheus.ExponentialBuckets(0.0001, 2, 17)

// Metrics records a consumer's outcomes as Prometheus metrics (the
// Metric* names). It is two observers: an inbox.Observer, counting what
// the inbox does (applied, duplicates, held, parked, handler errors,
// handler duration; Retry's work included), and an Observer of the
// runner, recording lag per partition. Create it with NewMetrics and give
// it to both:
//
//	m, _ := inboxkafka.NewMetrics(reg, "billing")
//	in, _ := inbox.New(inbox.Config{..., Observer: m})
//	r, _ := inboxkafka.NewRunner(inboxkafka.Config{..., Inbox: in, Observer: m})
//
// (NewRunner logs a warning when the runner has it and the inbox has not.)
// Its methods only update atomic collectors; they never block and are
// safe for concurrent use. It is also a prometheus.Collector (NewMetrics
// registers it).
type Metrics struct {
	processed, duplicates, held, parked, handlerErrors prometheus.Counter
	duration                                           prometheus.Histogram
	lag                                                *prometheus.GaugeVec
}

var (
	_ Observer       = (*Metrics)(nil)
	_ inbox.Observer = (*Metrics)(nil)
)

// NewMetrics creates the metrics of the consumer group named group (the
// group label) and registers them with reg (prometheus.DefaultRegisterer
// if nil). It returns ErrInvalidConfig (wrapped) for an empty group, or the
// registration error, wrapped (a prometheus.AlreadyRegisteredError for a
// second registration of the same group on reg); it never panics.
func NewMetrics(reg prometheus.Registerer, group string) (*Metrics, error) {
	if group == "" {
		return nil, fmt.Errorf("%w: NewMetrics needs a group name", ErrInvalidConfig)
	}
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	cl := prometheus.Labels{"group": group}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl})
	}
	m := &Metrics{
		processed:     counter(MetricProcessed, "Inbox records whose handler transaction committed."),
		duplicates:    counter(MetricDuplicates, "Inbox records recognised as already applied (no handler ran)."),
		held:          counter(MetricHeld, "Inbox records stored behind a parked message of their aggregate."),
		parked:        counter(MetricParked, "Inbox records parked after their handler failed."),
		handlerErrors: counter(MetricHandlerErrors, "Failed inbox handler attempts."),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricHandlerDuration,
			Help: "Seconds of successful inbox Handle calls (dedupe row, handler, commit).", ConstLabels: cl,
			Buckets: handlerDurationBuckets}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricLag,
			Help: "Records of a partition not yet finished by this consumer (high watermark minus next offset).", ConstLabels: cl},
			[]string{"topic", "partition"}),
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("inboxkafka: registering metrics of group %q: %w", group, err)
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.processed, m.duplicates, m.held, m.parked, m.handlerErrors, m.duration, m.lag}
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

// Applied implements inbox.Observer: a handler's transaction committed
// (through the runner, Handle or Retry).
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

// Processed implements Observer; it does nothing: outcomes are counted
// through inbox.Observer, so that Retry and other callers of the inbox
// count too.
func (m *Metrics) Processed(Result) {}

// AttemptFailed implements Observer; it does nothing (see HandlerFailed).
func (m *Metrics) AttemptFailed(string, int32, int, error) {}

// Lag implements Observer.
func (m *Metrics) Lag(topic string, partition int32, lag int64) {
	m.lag.WithLabelValues(topic, strconv.FormatInt(int64(partition), 10)).Set(float64(lag))
}

// PartitionRevoked implements Observer: it removes the partition's lag.
func (m *Metrics) PartitionRevoked(topic string, partition int32) {
	m.lag.DeleteLabelValues(topic, strconv.FormatInt(int64(partition), 10))
}
