// Package metrics exports the outbox's health as Prometheus metrics
// (github.com/prometheus/client_golang): what a relay does, through
// RelayMetrics (a relay.Observer), and what the outbox table holds, through
// the collector of NewStatsCollector. Together they cover the seed
// article's monitoring: pending count, age of the oldest pending row,
// publish success rate and retries. alerts.yml (a Prometheus rules file)
// and dashboard.json (a Grafana dashboard) in this directory are built on
// them.
//
// # Wiring
//
//	reg := prometheus.NewRegistry()
//	m, err := metrics.NewRelayMetrics(reg, ob) // ob: the *driver.Outbox
//	if err != nil { ... }
//	r, err := relay.New(ob, relayDB, relay.Config{Publisher: pub, Observer: m})
//	reg.MustRegister(metrics.NewStatsCollector(ob, relayDB, 5*time.Second))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//	go func() { errc <- r.Run(ctx) }() // check the error: Run also logs it
//
// Use one RelayMetrics per relay. Register the stats collector once per
// table in each process that should report it (every relay instance
// reports the same numbers; dashboards and alerts aggregate them with max).
// Its queries run on each scrape: give it the relay's own small pool.
//
// # Relay metrics (RelayMetrics)
//
// All carry the constant label table.
//
//   - outbox_published_total (counter, messages): messages the broker
//     acknowledged. A message re-sent after a crash or a lost mark-sent is
//     counted again (delivery is at least once).
//   - outbox_publish_errors_total{class} (counter, messages): failed
//     publishes per message, by relay.ErrorClass: transient (will be
//     retried), permanent (relay.ErrPermanent, dead-lettered at once),
//     unavailable (relay.ErrUnavailable, misconfiguration, no attempt
//     counted), batch (the whole batch failed: one per message of it).
//     The success ratio is rate(outbox_published_total) / (that +
//     rate(outbox_publish_errors_total)).
//   - outbox_retries_total (counter, retries): retries scheduled after a
//     failed attempt.
//   - outbox_dead_lettered_total (counter, messages): messages marked
//     failed (status 2), after MaxAttempts or at once for ErrPermanent.
//   - outbox_commit_to_publish_seconds (histogram, seconds): from the
//     row's creation, just before its transaction's COMMIT, by the database
//     clock, to the broker's acknowledgement (relay.Message.Age plus the
//     time since the claim). Buckets 0.5 ms doubling to 65.5 s.
//   - outbox_batch_size (histogram, messages): messages per non-empty
//     claim, that is per Publish batch. Buckets 1 to 5000 (1-2-5 series;
//     relay.Config.MaxBatchSize defaults to 2,000).
//   - outbox_claim_duration_seconds (histogram, seconds): duration of a
//     non-empty claim query. Buckets 0.1 ms doubling to 6.6 s.
//   - outbox_partitions_owned (gauge, partitions): relay partitions this
//     instance holds a lease on; 0 once the relay stopped.
//   - outbox_relay_up (gauge, 1/0): 1 while the relay runs and is ready
//     (relay.Relay.Ready is nil); 0 while not ready, and when stopped.
//   - outbox_relay_partition_mismatch (gauge, 1/0): 1 while the relay
//     detects a relay partition mismatch (relay.ErrPartitionMismatch:
//     pending rows in partitions no relay can own, a lease table of
//     another size, a stored count that differs from the configured one),
//     including after it refused to start because of one.
//   - outbox_relay_order_violations_total (counter, messages): messages
//     the publisher acknowledged although an earlier message of their
//     aggregate in the same batch had failed (relay.OrderObserver), so
//     their first delivery may precede it. No publisher of this module
//     lets that happen; alert on any increase.
//   - outbox_transactions_total{outcome} (counter, transactions): broker
//     transactions of relay/kafka's exactly-once mode, one per relay
//     partition per batch (relay.TransactionObserver), by outcome:
//     committed, aborted (a message failed; all re-sent), unknown (the
//     partition is reconciled), fenced (another relay took the partition,
//     or a transaction outlived transaction.timeout.ms). Stays empty in
//     the default mode.
//   - outbox_reconciled_rows_total (counter, rows): rows marked sent by
//     reconciling a partition: committed at the broker but not yet marked
//     in the database (a relay killed between the two). Each is a
//     duplicate the exactly-once mode prevented.
//   - outbox_relay_source_messages_total{source} (counter, messages):
//     messages the relay's cycles found, by source: table (claimed) or
//     wal (read from the replication stream, relay.SourceWAL). With the
//     WAL source a rising table share means the stream is down or keeps
//     handing rows back to the table (docs/wal.md).
//   - outbox_relay_wal_streaming (gauge): 1 while a relay with
//     relay.SourceWAL reads its replication slot, 0 while it stands by,
//     cannot open the slot, or is stopped; 0 without the WAL source.
//   - outbox_relay_wal_confirmed_lsn, outbox_relay_wal_unconfirmed_bytes,
//     outbox_relay_wal_retained_bytes, outbox_relay_wal_decode_delay_seconds
//     (gauges, relay.WALLagObserver): the WAL source's slot, sampled by the
//     relay reading it every relay.Config.HealthInterval: its
//     confirmed_flush_lsn, pg_current_wal_lsn() minus it and minus
//     restart_lsn (bytes), and how long after its commit the last outbox
//     transaction reached the relay (0 once caught up).
//   - outbox_relay_wal_loss (gauge, relay.WALLossObserver): 1 while a loss
//     window of the log-only mode (driver.Config.LogOnly: the slot was
//     dropped or invalidated while it may have held events) is recorded
//     and not acknowledged (relay.AckWALLoss); the relay is not ready
//     meanwhile.
//
// # Table metrics (NewStatsCollector)
//
// Read with relay.ReadStats on every scrape; all gauges with the constant
// label table.
//
//   - outbox_pending_events (rows): pending rows (the pending set,
//     <table>_pending), including rows waiting for a retry or held behind
//     a dead letter.
//   - outbox_oldest_pending_age_seconds (seconds): age of the oldest
//     pending row by the database clock, 0 if none.
//   - outbox_sent_events (rows): sent rows (neither pending nor dead) not
//     yet removed by retention.
//   - outbox_dead_letters (rows): dead-lettered rows (status 2) in the
//     table now; relay.DeadLetters lists, retries or skips them.
//   - outbox_partition_pending_events{partition} (rows) and
//     outbox_partition_oldest_pending_age_seconds{partition} (seconds): the
//     same per relay partition, for partitions with a lease row or pending
//     rows.
//   - outbox_partition_owner_info{partition,owner} (always 1): the relay
//     instance holding a partition's live lease; absent if none does.
//   - outbox_partitions (partitions): the relay partition count
//     stored in the table; outbox_lease_partitions (rows): the lease
//     table's rows (the same once a relay ran, 0 before);
//     outbox_out_of_range_pending_events (rows): pending rows in
//     partitions outside the stored count, which no relay can own;
//     outbox_partition_mismatch (1/0): 1 if any of these disagree
//     (relay.Stats.Mismatch).
//   - outbox_stats_scrape_error (1/0): 1 if the statistics could not be
//     read (database error or timeout) during this scrape; the other table
//     metrics are then absent from that scrape.
//
// # Alerts
//
// alerts.yml holds the seed's alerts and a few more: OutboxBacklogHigh
// (more than 1000 pending for 5 minutes), OutboxOldestPendingTooOld (the
// oldest pending row older than 5 minutes), OutboxPublishSuccessLow
// (success ratio below 99% for 10 minutes), OutboxRelayDown,
// OutboxDeadLetters, OutboxStatsScrapeFailing and OutboxPartitionMismatch.
package metrics
