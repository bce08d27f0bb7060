package main

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// outboxRow is one row of the outbox table as read back after the run.
type outboxRow struct {
	ID          int64
	MessageID   string
	AggregateID string
	EventType   string
}

// consumedRecord is one record the Kafka consumer received.
type consumedRecord = kafkatest.Record

// commitKey identifies one committed event: the workload emits each event
// type at most once per order.
type commitKey struct {
	AggregateID string
	EventType   string
}

// latency summarizes commit-to-consume latencies, in milliseconds.
type latency struct {
	P50     float64 `json:"p50"`
	P99     float64 `json:"p99"`
	Max     float64 `json:"max"`
	Samples int     `json:"samples"`
}

// report is the outcome of one run. check fills the delivery fields; run
// adds the rest.
type report struct {
	Dialect string `json:"dialect"`
	Broker  string `json:"broker"`
	Orders  int    `json:"orders"`
	Workers int    `json:"workers"`

	// Emitted is the number of outbox rows (events committed).
	Emitted int `json:"emitted"`
	// Delivered is the number of distinct outbox message IDs consumed.
	Delivered int `json:"delivered"`
	// Duplicates counts consumed records whose message ID was consumed before.
	Duplicates int `json:"duplicates"`
	// Lost counts outbox rows never consumed.
	Lost int `json:"lost"`
	// Ghosts counts distinct consumed message IDs that are not in the table.
	Ghosts int `json:"ghosts"`
	// OrderViolations counts first deliveries of an aggregate's event whose
	// outbox id is lower than that of an event of the same aggregate first
	// delivered earlier.
	OrderViolations int `json:"order_violations"`
	// LatencyMS is commit (Commit returned) to consumer receive, over first
	// deliveries.
	LatencyMS latency `json:"latency_ms"`

	// PickupMS (COMMIT returned to the relay's Publish call: waiting for
	// the relay's cycle in progress, then the claim) and PublishMS (Publish
	// call to every record acknowledged) split the latency; RelayBatches
	// counts Publish calls.
	PickupMS     latency `json:"pickup_ms"`
	PublishMS    latency `json:"publish_ms"`
	RelayBatches int     `json:"relay_batches"`

	// Transactions and Retries count the workload's committed
	// transactions and its retried attempts (deadlock, serialization, busy).
	Transactions int `json:"transactions"`
	Retries      int `json:"retries"`
	// WorkloadMS is the workers' time, first BEGIN to last COMMIT.
	WorkloadMS float64 `json:"workload_ms"`
	// RelayMS is first commit to last first delivery; EventsPerSec is
	// Delivered over it: the relay's end-to-end throughput.
	RelayMS      float64 `json:"relay_ms"`
	EventsPerSec float64 `json:"events_per_sec"`
	// DrainMS is last commit to last first delivery: how far the relay
	// trailed the writers.
	DrainMS float64 `json:"drain_ms"`
	// TimedOut is true if not every event was consumed within -timeout.
	TimedOut bool `json:"timed_out"`
	// WallMS is the whole run, setup and teardown included.
	WallMS float64 `json:"wall_ms"`
	// OK is true when nothing was lost, no ghost appeared and no
	// aggregate's order was broken.
	OK bool `json:"ok"`

	firstCommit, lastCommit, lastDelivery time.Time
}

// failed reports whether the run broke an invariant the quickstart checks.
func (r report) failed() bool { return r.Lost > 0 || r.Ghosts > 0 || r.OrderViolations > 0 }

// exitCode is the process status for a run: 1 if it failed or broke an
// invariant, 0 otherwise.
func exitCode(r report, err error) int {
	if err != nil || r.failed() {
		return 1
	}
	return 0
}

// check joins consumed records with the outbox rows by message ID (the
// outbox-message-id header) and counts deliveries, duplicates, losses,
// ghosts and per-aggregate order violations with the public test kit's
// ledger (kafkatest.Check); commits (commit times by aggregate ID and
// event type) give each first delivery's latency.
//
// Order is judged per partition in offset order, which is consumption
// order: all of an aggregate's records share one partition (the key is
// the aggregate ID). Each record without a message ID header is a ghost.
func check(rows []outboxRow, recs []consumedRecord, commits map[commitKey]time.Time) report {
	ledgerRows := make([]kafkatest.Row, len(rows))
	for i, r := range rows {
		// The quickstart emits only aggregates of type "order".
		ledgerRows[i] = kafkatest.Row{ID: r.ID, MessageID: r.MessageID, AggregateType: "order", AggregateID: r.AggregateID}
	}
	l := kafkatest.Check(ledgerRows, recs)
	rep := report{
		Emitted:         l.Committed,
		Delivered:       l.Delivered,
		Duplicates:      l.Duplicates,
		Lost:            len(l.Lost),
		Ghosts:          len(l.Ghosts) + l.NoMessageID,
		OrderViolations: len(l.OrderViolations),
	}

	// Latency of first deliveries: the earliest offset of each message ID
	// that is a row.
	byMsg := make(map[string]bool, len(rows))
	for _, r := range rows {
		byMsg[r.MessageID] = true
	}
	ordered := slices.Clone(recs)
	slices.SortStableFunc(ordered, func(a, b consumedRecord) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	seen := make(map[string]bool, len(recs))
	var lat []time.Duration
	for _, rec := range ordered {
		mid, ok := rec.MessageID()
		if !ok || seen[mid] || !byMsg[mid] {
			continue
		}
		seen[mid] = true
		if rec.Received.After(rep.lastDelivery) {
			rep.lastDelivery = rec.Received
		}
		aggID := rec.Headers[emit.HeaderAggregateID]
		if aggID == "" {
			aggID = string(rec.Key)
		}
		if at, ok := commits[commitKey{aggID, rec.Headers[emit.HeaderEventType]}]; ok {
			lat = append(lat, rec.Received.Sub(at))
		}
	}
	rep.LatencyMS = summarize(lat)
	rep.OK = !rep.failed()
	return rep
}

// summarize returns nearest-rank percentiles of ds in milliseconds.
func summarize(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	slices.Sort(ds)
	at := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(ds)))) - 1
		return ms(ds[max(0, min(i, len(ds)-1))])
	}
	return latency{P50: at(0.50), P99: at(0.99), Max: ms(ds[len(ds)-1]), Samples: len(ds)}
}

// ms converts d to milliseconds rounded to microseconds.
func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())) / 1000 }
