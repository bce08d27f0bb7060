package metrics

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/relay"
)

// Names of the metrics the collector of NewStatsCollector exports. All
// are gauges read from the outbox table at scrape time and carry the
// constant label table. Every instance that scrapes the same table reports
// the same values: aggregate them with max, not sum.
const (
	// MetricPendingEvents is the number of pending rows (in the pending set,
	// <table>_pending: not yet published, waiting for a retry, or held
	// behind a dead letter).
	MetricPendingEvents = "outbox_pending_events"
	// MetricOldestPendingAge is the age, in seconds by the database clock,
	// of the oldest pending row; 0 when none is pending.
	MetricOldestPendingAge = "outbox_oldest_pending_age_seconds"
	// MetricSentEvents is the number of sent rows (neither pending nor dead)
	// still in the table, that is not yet removed by retention
	// (relay.Retention).
	MetricSentEvents = "outbox_sent_events"
	// MetricDeadLetters is the number of dead-lettered rows (status 2)
	// currently in the table; relay.DeadLetters retries or skips them.
	MetricDeadLetters = "outbox_dead_letters"
	// MetricPartitionPendingEvents is MetricPendingEvents per relay
	// partition (label partition), for every partition that has a lease
	// row or pending rows.
	MetricPartitionPendingEvents = "outbox_partition_pending_events"
	// MetricPartitionOldestPendingAge is MetricOldestPendingAge per relay
	// partition (label partition), in seconds.
	MetricPartitionOldestPendingAge = "outbox_partition_oldest_pending_age_seconds"
	// MetricPartitionOwnerInfo is an info metric, always 1, labelled
	// partition and owner (the relay instance ID holding a live lease).
	// Partitions without a live lease are absent.
	MetricPartitionOwnerInfo = "outbox_partition_owner_info"
	// MetricStatsScrapeError is 1 when reading the statistics failed (or
	// timed out) during this scrape, in which case no other statistics
	// metric is exported, and 0 otherwise.
	MetricStatsScrapeError = "outbox_stats_scrape_error"
	// MetricPartitions is the relay partition count stored in the
	// table (driver.Outbox.PartitionCount).
	MetricPartitions = "outbox_partitions"
	// MetricLeasePartitions is the number of rows in the lease table:
	// outbox_partitions once a relay has run, 0 before.
	MetricLeasePartitions = "outbox_lease_partitions"
	// MetricOutOfRangePending is the number of pending rows in partitions
	// outside 0..outbox_partitions-1, which no relay can own.
	MetricOutOfRangePending = "outbox_out_of_range_pending_events"
	// MetricPartitionMismatch is 1 when the table's partitions disagree
	// (relay.Stats.Mismatch: out-of-range pending rows, or a lease table
	// of another size), else 0.
	MetricPartitionMismatch = "outbox_partition_mismatch"
)

// DefaultStatsTimeout bounds one scrape's statistics queries when
// NewStatsCollector is given no timeout.
const DefaultStatsTimeout = 5 * time.Second

type statsCollector struct {
	ob      *driver.Outbox
	db      *sql.DB
	timeout time.Duration

	pending, oldest, sent, dead, partPending, partOldest, owner, scrapeErr *prometheus.Desc
	count, leaseRows, outOfRange, mismatch                                 *prometheus.Desc
}

// NewStatsCollector returns a prometheus.Collector that, on every scrape,
// reads a relay.ReadStats snapshot of ob's table through db, bounded by
// timeout (DefaultStatsTimeout if not positive), and exports it as the
// gauges listed in the package documentation: outbox_pending_events,
// outbox_oldest_pending_age_seconds, outbox_sent_events,
// outbox_dead_letters, outbox_partition_pending_events{partition},
// outbox_partition_oldest_pending_age_seconds{partition},
// outbox_partition_owner_info{partition,owner}, outbox_partitions,
// outbox_lease_partitions, outbox_out_of_range_pending_events,
// outbox_partition_mismatch and outbox_stats_scrape_error. When the
// snapshot fails (or ob or db is nil) only outbox_stats_scrape_error (1) is
// exported.
//
// Each scrape runs three short queries; give it the relay's small pool or
// another one that cannot starve business queries. Register it once per
// table (with reg.Register or MustRegister).
func NewStatsCollector(ob *driver.Outbox, db *sql.DB, timeout time.Duration) prometheus.Collector {
	table := driver.DefaultTable
	if ob != nil {
		table = ob.Config().Table
	}
	if timeout <= 0 {
		timeout = DefaultStatsTimeout
	}
	cl := prometheus.Labels{"table": table}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, cl)
	}
	return &statsCollector{
		ob: ob, db: db, timeout: timeout,
		pending:     desc(MetricPendingEvents, "Outbox rows pending publication (the pending set)."),
		oldest:      desc(MetricOldestPendingAge, "Age in seconds of the oldest pending outbox row (database clock), 0 if none."),
		sent:        desc(MetricSentEvents, "Sent outbox rows (neither pending nor dead) not yet removed by retention."),
		dead:        desc(MetricDeadLetters, "Dead-lettered outbox rows (status 2) currently in the table."),
		partPending: desc(MetricPartitionPendingEvents, "Outbox rows pending publication, per relay partition.", "partition"),
		partOldest:  desc(MetricPartitionOldestPendingAge, "Age in seconds of the oldest pending outbox row, per relay partition.", "partition"),
		owner:       desc(MetricPartitionOwnerInfo, "Relay instance holding the live lease of a relay partition (always 1).", "partition", "owner"),
		scrapeErr:   desc(MetricStatsScrapeError, "1 if reading the outbox statistics failed during this scrape, else 0."),
		count:       desc(MetricPartitions, "Relay partition count stored in the outbox table."),
		leaseRows:   desc(MetricLeasePartitions, "Rows in the relay partition lease table (0 before any relay ran)."),
		outOfRange:  desc(MetricOutOfRangePending, "Pending outbox rows in partitions outside the stored count, which no relay can own."),
		mismatch:    desc(MetricPartitionMismatch, "1 if the table's relay partitions disagree (out-of-range rows or a lease table of another size), else 0."),
	}
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.oldest, c.sent, c.dead, c.partPending, c.partOldest, c.owner, c.scrapeErr,
		c.count, c.leaseRows, c.outOfRange, c.mismatch} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := relay.ReadStats(ctx, c.ob, c.db)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.scrapeErr, prometheus.GaugeValue, 1)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.scrapeErr, 0)
	gauge(c.pending, float64(st.Pending))
	gauge(c.oldest, st.OldestPending.Seconds())
	gauge(c.sent, float64(st.Sent))
	gauge(c.dead, float64(st.Dead))
	gauge(c.count, float64(st.PartitionCount))
	gauge(c.leaseRows, float64(st.LeaseRows))
	gauge(c.outOfRange, float64(st.OutOfRange))
	mismatch := 0.0
	if st.Mismatch() != nil {
		mismatch = 1
	}
	gauge(c.mismatch, mismatch)
	for _, p := range st.Partitions {
		part := strconv.Itoa(p.Partition)
		gauge(c.partPending, float64(p.Pending), part)
		gauge(c.partOldest, p.OldestPending.Seconds(), part)
		if p.Owner != "" {
			// Label values must be UTF-8; an instance ID need not be.
			gauge(c.owner, 1, part, strings.ToValidUTF8(p.Owner, "\uFFFD"))
		}
	}
}
