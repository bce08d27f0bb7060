// Package relay moves committed outbox rows to a broker: in order per
// aggregate, at least once.
//
// # One source of truth
//
// Everything here is built from the *driver.Outbox that describes the
// table: New(ob, db, cfg), NewRetention(ob, db, cfg), NewDeadLetters(ob,
// db), ReadStats(ctx, ob, db), Repartition(ctx, ob, db, n),
// ListenPostgres(ctx, ob, dsn, ...), and in package metrics
// NewRelayMetrics(reg, ob) and NewStatsCollector(ob, db, timeout). In the
// writing process that is the Outbox the driver was registered with; a
// process that has only a DSN (a standalone relay, the outbox command)
// builds one with driver.New(driver.Config{Dialect: ..., Table: ...}),
// which touches no database. The relay partition count is not configured
// anywhere: it is stored in the table (Migrate writes it, Repartition
// changes it) and read from there.
//
// # The loop
//
// A Relay runs one cycle at a time: claim up to BatchSize rows, hand them
// to the Publisher as one batch, record the outcomes, repeat. Under a
// backlog the batch grows: a full claim doubles the next one, up to
// MaxBatchSize and MaxBatchBytes, and a short one returns to BatchSize.
// Two statements overlap the publish: the mark-sent of the batch before,
// and, after a full claim, the claim of the next batch ("reading ahead",
// lookahead.go), which leaves out the rows being published and is used
// only if the whole batch published meanwhile was acknowledged, under the
// same leases; after any failure it is dropped and the next claim sees the
// holds and retry times the outcomes wrote. It waits
// between cycles until whichever comes first: the post-commit wake-up
// (driver.Outbox.Wakeup, or Notify), or the fallback poll (PollInterval,
// default 1 s), which also finds rows written by other processes and
// retries that came due. A full batch starts the next cycle at once. An
// idle relay runs one claim query per PollInterval (see Cost of an idle
// relay below).
//
// # The pending set
//
// Since schema version 9 (PostgreSQL; 8 on SQLite, 6 on MySQL/MariaDB) the
// events waiting to be published are listed in a table of their own,
// <table>_pending (id, partition_key), which triggers on the outbox table
// keep: a row written with status 0 enters it, a dead-lettered row
// (status 2) leaves it, a retried dead letter enters it again, a deleted
// row leaves it. Marking an event sent deletes its entry there: one
// primary-key probe and one small WAL record (redo record on InnoDB),
// where the UPDATE of status it replaces wrote a new copy of the row,
// payload included, and entries in two indexes (on PostgreSQL it could
// never be a HOT update: status is in the partial indexes' predicates).
// The outbox row is written once and, when all goes well, never touched
// again: it is the history (lookups, the admin page, retention, the
// archive) and keeps its message ID unique. A row is pending if its id is
// in the set, sent if its status is 0 or 1 and it is not, dead if its
// status is 2. A message that failed before it was sent (attempts > 0)
// is marked with an UPDATE instead (status 1, its retry time cleared), so
// that the hold index keeps only rows that can hold.
//
// # Claiming
//
// The claim walks the pending set in id order and reads each row by
// primary key (a probe of about four pages per claimed row: 1-1.5 µs of
// server CPU per row on the benchmark machine), keeping those whose retry
// is due by the database's clock, read once per claim
// (statement_timestamp(), UTC_TIMESTAMP(6), or SQLite's unixepoch), and
// only those whose aggregate has no earlier row waiting for
// a retry or dead-lettered. So while event k of an aggregate waits, k+1 is
// not handed out (the seed article's query, "status=0 AND due ORDER BY id",
// would send it first), and other aggregates flow on. It reads the pending
// set, never "id greater than the last seen", so a transaction that got a
// lower id but committed late is still published. The hold check probes an index
// over the rows that can hold (those with a next_retry_at: retrying or
// dead), which is empty in normal operation, so a claim's cost does not
// grow with the backlog; on PostgreSQL one test per claim skips the probes
// altogether when nothing holds. Rows of the batch still being marked
// sent are left out by id in the claim itself.
//
// # A claim whose cost does not depend on the table's state
//
// A claim must cost the same on a table that was never analyzed, whose
// statistics are stale (taken when few rows were pending) or were taken
// during a backlog, and whatever VACUUM (or InnoDB's purge) has not yet
// cleaned up. Two things made it depend on them.
//
// Plans. With statistics that say few rows are pending, a planner reads
// every pending row, sorts them and keeps the first BatchSize (PostgreSQL:
// 226 ms per claim with a 20,000-row backlog on a never-analyzed table).
// The plan is pinned: SQLite's claim says INDEXED BY, MySQL/MariaDB's
// FORCE INDEX, and PostgreSQL, which has no hints, claims through a
// function (<table>_claim, schema version 6) whose SET clauses plan its
// statements without sequential scans, bitmap scans, sorts, hash or merge
// joins: the only plan left is the index walk in id order that stops
// after BatchSize rows.
//
// Dead index entries. PostgreSQL keeps the pending set's index entries of
// rows marked sent until VACUUM removes them, and a walk from the start of
// the index reads them all (1,000,000 such entries: about 2,700 pages per
// claim, TestClaimCostFlatOnPostgres). So the PostgreSQL claim
// starts its walk at a scan floor: an id below which none of the relay's
// partitions' rows is pending or can still become pending. The floor
// moves up only on a proof, never on "the last id seen" (floor.go): a
// claim reads the id sequence's last value L, then takes a transaction ID
// Y; a later claim that finds the oldest running transaction ID at or
// above Y knows that every row with an id up to L is committed or rolled
// back for good, because the commit hook takes its transaction's ID
// before it takes ids (the first row's id expression does). The floor
// then moves to the lowest pending id of the relay's partitions, or to
// L + 1. A commit that got a low id and stalls is still running when the
// proof is checked, so it keeps the floor below its own id until it
// commits or rolls back. Costs and bounds:
//
//   - A proof costs a transaction ID (a commit record, no WAL flush) at
//     most every 10 ms per relay, and no round trip: its figures come back
//     with the claim's rows.
//   - A pending row keeps the floor at or below its id: a retry waiting
//     (up to RetryMax), or an aggregate held by a dead letter until it is
//     retried or skipped. Claims then walk the entries of rows sent above
//     it since the last VACUUM.
//   - A long-running writing transaction anywhere on the server delays
//     the proof (the floor stays where it is); VACUUM cannot remove the
//     entries of rows sent while it runs either.
//   - The floor starts at 0 (one walk from the start) when a relay starts,
//     gains partitions or sees a lease epoch change, and when the table's
//     floor epoch (<table>_meta.floor_epoch) changes: DeadLetters.Retry
//     raises it in its own transaction, since it makes rows pending below
//     the floors, and the claim reads it in its own snapshot. Anything
//     else that sets rows back to pending by hand must raise it too
//     (UPDATE <table>_meta SET floor_epoch = floor_epoch + 1), or restart
//     the relays.
//   - Writers of builds before schema version 6 (during a rolling
//     upgrade) take ids without first taking their transaction ID when
//     the outbox INSERT is their transaction's first write; the proof then
//     has a window of microseconds, inside that INSERT, in which a relay
//     could move past such a row. Upgrade the writers before the relays.
//
// On MySQL/MariaDB and SQLite the claim walks its index from the start:
// SQLite removes index entries at once (it has no MVCC); for MariaDB's
// purge see BENCHMARKS.md.
//
// On MySQL/MariaDB a row marked sent leaves a delete-marked record in the
// pending set until InnoDB's purge removes it (later under write load;
// never while a long transaction holds purge back), and a claim walks
// every such record. The relay therefore remembers,
// as ranges of consecutive ids, the rows its own mark-sent statements
// changed (only statements that changed every row they named) and the
// claim leaves those ranges out of its index range. That is exact, not a
// bound ("the last id seen"): a row that commits late with a lower id was
// never marked, so no range holds it (TestMySQLClaimCostUnderWriters:
// about 4 pages per claimed row under 16 writers instead of 16).
// AUTO_INCREMENT ids are never reused on the supported servers except
// after TRUNCATE TABLE: restart relays after truncating their table (or
// after setting sent rows back to pending by hand). The WAL source on
// PostgreSQL leaves the same ranges out of its check of the stream: restart
// its relays after resetting the table's sequence.
//
// Late rows (MySQL/MariaDB). A plain read in InnoDB sees what its read
// view shows, and MariaDB (10.11 checked, trx0sys) builds a read view by
// walking its hash of active transactions without a lock, while commits
// go on: a view can list as active a transaction that committed before
// another one it shows. When the two wrote one aggregate's events, the
// second waiting on the first's row lock (as business code that locks
// its aggregate does), such a claim saw event k+1 and not event k, and
// handed out k+1 first (found in CI; docs/guarantees.md). So after every
// claim that returned rows, the relay runs the same claim once more
// (Dialect.ClaimLate) with the rows it got left out and bounded below the
// highest of them: its read view is made after the first one was, so it
// shows every transaction that committed before that one's rows, and it
// returns the pending rows below that id that the first did not show.
// They are merged in by id (at most the claim's size in all, the highest
// ids left for the next claim), and the relay looks again until a look
// finds nothing, since a look's own read view can miss a row the same way
// (the looks end: only rows inserted before the batch's highest id
// qualify). A row whose transaction simply committed after the claim's
// view, with a lower id, joins the batch the same way, so under
// concurrent writers a claim often takes two or three looks. Cost: with
// the claimed ids cut out of its index range, a look visits only the
// pending rows below the batch's highest id that the claim passed over:
// none for a relay that owns every partition and has nothing held (2
// pages after a claim of 2,000 rows, with or without statistics:
// TestMySQLClaimCostFlat); other relays' rows when it owns a share (a
// review measured 2.2 ms against the claim's 5.3 ms with 4 of 32
// partitions) and rows held behind a dead letter or a retry (57 ms
// against 83 ms with three quarters of 100,000 pending rows held). Each
// look has a QueryTimeout of its own. TestMySQLClaimTakesRowsCommittedBelowIt makes
// the view that misses an earlier row on demand. A locking read (SKIP
// LOCKED at READ COMMITTED, which reads the latest committed row and
// skips uncommitted ones) was the other candidate: it needs a
// transaction of four statements per claim and skips a pending row that
// an operator is dead-lettering, handing out the rows it holds.
//
// # Outcomes
//
//   - Acknowledged: marked sent (its entry deleted from the pending set,
//     the lease fence read once for the statement on PostgreSQL and
//     SQLite) with one statement per batch (on MySQL/MariaDB one per 500
//     ids), in the background while the next batch is claimed and
//     published; messages that had failed before are marked with an
//     UPDATE first (status 1). On PostgreSQL that statement commits with
//     synchronous_commit off (for its own transaction only): a server
//     crash can lose the last marks (about 3 x wal_writer_delay), whose
//     messages are then sent again, and the relay's loop never waits for a
//     WAL flush. (The exactly-once mode marks durably: see below.)
//   - A per-message failure (PublishErrors): the aggregate's first failed
//     message counts an attempt and gets next_retry_at = database now +
//     backoff (RetryInitial x 2^(attempt-1), jittered, capped at RetryMax;
//     defaults 2, 4, 8, 16, 32 s from the seed). Later messages of the same
//     aggregate in the batch stay pending without an attempt.
//   - After MaxAttempts (default 6: the first try plus 5 retries), or at
//     once for errors wrapping ErrPermanent: dead-lettered (status 2, last
//     error kept, next_retry_at "never"), OnDeadLetter is called, and with
//     HoldAggregate (the default) the aggregate stays held until an operator
//     retries or skips it (DeadLetters); with SkipDead it moves on.
//   - Errors wrapping ErrUnavailable (misconfiguration: authorization,
//     unknown topic): no attempt is counted, OnUnavailable is called, and
//     the relay backs off as a whole. A configuration mistake never
//     dead-letters the backlog. An event whose route will never exist (a
//     mistyped Topic) stays pending until an operator dead-letters it
//     (DeadLetters.ListPending, then DeadLetterPending on the ids shown),
//     or, with Config.DeadLetterUnroutableAfter, until its route has been
//     refused that long while the broker acknowledged other routes.
//   - The whole batch failed (broker unreachable, timeout): nothing is
//     recorded; the relay backs off as a whole (exponential, 100 ms to
//     30 s) and re-sends later. No attempt is burned by an outage.
//
// # Writing a Publisher
//
// A Publisher for a broker that does not keep one aggregate's messages in
// order by itself (no Kafka-like in-partition ordering with idempotence)
// can leave everything but "send one message and wait for its
// acknowledgement" to PublishInOrder, as relay/nats, relay/rabbitmq and
// relay/redis do: it sends each aggregate's messages one after another in
// batch order (aggregates concurrently, up to a limit), holds back an
// aggregate's later messages once one failed (ErrHeldBack), stops the
// batch for a send error wrapping a *BatchError (connection lost,
// acknowledgement timed out, ctx done), failing what was not
// acknowledged with it (no attempt counted), turns a batch in which
// every message's route is unavailable into one error wrapping
// ErrUnavailable, and returns PublishErrors otherwise. EachAggregate is
// the fan-out alone, for a publisher that needs its own loop.
//
// # Locks
//
// No relay statement waits on the lock of a row outside its own work. The
// claim is a plain read (no FOR UPDATE: leases, not row locks, keep
// instances apart), so it never waits. Every outcome write (mark sent,
// retry, dead, DeleteOnPublish), retention's archive and delete, and
// DeadLetters' Retry and Skip (after a plain read of the matching ids)
// reach their rows by primary key only (on MySQL/MariaDB FORCE INDEX (PRIMARY),
// at most 500 ids per DELETE or INSERT ... SELECT), so they lock exactly
// those rows: a writer whose transaction has INSERTed its rows but not
// completed its COMMIT (a slow flush, a network stall, a paused client)
// holds up only its own events. MariaDB left to itself scanned the whole
// PRIMARY index for a mark-sent of a few hundred ids and, under REPEATABLE
// READ, waited on that writer's row; the loop waited with it
// (TestHeldCommitDoesNotStallRelay, TestRelayWritesReadOnlyTheirRows).
// SQLite has one writer at a time: a held commit holds the write lock, and
// the relay's writes (and, with the recommended one shared connection,
// everything) wait for it.
//
// On MySQL/MariaDB lease writes change one lease row per statement, by
// primary key: the heartbeat renews each owned partition separately
// (Dialect.RenewsLeasesOneByOne; PostgreSQL's fence is a plain read and
// SQLite has one writer, so one statement renews all of an instance's
// leases there). Under REPEATABLE READ
// the fence of an outcome write holds shared locks on the lease rows of
// its rows' partitions, in its rows' order; a renewal of all of an
// instance's leases in one statement locked every lease row in key order
// and deadlocked with it (TestNoDeadlocksAcrossLeaseHandovers checks the
// server's deadlock counter across lease handovers).
//
// # Crashes
//
// Claiming writes nothing: there is no "in flight" state in the table that
// a crash could leave behind. A relay killed between the broker's
// acknowledgement and mark-sent re-sends what it had not marked: at most
// two batches, because marking one batch sent overlaps publishing the
// next, so at most 2 x MaxBatchSize messages (a batch claimed ahead is not
// published before the batch before it is acknowledged and its mark
// started, so it adds none). Duplicates carry the same message ID.
//
// # Exactly once: publishers that reconcile
//
// A Publisher that is a Reconciler (relay/kafka with ExactlyOnce; the
// relay finds it through PublisherWrapper wrappers too) removes those
// duplicates. Its broker records, atomically with each publish of a relay
// partition, which outbox rows the publish carried, and Reconcile fences
// the partition's earlier publishers at the broker. The relay reconciles
// a partition before its first claim under each lease epoch (so acquiring
// a lease also fences the previous owner, frozen or not) and again after
// any outcome of its own it did not learn (ErrOutcomeUnknown, a mark-sent
// that failed); it marks the ids Reconcile returns sent and claims nothing
// from the partition until that succeeded. The broker keeps only the last
// publish's record per partition: a Reconciler that is also a Pipeliner
// (relay/kafka's) records the batch before as well, whose mark-sent is
// still running (Carry), so the relay marks one batch while it publishes
// the next, as at least once; otherwise it marks each batch before it
// claims the next. In this mode marks commit durably (on PostgreSQL not
// with synchronous_commit off): a mark the relay saw succeed is no longer
// in any manifest, so a database crash must not undo it
// (TestExactlyOnceDatabaseCrash). Per-message outcomes add ErrAborted (not
// delivered because its transaction was aborted for another message: no
// attempt, no hold) and ErrFenced. A TransactionObserver hears each
// transaction's outcome.
//
// # Stopping
//
// Cancelling Run's context or calling Stop stops claiming; the in-flight
// batch finishes (bounded by PublishTimeout) and its outcomes are recorded,
// including the background mark-sent of the batch before; Run then returns
// nil. A graceful stop therefore causes no duplicates. Stop's own context bounds the wait: when it ends,
// in-flight work is cancelled and its rows stay pending.
//
// # Several instances: partition leases
//
// Every row carries a relay partition (partition.Of of its aggregate, over
// the count stored in the table, 32 by default), fixed when it is written. Each
// relay instance leases a share of the partitions in <table>_lease and
// claims only rows of partitions it holds; one aggregate lives in one
// partition, so its events are only ever published by one instance at a
// time, in id order, while partitions run in parallel.
//
// Membership and balance. Every LeaseHeartbeat (LeaseTTL/4, 2.5 s by
// default) an instance upserts its row in <table>_relay (expiring after
// LeaseTTL by the database clock, and carrying its delivery mode: see
// ErrModeMismatch; once a minute it also deletes the rows expired for
// longer than MemberPruneAfter LeaseTTLs, killed relays'), renews its
// leases, counts the live
// instances L and aims for ceil(N/L) partitions: it takes free or expired
// partitions up to that share, in one statement and one commit (a relay
// starting beside busy writers used to commit once per partition before
// its first claim; on MySQL/MariaDB a SELECT ... FOR UPDATE SKIP LOCKED
// first locks the free rows nobody else holds, so the transaction never
// waits while it holds a lease row, the wait that would close a deadlock
// with the mark-sent fence's shared locks; renewals there go one partition
// per statement for the same reason), and hands the excess back. A partition is
// handed back only after the instance's in-flight work on it is recorded
// (the loop releases it between batches), so the next owner starts exactly
// where it stopped.
//
// The state of one lease, per partition:
//
//	free --acquire (epoch+1, expires = now+TTL)--> owned
//	owned --renew every heartbeat--> owned
//	owned --excess, after in-flight work is recorded--> free (released)
//	owned --no renewal for LeaseTTL (crash, pause, partition)--> expired
//	expired --acquire by anyone (epoch+1)--> owned
//
// Rebalancing bounds: an instance that joins gets its share within about
// two heartbeats (the others see it at their next heartbeat and release;
// it acquires at its next); a graceful stop releases at once and the others
// take over within one heartbeat; a crashed or frozen instance's partitions
// are taken over within LeaseTTL plus one heartbeat (12.5 s by default).
//
// Fencing. Every acquisition raises the partition's epoch, the fencing
// token; records carry it (and the partition) in headers so ownership can
// be audited from the broker. Every outcome write (mark sent, retry, dead)
// is conditioned on the lease still belonging to the writer and being
// unexpired by the database clock: a stale owner's results are rejected.
// The trust window bounds what a live but slow or frozen owner does: an
// instance trusts its leases only until heartbeat start + LeaseTTL*4/5 by
// its monotonic clock, claims nothing after that, and gives Publish only
// the time left in the window. A process frozen between handing a batch to
// the Kafka client and the bytes reaching the broker can still deliver
// that batch late; because each instance keeps one batch in flight and a
// batch is contiguous in each aggregate's pending sequence, such a late
// batch can only repeat or continue each aggregate's sequence in id order:
// its records are duplicates of what the new owner already sent, or first
// deliveries the new owner had not reached yet (those carry the older
// epoch), at most one batch (MaxBatchSize) of them, and never a first
// delivery out of order. (Kafka transactions would fence at the broker
// too, at the cost of several round trips per batch; the database fence
// and the trust window are measured sufficient in TestScaleOut.)
//
// Changing the partition count needs a drain barrier: see Repartition, the
// only way to change it.
//
// # Partition mismatches
//
// Run refuses to start (ErrPartitionMismatch) when the stored count
// differs from driver.Config.Partitions of the relay's Outbox (when set),
// when the lease table has rows but not one per stored partition, or when
// pending rows sit in partitions outside 0..count-1 (no relay can own
// them: a writer was told another count). A relay creates the lease rows
// only in an empty lease table; it never resizes it. While running it
// compares the stored count and the lease table at every lease heartbeat
// (one query) and counts out-of-range pending rows every
// PartitionCheckInterval (default 30 s; it reads every pending row once,
// as a stats scrape does). A mismatch found while running does not stop
// the relay (the partitions it owns keep flowing): it is logged at ERROR
// (again every PartitionCheckInterval while it lasts), reported to an
// Observer that implements PartitionObserver (metrics.RelayMetrics:
// outbox_relay_partition_mismatch) and returned by Ready, until a check
// finds the partitions consistent again.
//
// # Readiness, liveness and progress
//
// Ready is nil while the relay relays; it fails (ErrUnhealthy) once the
// database pings, the broker checks (a Publisher that implements the
// optional HealthChecker, as relay/kafka's does) or the relay's own
// cycles have been failing, with no success in between, for longer than
// Config.UnhealthyAfter (default 10 s), so one failed batch never makes
// a relay unready. The probes run every Config.HealthInterval (2 s), also
// while the relay is idle, and the first success clears the failure (a
// loop backing off after an outage then retries at once). Live fails
// (ErrStalled) only when one cycle has run longer than
// Config.StallTimeout (3 min): a stuck loop, never a database or broker
// outage, which make cycles fail and back off, not hang. An Observer that
// implements ReadinessObserver hears every change of Ready between nil
// and an error (metrics.RelayMetrics: outbox_relay_up). While the relay
// has work it logs a progress line every Config.ProgressInterval (10 s):
// published since the last line, backlog and oldest pending age (one
// query reading the pending rows once); idle, it logs nothing.
//
// # Errors that end Run
//
// Run returns only after a stop, or with an error at start (unsupported
// server, schema missing or outdated, partition mismatch) or ErrStopped.
// Every such error is logged at ERROR before Run returns; check it all the
// same:
//
//	errc := make(chan error, 1)
//	go func() { errc <- r.Run(ctx) }()
//	...
//	if err := <-errc; err != nil { ... } // the relay is not relaying
//
// # Waking relays in other processes
//
// The post-commit signal reaches relays in the writing process. On
// PostgreSQL the writing process's driver also sends a NOTIFY on the
// table's channel after each COMMIT that wrote events has returned (from a
// connection of its own, outside the writers' transactions, coalescing
// the commits that return while one is in flight: see driver.Config's
// DisableNotify), and ListenPostgres, on a connection of its own, turns it
// into Relay.Notify for relays elsewhere. On MySQL/MariaDB
// and SQLite the poll is adaptive: MinPollInterval after a cycle that found
// work, doubling to PollInterval when idle.
//
// # The WAL source (PostgreSQL)
//
// With Config.Source SourceWAL a relay also reads the table's committed
// inserts from a logical replication slot (pgoutput, a publication of the
// table, inserts only; github.com/jackc/pglogrepl speaks the protocol) and
// fills batches from that stream instead of claiming: the claim query and
// its walk of the pending set go, the outbox rows are not read back, and
// a relay in another process than the writers needs no NOTIFY. The table
// stays the source of truth. Each batch from the stream is checked in one
// statement (walclaim.go): a row goes out only while it is pending, in a
// partition this relay holds, and no earlier event of its aggregate is
// failed and unsent; the relay claims from the table at start, after a
// gap in the stream (a reconnection), when it acquires a partition, when
// the check refuses a row for its aggregate's sake, after a dead letter
// is retried (the floor epoch), after a failed cycle, and every
// PollInterval, each time until a claim comes back short. So a stream
// that breaks, lags or is invalidated costs speed, never an event.
//
// The slot's position advances as the loop takes rows, never held back by
// a retry or a held aggregate (their rows are in the table), so one stuck
// aggregate does not make the server keep WAL. One relay reads the slot;
// the others stand by, claim their partitions from the table, and take
// the slot over when its reader goes; a reader whose relay's membership
// expired (a frozen or partitioned process whose replication connection
// stays open) is terminated with pg_terminate_backend. Publishing stays
// under the partition leases and their trust window, as with claims, so
// a frozen reader's in-flight batch is fenced as any relay's. Events of
// one aggregate go out in commit order, which is their id order when the
// application serialises an aggregate's transactions. docs/wal.md has
// the setup, the figures, the monitoring and the limits.
//
// In the log-only mode (driver.Config.LogOnly) the writers emit one
// transactional logical decoding message per transaction instead of rows,
// and the relay reading the slot publishes those events (ID 0) straight
// from the stream (walstate.go, walclaim.go's walLog). An event it cannot
// publish at once (a failure, an aggregate held by a failed or dead
// event, a partition another relay holds, a broker outage longer than
// WALConfig.SpillAfter) is written to the table and from there handled as
// a row, behind its aggregate's earlier rows. An event refused on its
// route (ErrUnavailable) waits there too, retried at each fallback poll,
// and the relay holds its aggregate's later stream events behind it in
// memory (the refusal sets no retry time for the database to show) while
// the other aggregates keep flowing from the stream. The slot's position moves
// only past events published or written; a cycle that fails before that
// restarts the stream at the slot's position. A slot dropped or
// invalidated while it may have held events is a loss nothing can undo:
// the relay records the window in <table>_wal_log, and every relay is not
// ready (ErrWALLoss) until an operator calls AckWALLoss.
//
// With a Reconciler publisher (the exactly-once mode) in the log-only mode,
// the relay reading the slot writes every event it takes from the stream
// to the table (one statement per batch, as any spill) and publishes
// nothing straight from the stream: a transaction's manifest names what it
// carried by outbox id, and a relay that takes a partition over must be
// able to reconcile it whether or not it reads the slot. The rows come
// back through the stream as inserts and go out as in table mode; the
// slot's position passes the events once the write committed. The writers
// keep the log-only commit (one WAL record, no row); the relay pays the
// row, its pending-set entry and its mark-sent, and the WAL carries each
// event twice (docs/wal.md, "Exactly once").
//
// # Tracing
//
// An Observer that also implements PublishObserver wraps each Publish
// call: StartPublish before it (its context is the one Publish gets), end
// with Publish's result right after. github.com/sqloutbox/outbox/otel
// implements it with one OpenTelemetry producer span per batch, linked to
// the span each message was emitted in (the trace context that
// driver.Config.Capture stored in the message's headers, which the
// publisher sends on unchanged). Without it the relay does one type
// assertion per batch.
//
// # Cost of an idle relay
//
// One claim per PollInterval, plus a lease heartbeat per LeaseHeartbeat
// (four short statements, on MySQL/MariaDB one renewal per owned partition
// instead of one, and the partition check's one), plus the count of out-of-range pending rows per
// PartitionCheckInterval, plus a database ping (and a broker metadata
// request, for a HealthChecker publisher) per HealthInterval.
package relay
