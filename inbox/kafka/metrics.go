package inboxkafka

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/inboxmetrics"
)

// Names of the metrics Metrics exports. All carry the constant label group
// (the consumer group). The first six are inboxmetrics' (the same for
// every broker's runner); MetricLag is Kafka's.
const (
	// MetricProcessed is a counter of records whose handler's transaction
	// committed (outcome Applied).
	MetricProcessed = inboxmetrics.MetricProcessed
	// MetricDuplicates is a counter of records the inbox recognised as
	// already applied; no handler ran.
	MetricDuplicates = inboxmetrics.MetricDuplicates
	// MetricHeld is a counter of records stored behind a parked message of
	// their aggregate (not applied).
	MetricHeld = inboxmetrics.MetricHeld
	// MetricParked is a counter of records parked after failing.
	MetricParked = inboxmetrics.MetricParked
	// MetricHandlerErrors is a counter of failed handler attempts.
	MetricHandlerErrors = inboxmetrics.MetricHandlerErrors
	// MetricHandlerDuration is a histogram, in seconds, of the applied
	// messages' transactions (hold check, dedupe row, handler, commit).
	MetricHandlerDuration = inboxmetrics.MetricHandlerDuration
	// MetricLag is a gauge per topic and partition (labels topic,
	// partition) of records fetched-but-not-finished plus not yet fetched:
	// the high watermark minus the offset after the last finished record.
	// A revoked partition's series is removed.
	MetricLag = "outbox_inbox_lag"
)

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
	*inboxmetrics.Metrics // the inbox.Observer
	lag                   *prometheus.GaugeVec
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
	im, err := inboxmetrics.Unregistered(cl)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	m := &Metrics{Metrics: im,
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricLag,
			Help: "Records of a partition not yet finished by this consumer (high watermark minus next offset).", ConstLabels: cl},
			[]string{"topic", "partition"}),
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("inboxkafka: registering metrics of group %q: %w", group, err)
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.Metrics.Describe(ch)
	m.lag.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.Metrics.Collect(ch)
	m.lag.Collect(ch)
}

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
