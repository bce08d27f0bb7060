package relay

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/logmsg"
	"github.com/sqloutbox/outbox/internal/sqlerr"
)

// How the loop uses the WAL source (Config.Source = SourceWAL).
//
// The loop is the polling relay's, with one more way to fill a batch.
// While r.tableDue is false, a cycle takes rows from the reader's buffer
// instead of claiming, and asks the database about them in one statement
// (wal_accept): each row is published only if it is still in the pending
// set, not in the batch being marked sent, in a relay partition this
// relay holds, and no event of its aggregate up to it has failed and
// not been sent (held_idx: a retry waiting, or a dead letter holding the
// aggregate). The same statement reads the table's floor epoch, which
// every change that makes old rows pending again raises (a dead letter
// retried, a row re-queued by hand).
//
// The loop claims from the table (r.tableDue) after anything the stream
// cannot vouch for: the start; a reconnection of the stream or rows it
// dropped (the buffer was full); a relay partition acquired or held at a
// new lease epoch since the last claim (the stream's rows of it were left
// to its owner before); a row the database
// did not accept for a reason other than "already sent"; a raised floor
// epoch; a failed cycle; the fallback poll (PollInterval after the last
// claim: retries come due in the table, not in the WAL). It claims until
// a claim comes back short, then returns to the stream. Before each
// claim it empties the buffer: what was committed before the claim's
// snapshot is claimed; what commits after is in the stream.
//
// Why that keeps the order of each aggregate: after a short claim, every
// pending row of this relay's partitions committed before the claim's
// snapshot was published, is held (a failed row of its aggregate: every
// later row of that aggregate is refused by the held_idx check), or is
// in the batch being marked. Every row committed after it arrives through
// the stream in commit order, and a gap in the stream sends the loop back
// to the table. A batch from the stream is published in id order; so
// events of one aggregate go out in commit order, which is their id order
// when the application serialises an aggregate's transactions (a row
// lock on the aggregate, as the seed recommends; the ids are drawn just
// before COMMIT). Two transactions that write one aggregate concurrently
// may go out in commit order where the table claim would have waited for
// the lower id (docs/wal.md).

var pgIdent = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkSource validates Config.Source and Config.WAL.
func checkSource(cfg Config, d *dialect.Dialect) error {
	switch cfg.Source {
	case SourceTable:
		return nil
	case SourceWAL:
	default:
		return fmt.Errorf("%w: unknown Source %d", ErrInvalidConfig, cfg.Source)
	}
	if d.Name() != dialect.Postgres {
		return fmt.Errorf("%w: SourceWAL needs PostgreSQL, not %s", ErrInvalidConfig, d.Name())
	}
	if cfg.WAL.DSN == "" {
		return fmt.Errorf("%w: SourceWAL needs WAL.DSN (the replication connection)", ErrInvalidConfig)
	}
	if _, err := pgconn.ParseConfig(cfg.WAL.DSN); err != nil {
		return fmt.Errorf("%w: WAL.DSN: %v", ErrInvalidConfig, redactPgError(err))
	}
	for what, name := range map[string]string{"WAL.Slot": cfg.WAL.Slot, "WAL.Publication": cfg.WAL.Publication} {
		if name != "" && !pgIdent.MatchString(name) {
			return fmt.Errorf("%w: %s %q: lower-case letters, digits and _, at most 63 bytes, not starting with a digit", ErrInvalidConfig, what, name)
		}
	}
	if cfg.WAL.Buffer < 1 || cfg.WAL.StatusInterval <= 0 {
		return fmt.Errorf("%w: WAL.Buffer %d and WAL.StatusInterval %s must be positive", ErrInvalidConfig, cfg.WAL.Buffer, cfg.WAL.StatusInterval)
	}
	return nil
}

// startWAL starts the WAL source's reader (SourceWAL); it returns the
// channel that signals buffered rows (nil without the source) and a
// function that stops the reader and waits for it.
func (r *Relay) startWAL(ctx context.Context) (<-chan struct{}, func()) {
	if r.cfg.Source != SourceWAL {
		return nil, func() {}
	}
	r.wal = newWALReader(r.cfg.WAL, r.table, r.d.QuotedTable(), r.cfg.InstanceID, r.log)
	r.wal.logPrefix = logmsg.Prefix(r.table)
	if r.ob.Config().LogOnly {
		r.wal.logState = &walLogState{table: r.d.WALLogTable(), log: r.log}
		r.wal.outage = func(o *walOutage) { r.walDown.Store(o) }
	}
	r.wal.fence = r.fenceSlotReader
	r.wal.observer, _ = r.cfg.Observer.(SourceObserver)
	r.wal.standbyWait = r.cfg.LeaseHeartbeat
	if hook := r.slotCheckHook; hook != nil {
		r.wal.check = func(ctx context.Context, q queryOne, slot, pub string) error {
			if err := hook(slot); err != nil {
				return unreadable(err)
			}
			return checkSlot(ctx, q, slot, pub)
		}
	}
	if r.unreadableAfter > 0 {
		r.wal.unreadable.after = r.unreadableAfter
	}
	r.wal.recreateHook = r.recreateHook
	if r.slotCreateSlow > 0 {
		r.wal.createSlow = r.slotCreateSlow
	}
	r.tableDue = true
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.wal.run(rctx) }()
	if r.wal.logState != nil {
		wg.Add(1)
		go func() { defer wg.Done(); r.runLogState(rctx) }()
	}
	if lo, ok := r.cfg.Observer.(WALLagObserver); ok {
		wg.Add(1)
		go func() { defer wg.Done(); r.sampleWALLag(rctx, lo) }()
	}
	return r.wal.signal, func() { cancel(); wg.Wait() }
}

// sampleWALLag reports the slot's position to o every HealthInterval
// while this relay's stream is open (a standby reports nothing: the
// reading relay does). A failed sample is logged at DEBUG and skipped.
func (r *Relay) sampleWALLag(ctx context.Context, o WALLagObserver) {
	t := time.NewTicker(r.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		delay, slot, streaming := r.wal.lagState()
		if !streaming {
			continue
		}
		lag, err := r.readWALLag(ctx, slot)
		if err != nil {
			r.log.Debug("WAL source: reading the slot's position failed", "slot", slot, "error", err)
			continue
		}
		lag.DecodeDelay = delay
		o.WALLag(lag)
	}
}

// readWALLag reads the slot's positions from pg_replication_slots.
func (r *Relay) readWALLag(ctx context.Context, slot string) (WALLag, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var lag WALLag
	var confirmed string
	err := r.db.QueryRowContext(qctx, `SELECT confirmed_flush_lsn::text,
		    (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, (pg_current_wal_lsn() - restart_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NOT NULL`, slot).Scan(&confirmed, &lag.UnconfirmedBytes, &lag.RetainedBytes)
	if err != nil {
		return lag, fmt.Errorf("reading slot %s: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		return lag, fmt.Errorf("reading slot %s: %w", slot, err)
	}
	lag.ConfirmedLSN = uint64(lsn)
	return lag, nil
}

// fenceSlotReader terminates the walsender reading slot if its client is
// a relay (application_name "outbox-relay <instance>") with no unexpired
// membership row in this table's relay group: it missed its heartbeats
// for a lease TTL, so its leases have expired too and it publishes
// nothing (its trust window ended), but a frozen process keeps its
// replication connection open until the server's wal_sender_timeout. It
// also terminates a walsender of this relay's own instance: the relay
// calls it when its stream could not open the slot, so such a reader is a
// connection of its own that it gave up as dead (a silent network path)
// and that the server has not noticed yet. It returns the terminated
// reader's application_name, or "", and, if the reader is not an outbox
// relay (its application_name visible and without the relay's prefix:
// pg_recvlogical, another tool), a description of it, which it leaves
// alone. The role needs pg_signal_backend (or to be the reader's role,
// or superuser).
func (r *Relay) fenceSlotReader(ctx context.Context, slot string) (fenced, foreign string, err error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	// MATERIALIZED: the planner orders a WHERE clause's conditions by
	// cost, and would call pg_terminate_backend before the membership
	// check.
	err = r.db.QueryRowContext(qctx, `WITH expired AS MATERIALIZED (
		    SELECT a.pid, a.application_name FROM pg_replication_slots s
		    JOIN pg_stat_activity a ON a.pid = s.active_pid
		    WHERE s.slot_name = $1 AND a.application_name LIKE 'outbox-relay %'
		      AND (a.application_name = left('outbox-relay ' || $2, 63)
		           OR NOT EXISTS (SELECT 1 FROM `+r.d.MembersTable()+` m
		                          WHERE left('outbox-relay ' || m.instance_id, 63) = a.application_name AND m.expires_at > clock_timestamp())))
		SELECT application_name FROM expired WHERE pg_terminate_backend(pid)`, slot, r.cfg.InstanceID).Scan(&fenced)
	switch {
	case err == nil:
		return fenced, "", nil
	case !errors.Is(err, sql.ErrNoRows):
		return "", "", fmt.Errorf("fencing the reader of slot %s: %w", slot, err)
	}
	// A reader this relay did not terminate: another relay, or not a
	// relay at all. An application_name this role cannot see (a reader of
	// another role, without pg_read_all_stats) is taken for a relay's.
	var pid int64
	var app string
	err = r.db.QueryRowContext(qctx, `SELECT a.pid, COALESCE(a.application_name, '') FROM pg_replication_slots s
		JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&pid, &app)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", "", nil // released meanwhile
	case err != nil:
		return "", "", fmt.Errorf("reading the reader of slot %s: %w", slot, err)
	case app == "" || strings.HasPrefix(app, "outbox-relay "):
		return "", "", nil
	}
	return "", fmt.Sprintf("pid %d (application_name %q)", pid, app), nil
}

// claimTable makes the next cycle claim from the table, for reason (logged
// at DEBUG when the relay was using the stream).
func (r *Relay) claimTable(reason string) {
	if r.wal != nil && !r.tableDue {
		r.log.Debug("WAL source: claiming from the table", "reason", reason)
	}
	r.tableDue = true
	r.onStream.Store(false)
}

// pollDue makes the next cycle claim from the table if the last claim is
// PollInterval old (the WAL source's fallback poll).
func (r *Relay) pollDue() {
	if r.wal != nil && time.Since(r.lastTableClaim) >= r.cfg.PollInterval {
		r.claimTable("fallback poll")
	}
}

// next fills the cycle's batch: from the WAL source while it vouches for
// its rows, else by claiming from the table.
func (r *Relay) next(ctx context.Context, set leaseSet) ([]Message, error) {
	if r.wal == nil {
		msgs, err := r.claim(ctx, set)
		if so, ok := r.cfg.Observer.(SourceObserver); ok && len(msgs) > 0 {
			so.FromSource(SourceTable, len(msgs))
		}
		return msgs, err
	}
	if !r.tableDue {
		msgs, err := r.walClaim(ctx, set)
		if err != nil || len(msgs) > 0 || !r.tableDue {
			return msgs, err
		}
	}
	if r.wal.logPrefix != "" && r.cfg.WAL.SpillAfter > 0 && r.health.failingFor(&r.health.cycles, time.Now()) >= r.cfg.WAL.SpillAfter {
		if err := r.spillStream(ctx, set); err != nil {
			return nil, err
		}
	}
	// The claim covers a gap in the stream that came before it: what was
	// committed before the claim's snapshot is claimed, the rest is in
	// the stream after the gap. (A gap is a restart of the stream, which
	// resumes at the slot's confirmed position, at least 100 ms after the
	// loss; what was committed before that position is visible to this
	// claim.) The rows buffered stay, and are checked like any other.
	if r.wal.takeSkipped() {
		// The stream left rows of a transaction it decoded a moment ago
		// to this claim (skipGap): their commit must be visible to it,
		// or they would wait for the next poll while later events of
		// their aggregates went out from the stream.
		if err := waitVisible(ctx, dbQuery(r.db)); err != nil {
			return nil, err
		}
	}
	streaming := r.wal.coverGap()
	limit := r.batch
	epochBefore := r.floor.epoch
	msgs, err := r.claim(ctx, set)
	if err != nil {
		return nil, err
	}
	r.claimedAll, r.fromTable = len(msgs) < limit, true
	r.lastTableClaim = time.Now()
	r.walClaimed.Add(int64(len(msgs)))
	if so, ok := r.cfg.Observer.(SourceObserver); ok && len(msgs) > 0 {
		so.FromSource(SourceTable, len(msgs))
	}
	// Back to the stream only after a short claim under an unchanged
	// floor epoch: the claim function reads the epoch in another
	// statement than the rows, so a claim that reports a new epoch may
	// not have seen the rows made pending with it (a dead letter
	// retried); the next claim walks from the start under the new one.
	if len(msgs) < limit && streaming && r.floor.epoch == epochBefore {
		r.tableDue = false
		r.onStream.Store(true)
		r.walEpoch = r.floor.epoch
		r.walLeases = maps.Clone(set.epochs)
		// Rows may wait in the buffer since before this claim, and a full
		// buffer signals nothing more (its reader waits for room): the
		// loop takes them at once instead of waiting for the next poll,
		// which would send it back to the table (log-only mode: a relay
		// that found a backlog never returned to the stream).
		r.wal.wake()
	}
	return msgs, nil
}

// walClaim takes up to a batch of rows from the WAL source and returns
// those the database accepts (see the comment at the top of this file).
// It sets r.tableDue when the rows cannot be vouched for.
func (r *Relay) walClaim(ctx context.Context, set leaseSet) ([]Message, error) {
	for p := range r.walLeases {
		if _, ok := set.epochs[p]; !ok {
			// Out of this cycle's set (given up, lost, or left out by the
			// exactly-once mode's reconcile for now): its events of this
			// cycle go to the table; when it is back, even under the same
			// epoch, the table is claimed first (below).
			delete(r.walLeases, p)
		}
	}
	for p, e := range set.epochs {
		if r.walLeases[p] != e {
			// A partition taken since the last claim: rows of it the
			// stream delivered before were left to its owner then, and
			// are pending in the table.
			r.claimTable("partition acquired")
			return nil, nil
		}
	}
	all, gap, streaming := r.wal.take(r.batch)
	if gap || !streaming {
		rows := all
		// Claim first; the rows taken stay buffered and are checked after
		// the claim (one decoded from a commit the claim's snapshot does
		// not show yet would otherwise wait for the next poll, while a
		// later event of its aggregate went out from the stream).
		r.wal.putBack(rows)
		r.claimTable("stream gap or closed")
		return nil, nil
	}
	if len(all) == 0 {
		return nil, nil
	}
	// Events of logical decoding messages (log-only mode) are in no table:
	// judged apart (walLog), after the rows.
	nlog := 0
	for i := range all {
		if all[i].log {
			nlog++
		}
	}
	rows, logRows := all, []walRow(nil)
	switch nlog {
	case 0:
	case len(all):
		rows, logRows = nil, all
	default:
		rows, logRows = make([]walRow, 0, len(all)-nlog), make([]walRow, 0, nlog)
		for i := range all {
			if all[i].log {
				logRows = append(logRows, all[i])
			} else {
				rows = append(rows, all[i])
			}
		}
	}
	giveBack := func() {
		// The rows are left to the table claim; the log events wait in
		// the buffer for the stream's next turn.
		if len(logRows) > 0 {
			r.wal.putBack(logRows)
		}
	}
	marking := map[int64]bool{}
	if r.marking != nil {
		for _, id := range r.marking.ids {
			marking[id] = true
		}
	}
	cand := make([]Message, 0, len(rows))
	seen := make(map[int64]bool, len(rows))
	for _, w := range rows {
		m := w.msg
		if _, ok := set.epochs[m.Partition]; !ok || seen[m.ID] {
			continue // another relay's partition (it claims the row), or twice in the batch
		}
		if marking[m.ID] || r.sent.has(m.ID) {
			// Published by this relay and being marked, or marked sent by
			// it (claimed from the table before the stream brought its
			// insert, or a log-only event it wrote and published): not
			// pending, so not worth a probe.
			r.walKnownSent.Add(1)
			continue
		}
		seen[m.ID] = true
		m.Epoch = set.epochs[m.Partition]
		m.Age = w.age + time.Since(w.at)
		cand = append(cand, m)
	}
	taken := len(all)
	r.batch = nextBatch(r.cfg, r.batch, taken, 0)
	if len(cand) == 0 {
		return r.walLog(ctx, set, logRows, nil)
	}
	slices.SortFunc(cand, func(a, b Message) int { return cmpInt64(a.ID, b.ID) })
	xidOf := make(map[int64]uint32, len(rows))
	for _, w := range rows {
		xidOf[w.msg.ID] = w.xid
	}
	ids := make([]int64, len(cand))
	types := make([]string, len(cand))
	aggs := make([]string, len(cand))
	xids := make([]int64, len(cand))
	for i := range cand {
		ids[i], types[i], aggs[i], xids[i] = cand[i].ID, cand[i].AggregateType, cand[i].AggregateID, int64(xidOf[cand[i].ID])
	}
	r.walChecked.Add(int64(len(ids)))
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	failed := func(err error) ([]Message, error) {
		// Nothing of the batch is judged: the rows are left to the table
		// claim, the events of messages go back to the buffer (until
		// then the reader confirms nothing past them), so that none is
		// dropped. (An aggregate written both as rows and as messages may
		// then go out of commit order, as after any gap: docs/wal.md,
		// "Switching writers between the modes".)
		giveBack()
		r.claimTable("the check of rows from the WAL failed")
		return nil, err
	}
	res, err := r.walAccept(qctx, dialect.IDArray(ids), dialect.TextArray(types), dialect.TextArray(aggs), dialect.IDArray(xids))
	if err != nil {
		return failed(fmt.Errorf("checking %d rows from the WAL against %s: %w", len(ids), r.table, err))
	}
	defer res.Close()
	verdict := make(map[int64]int, len(ids))
	var epoch int64
	for res.Next() {
		var id int64
		var v int
		if err := res.Scan(&id, &v, &epoch); err != nil {
			return failed(fmt.Errorf("checking rows from the WAL: %w", err))
		}
		verdict[id] = v
	}
	if err := res.Err(); err != nil {
		return failed(fmt.Errorf("checking rows from the WAL: %w", err))
	}
	if epoch != r.walEpoch {
		// Rows were made pending again below the stream (a dead letter
		// retried): they go out first, from the table.
		giveBack()
		r.claimTable("floor epoch raised")
		return nil, nil
	}
	for _, v := range verdict {
		if v == walNotVisible {
			// Decoded from a commit record that this snapshot does not
			// show committed yet (the committing backend had not left
			// the process array): judged again in a moment, with the
			// rows after it.
			r.wal.putBack(all)
			r.batch = r.cfg.BatchSize
			time.AfterFunc(time.Millisecond, r.wal.wake)
			return nil, nil
		}
	}
	out := cand[:0]
	var held map[aggregateKey]bool
	for _, m := range cand {
		v := verdict[m.ID]
		if v == walAccepted && r.tableHeld[aggregateKey{m.AggregateType, m.AggregateID}] {
			v = walHeld // an earlier event of it was refused on its route and waits in the table
		}
		switch v {
		case walAccepted:
			out = append(out, m)
		case walHeld:
			r.claimTable("aggregate held") // the table claim holds or retries its aggregate
			if held == nil {
				held = map[aggregateKey]bool{}
			}
			held[aggregateKey{m.AggregateType, m.AggregateID}] = true
		}
	}
	r.walPublished.Add(int64(len(out)))
	if so, ok := r.cfg.Observer.(SourceObserver); ok && len(out) > 0 {
		so.FromSource(SourceWAL, len(out))
	}
	if len(logRows) == 0 {
		return out, nil
	}
	logOut, err := r.walLog(ctx, set, logRows, held)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 || len(logOut) == 0 {
		return append(out, logOut...), nil
	}
	// Rows and events of messages in one batch (writers switching modes,
	// or rows the relay wrote): in the stream's order, which is commit
	// order, so that an aggregate written both ways keeps its order.
	pos := make(map[string]int, len(all))
	for i, w := range all {
		pos[w.msg.MessageID] = i
	}
	merged := append(out, logOut...)
	slices.SortStableFunc(merged, func(a, b Message) int { return pos[a.MessageID] - pos[b.MessageID] })
	return merged, nil
}

// walLog judges the events of logical decoding messages taken from the
// stream (log-only mode), in commit order: it returns those to publish
// now, after writing to the table (spill) those that must wait: an event
// of a relay partition this relay does not hold (its owner claims it), of
// an aggregate whose earlier event failed and was not sent (held_idx: a
// retry waiting, a dead letter holding it; or refused in this batch,
// held), and every later event of such an aggregate. One statement asks
// the database about the batch's aggregates (log_held) and reads the
// floor epoch; a raised epoch gives the events back to the buffer and
// sends the loop to the table first. It sets r.logTaken: the cycle's end
// settles the slot's position once every event returned is published or
// written to the table, or rewinds the stream.
func (r *Relay) walLog(ctx context.Context, set leaseSet, rows []walRow, held map[aggregateKey]bool) ([]Message, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	r.logTaken = true
	if r.wal.logState == nil && !r.logWarned {
		r.logWarned = true
		r.log.Warn("WAL source: the writers use the log-only mode, this relay's Outbox does not: set driver.Config.LogOnly (outbox relay --log-only) on the relays too, so that a lost slot is reported")
	}
	msgs := make([]Message, len(rows))
	var types, ids []string
	asked := map[aggregateKey]bool{}
	now := time.Now()
	for i := range rows {
		w := &rows[i]
		m := &msgs[i]
		*m = w.msg
		m.Age = w.age + now.Sub(w.at)
		m.Epoch = set.epochs[m.Partition]
		k := aggregateKey{m.AggregateType, m.AggregateID}
		if r.tableHeld[k] {
			if held == nil {
				held = map[aggregateKey]bool{}
			}
			held[k] = true // an earlier event of it was refused on its route and waits in the table
		}
		if _, ok := set.epochs[m.Partition]; ok && !asked[k] && !held[k] {
			asked[k] = true
			types, ids = append(types, k.typ), append(ids, k.id)
		}
	}
	if len(types) > 0 {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		res, err := r.db.QueryContext(qctx, r.d.Query("log_held"), dialect.TextArray(types), dialect.TextArray(ids))
		if err != nil {
			cancel()
			return nil, fmt.Errorf("checking %d aggregates of events from the WAL against %s: %w", len(types), r.table, err)
		}
		var epoch int64
		for res.Next() {
			var kind int
			var k aggregateKey
			var e int64
			if err := res.Scan(&kind, &k.typ, &k.id, &e); err != nil {
				res.Close()
				cancel()
				return nil, fmt.Errorf("checking events from the WAL: %w", err)
			}
			if kind == 0 {
				epoch = e
				continue
			}
			if held == nil {
				held = map[aggregateKey]bool{}
			}
			held[k] = true
		}
		err = res.Err()
		res.Close()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("checking events from the WAL: %w", err)
		}
		if epoch != r.walEpoch {
			r.wal.putBack(rows)
			r.logTaken = false
			r.claimTable("floor epoch raised")
			return nil, nil
		}
	}
	if r.rec != nil {
		return r.walLogRows(ctx, set, msgs, held)
	}
	var spill []int
	for i := range msgs {
		k := aggregateKey{msgs[i].AggregateType, msgs[i].AggregateID}
		if _, ok := set.epochs[msgs[i].Partition]; !ok || held[k] {
			spill = append(spill, i)
		}
		if held[k] {
			// Its rows wait in the table, behind the failed one. The table
			// is claimed next, so that they go out before the stream's next
			// events of the aggregate: the probe above sees only events
			// that failed, not these, and the failed one may be sent (its
			// retry published, its mark in flight) by the next batch.
			r.claimTable("aggregate held")
		}
	}
	out := msgs
	if len(spill) > 0 {
		out = make([]Message, 0, len(msgs)-len(spill))
		for i, k := 0, 0; i < len(msgs); i++ {
			if k < len(spill) && spill[k] == i {
				k++
				continue
			}
			out = append(out, msgs[i])
		}
	}
	if len(spill) > 0 {
		if err := r.spill(ctx, set, msgs, spill); err != nil {
			return nil, err
		}
		r.walSpilled.Add(int64(len(spill)))
	}
	if len(out) == 0 {
		r.logDone = true // every event is in the table
	}
	r.walPublished.Add(int64(len(out)))
	if so, ok := r.cfg.Observer.(SourceObserver); ok && len(out) > 0 {
		so.FromSource(SourceWAL, len(out))
	}
	return out, nil
}

// walLogRows is walLog in the exactly-once mode (a Reconciler publisher):
// a transaction's manifest names what it carried by outbox id, and a
// relay that takes a partition over must reconcile it whether or not it
// reads the slot, so every event is written to the table first (one
// statement, spill) and published as the row it became. The slot may then
// pass them whatever the publish's outcome (r.logDone): from here each is
// a row, retried, held and reconciled as table mode's. It returns the rows
// of this relay's partitions whose aggregate is not held. An event whose
// message ID was in the table already (read again after a relay stopped
// before the slot's position passed it) keeps ID 0: its row, and so its
// aggregate's later rows, go out from the table in id order (the loop
// claims next), not from this batch. The rows come back through the
// stream as inserts, where the check finds them sent or being marked.
func (r *Relay) walLogRows(ctx context.Context, set leaseSet, msgs []Message, held map[aggregateKey]bool) ([]Message, error) {
	if r.cfg.DeleteOnPublish {
		// An event read again (the slot's position not yet past it when a
		// relay stopped) is recognised by its row; deleted rows would let
		// it be written and published a second time. New refuses the
		// pair when the relay's Outbox is log-only; this is a relay whose
		// Outbox is not, beside log-only writers.
		return nil, fmt.Errorf("%w: events of logical decoding messages (log-only writers) with the exactly-once mode and DeleteOnPublish: an event read again after a restart would be published twice; turn DeleteOnPublish off", ErrInvalidConfig)
	}
	idx := make([]int, len(msgs))
	for i := range idx {
		idx[i] = i
	}
	if err := r.spill(ctx, set, msgs, idx); err != nil {
		return nil, err
	}
	r.walSpilled.Add(int64(len(msgs)))
	r.logDone = true // every event is in the table
	again := map[aggregateKey]bool{}
	seen := make(map[int64]bool, len(msgs))
	for i := range msgs {
		if msgs[i].ID == 0 || seen[msgs[i].ID] { // seen: a message ID twice in the batch, one row
			msgs[i].ID = 0
			again[aggregateKey{msgs[i].AggregateType, msgs[i].AggregateID}] = true
		}
		seen[msgs[i].ID] = true
	}
	if len(again) > 0 {
		r.claimTable("events read again")
	}
	out := make([]Message, 0, len(msgs))
	for _, m := range msgs {
		k := aggregateKey{m.AggregateType, m.AggregateID}
		if _, ok := set.epochs[m.Partition]; ok && !held[k] && !again[k] {
			out = append(out, m)
		}
		if held[k] {
			// Left in the table behind the failed event: claimed next,
			// before the stream's later events of the aggregate (see
			// walLog).
			r.claimTable("aggregate held")
		}
	}
	r.walPublished.Add(int64(len(out)))
	if so, ok := r.cfg.Observer.(SourceObserver); ok && len(out) > 0 {
		so.FromSource(SourceWAL, len(out))
	}
	return out, nil
}

// spill writes msgs[idx] (events of logical decoding messages, in commit
// order) to the table as pending rows (log_spill_fresh, or log_spill when
// a message ID is in the table already) and sets their IDs; an
// event whose message ID is in the table already (read again after the
// stream restarted, or an ID reused) keeps ID 0 and is logged. If one of
// them is in a relay partition another relay holds, that relay is woken
// (NOTIFY), as a writer's commit would.
func (r *Relay) spill(ctx context.Context, set leaseSet, msgs []Message, idx []int) error {
	n := len(idx)
	mids, types, aids, etypes, topics, ctypes, headers := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	parts := make([]int64, n)
	payloads := make([]string, n)
	others := false
	for j, i := range idx {
		m := &msgs[i]
		mids[j], types[j], aids[j], etypes[j], topics[j], ctypes[j] = m.MessageID, m.AggregateType, m.AggregateID, m.EventType, m.Topic, m.ContentType
		parts[j], payloads[j] = int64(m.Partition), hex.EncodeToString(m.Payload)
		if len(m.Headers) > 0 {
			h, err := json.Marshal(m.Headers)
			if err != nil {
				return fmt.Errorf("encoding headers of %s: %w", m.MessageID, err)
			}
			headers[j] = string(h)
		}
		if _, ok := set.epochs[m.Partition]; !ok {
			others = true
		}
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	args := []any{dialect.TextArray(mids), dialect.TextArray(types), dialect.TextArray(aids),
		dialect.TextArray(etypes), dialect.TextArray(topics), dialect.IDArray(parts), dialect.TextArray(ctypes), dialect.TextArray(payloads), dialect.TextArray(headers)}
	// Without ON CONFLICT first (a third cheaper: queries.sql); a message
	// ID already in the table (an event read again) fails it as a whole,
	// and log_spill leaves such events out.
	got, err := r.spillRows(qctx, "log_spill_fresh", n, args)
	if err != nil && sqlerr.UniqueViolation(err) {
		got, err = r.spillRows(qctx, "log_spill", n, args)
	}
	if err != nil {
		return fmt.Errorf("writing %d events from the WAL to %s: %w", n, r.table, err)
	}
	for _, i := range idx {
		id, ok := got[msgs[i].MessageID]
		if !ok {
			r.log.Debug("log-only mode: an event's message ID is in the table already; not written again (an event read again after the stream restarted, or an ID reused: IDs must be unique)",
				"message_id", msgs[i].MessageID, "aggregate_type", msgs[i].AggregateType, "aggregate_id", msgs[i].AggregateID)
			continue
		}
		msgs[i].ID = id
	}
	if others {
		if _, err := r.db.ExecContext(qctx, "SELECT pg_notify($1, '')", r.d.Channel()); err != nil {
			r.log.Debug("log-only mode: waking the other relays failed (they find the rows at their next poll)", "error", err)
		}
	}
	return nil
}

// spillRows runs the spill statement query with args and returns the
// message ID to outbox id of each row it wrote (n events asked).
func (r *Relay) spillRows(ctx context.Context, query string, n int, args []any) (map[string]int64, error) {
	res, err := r.db.QueryContext(ctx, r.d.Query(query), args...)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	got := make(map[string]int64, n)
	for res.Next() {
		var id int64
		var mid string
		if err := res.Scan(&id, &mid); err != nil {
			return nil, err
		}
		got[mid] = id
	}
	return got, res.Err()
}

// spillStream moves what the stream has buffered to the table while the
// relay's cycles keep failing (WALConfig.SpillAfter): the events of
// logical decoding messages are written as pending rows (every relay
// partition: their owners claim them), in commit order; the rows of the
// table itself are dropped from the buffer (the claim that follows covers
// them). The slot's position then moves past them, and the reader reads
// on (up to 16 buffers a cycle). A write that fails rewinds the stream.
func (r *Relay) spillStream(ctx context.Context, set leaseSet) error {
	for range 16 {
		rows, _, _ := r.wal.take(r.cfg.WAL.Buffer)
		if len(rows) == 0 {
			return nil
		}
		var msgs []Message
		for _, w := range rows {
			if w.log {
				msgs = append(msgs, w.msg)
			}
		}
		if len(msgs) > 0 {
			idx := make([]int, len(msgs))
			for i := range idx {
				idx[i] = i
			}
			if err := r.spill(ctx, set, msgs, idx); err != nil {
				r.wal.rewind()
				return err
			}
			r.walSpilled.Add(int64(len(msgs)))
			r.log.Debug("WAL source: the relay keeps failing; events moved from the stream to the table", "events", len(msgs))
		}
		r.wal.settle()
	}
	return nil
}

// endLogCycle ends a cycle that took events of logical decoding messages:
// the slot's position may pass them if each was published or written to
// the table (r.logDone); otherwise the stream restarts before them.
func (r *Relay) endLogCycle() {
	if !r.logTaken {
		return
	}
	if r.logDone {
		r.wal.settle()
	} else {
		r.wal.rewind()
		r.claimTable("events from the WAL given back")
	}
	r.logTaken, r.logDone = false, false
}

// walAccept runs wal_accept on the loop's claim connection (claimconn.go),
// prepared there: unprepared, lib/pq sends a statement with arguments as
// Parse/Describe, waits, then Bind/Execute, and PostgreSQL plans it each
// time (1.2 ms cold); through the pool it also waited for a connection
// while a mark-sent held the other. On a pool with no room to pin the
// claim connection it runs prepared through the pool. A failure drops the
// session and the statement (they may be broken); the next check takes
// new ones.
func (r *Relay) walAccept(ctx context.Context, args ...any) (*sql.Rows, error) {
	conn, err := r.claimSession(ctx)
	if err != nil {
		return nil, err
	}
	q := r.d.Query("wal_accept")
	if r.walStmt == nil && !r.walNoPrep {
		var st *sql.Stmt
		if conn != nil {
			st, err = conn.PrepareContext(ctx, q)
		} else {
			st, err = r.db.PrepareContext(ctx, q)
		}
		if err != nil {
			r.walNoPrep = true // PgBouncer in transaction mode, say: run it unprepared
		} else {
			r.walStmt = st
		}
	}
	var rows *sql.Rows
	switch {
	case r.walStmt != nil:
		rows, err = r.walStmt.QueryContext(ctx, args...)
	case conn != nil:
		rows, err = conn.QueryContext(ctx, q, args...)
	default:
		rows, err = r.db.QueryContext(ctx, q, args...)
	}
	if err != nil {
		r.dropClaimSession()
	}
	return rows, err
}

// wal_accept's verdicts.
const (
	walSent     = 0 // not in the pending set (sent, dead-lettered, or being marked): dropped
	walHeld     = 1 // an event of its aggregate up to it failed and was not sent: left to the table claim
	walAccepted = 2
	// Not in the pending set, and its transaction not yet visible in the
	// statement's snapshot: a commit record is written, and so decoded,
	// before the committing backend leaves the process array.
	walNotVisible = 3
)

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// WALStatus describes the WAL source's replication slot and publication
// on the server (ReadWALStatus).
type WALStatus struct {
	// Slot and Publication are the names read (the defaults if the
	// WALConfig gave none).
	Slot, Publication string
	// SlotExists and PublicationExists report whether they exist.
	SlotExists, PublicationExists bool
	// Active reports whether a reader holds the slot, and Reader names it
	// (its application_name: "outbox-relay <instance ID>" for a relay;
	// "" if none or not visible to this role).
	Active bool
	Reader string
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved (past max_wal_size, kept by max_slot_wal_keep_size) or
	// lost (invalidated: the relay recreates the slot and claims from the
	// table meanwhile).
	WALStatus string
	// RetainedBytes is how much WAL the slot keeps the server from
	// removing: pg_current_wal_lsn() - restart_lsn, in bytes. It grows
	// while no relay reads the slot; alert on it (docs/wal.md).
	RetainedBytes int64
	// UnconfirmedBytes is pg_current_wal_lsn() - confirmed_flush_lsn: WAL
	// written since the position the reader last confirmed, in bytes.
	UnconfirmedBytes int64
	// Loss is the log-only mode's recorded loss window not yet
	// acknowledged (AckWALLoss), or nil.
	Loss *WALLoss
}

// ReadWALStatus reads the state of the WAL source's slot and publication
// for ob's table from db (any role that can read pg_replication_slots).
// It returns ErrInvalidConfig for an Outbox of another dialect, and
// database errors wrapped with context.
func ReadWALStatus(ctx context.Context, ob *driver.Outbox, db *sql.DB, cfg WALConfig) (WALStatus, error) {
	var st WALStatus
	slot, pub, err := walNames(ctx, ob, db, cfg)
	if err != nil {
		return st, err
	}
	st.Slot, st.Publication = slot, pub
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", pub).Scan(&st.PublicationExists); err != nil {
		return st, fmt.Errorf("outbox: reading publication %s: %w", pub, err)
	}
	var reader sql.NullString
	err = db.QueryRowContext(ctx, `SELECT s.active, a.application_name, COALESCE(s.wal_status, ''),
		       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
		       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1`, slot).Scan(&st.Active, &reader, &st.WALStatus, &st.RetainedBytes, &st.UnconfirmedBytes)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return st, fmt.Errorf("outbox: reading replication slot %s: %w", slot, err)
	default:
		st.SlotExists, st.Reader = true, reader.String
	}
	d, err := dialectOf(ob)
	if err != nil {
		return st, err
	}
	if st.Loss, err = readWALLoss(ctx, db, d.WALLogTable(), slot); err != nil {
		return st, fmt.Errorf("outbox: %w", err)
	}
	return st, nil
}

// walNames returns cfg's slot and publication names, or their defaults
// for ob's table in db's database.
func walNames(ctx context.Context, ob *driver.Outbox, db *sql.DB, cfg WALConfig) (slot, pub string, err error) {
	if ob == nil || db == nil {
		return "", "", fmt.Errorf("%w: a *driver.Outbox and a *sql.DB are required", ErrInvalidConfig)
	}
	if ob.Config().Dialect != driver.Postgres {
		return "", "", fmt.Errorf("%w: the WAL source needs PostgreSQL", ErrInvalidConfig)
	}
	for what, name := range map[string]string{"Slot": cfg.Slot, "Publication": cfg.Publication} {
		if name != "" && !pgIdent.MatchString(name) {
			return "", "", fmt.Errorf("%w: %s %q: lower-case letters, digits and _, at most 63 bytes, not starting with a digit", ErrInvalidConfig, what, name)
		}
	}
	slot, pub = cfg.Slot, cfg.Publication
	if slot == "" {
		var database string
		if err := db.QueryRowContext(ctx, "SELECT current_database()").Scan(&database); err != nil {
			return "", "", fmt.Errorf("outbox: reading the database name: %w", err)
		}
		slot = SlotName(database, ob.Config().Table)
	}
	if pub == "" {
		pub = PublicationName(ob.Config().Table)
	}
	return slot, pub, nil
}

// DropWAL removes what the WAL source created for ob's table on db's
// server: the replication slot (cfg.Slot, or the default for db's
// database) and the publication (cfg.Publication, or the default). Run it
// when a relay with SourceWAL is retired for good: a slot nobody reads
// keeps the server's WAL until the disk is full (or max_slot_wal_keep_size
// invalidates it). It fails, wrapping ErrWALUnavailable, while a reader
// holds the slot (stop the relays first). Missing objects are not an
// error. ErrInvalidConfig for an Outbox of another dialect.
func DropWAL(ctx context.Context, ob *driver.Outbox, db *sql.DB, cfg WALConfig) error {
	slot, pub, err := walNames(ctx, ob, db, cfg)
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot); err != nil {
		if sqlerr.PostgresCode(err) == "55006" { // object_in_use
			return fmt.Errorf("%w: slot %s is read by a running relay: stop it first (%v)", ErrWALUnavailable, slot, err)
		}
		return fmt.Errorf("outbox: dropping replication slot %s: %w", slot, err)
	}
	if _, err := db.ExecContext(ctx, "DROP PUBLICATION IF EXISTS "+pub); err != nil {
		return fmt.Errorf("outbox: dropping publication %s: %w", pub, err)
	}
	d, err := dialectOf(ob)
	if err != nil {
		return err
	}
	// The log-only mode's record of the slot: a slot retired on purpose
	// is no loss.
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", d.WALLogTable()).Scan(&exists); err != nil {
		return fmt.Errorf("outbox: looking for %s: %w", d.WALLogTable(), err)
	}
	if exists {
		if _, err := db.ExecContext(ctx, "DELETE FROM "+d.WALLogTable()+" WHERE slot_name = $1", slot); err != nil {
			return fmt.Errorf("outbox: forgetting slot %s in %s: %w", slot, d.WALLogTable(), err)
		}
	}
	return nil
}

// CreateWAL creates what the WAL source reads for ob's table on db's
// server, if missing: the publication (cfg.Publication or the default; the
// table's inserts only) and the logical replication slot (cfg.Slot or the
// default; pgoutput). A relay with SourceWAL creates both at its first
// start; CreateWAL lets an operator whose role owns the table create them
// ahead, so that the relays' role needs only REPLICATION and the table's
// privileges. A slot it creates where the log-only mode's state table
// (<table>_wal_log) has a record of one (the slot was dropped or lost
// since) is a loss window, recorded as a relay records one (relays are
// not ready until `outbox wal ack-loss`; ReadWALStatus shows it); a slot
// retired with DropWAL has no record. A slot it creates is read once
// (once the transactions running at its creation ended, up to 5 s) and
// created again, up to 3 slots in all, while PostgreSQL's decoder cannot
// read it (ErrSlotUnreadable; docs/wal.md, "A slot the server cannot
// read"); the window from the first such slot's start is then recorded
// as a loss with Reason WALLossUnreadableAtCreation, since log-only
// writers may have emitted into it: acknowledge it (AckWALLoss) if none
// ran. It returns the state afterwards (ReadWALStatus). Errors:
// ErrInvalidConfig for an Outbox of another dialect, a bad name, a slot of
// that name that is not a pgoutput slot of this database, or a publication
// of that name that does not publish the table's inserts; ErrWALUnavailable
// when the server refuses (wal_level is not logical, the role lacks
// REPLICATION or ownership of the table), with the server's error, and
// with ErrSlotUnreadable too when 3 slots in a row could not be read (the
// last is left in place: a relay recreates it if it still cannot read it).
func CreateWAL(ctx context.Context, ob *driver.Outbox, db *sql.DB, cfg WALConfig) (WALStatus, error) {
	slot, pub, err := walNames(ctx, ob, db, cfg)
	if err != nil {
		return WALStatus{}, err
	}
	d, err := dialectOf(ob)
	if err != nil {
		return WALStatus{}, err
	}
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", pub).Scan(&exists); err != nil {
		return WALStatus{}, fmt.Errorf("outbox: reading publication %s: %w", pub, err)
	}
	if !exists {
		_, err := db.ExecContext(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+d.QuotedTable()+" WITH (publish = 'insert')")
		if err != nil && sqlerr.PostgresCode(err) != "42710" { // created meanwhile
			return WALStatus{}, fmt.Errorf("%w: creating publication %s: %w", ErrWALUnavailable, pub, err)
		}
	}
	var inserts, hasTable, filtered bool
	if err := db.QueryRowContext(ctx, publicationCheck(pub, d.QuotedTable())).Scan(&inserts, &hasTable, &filtered); err != nil {
		return WALStatus{}, fmt.Errorf("outbox: reading publication %s: %w", pub, err)
	}
	if err := publicationProblem(pub, ob.Config().Table, inserts, hasTable, filtered); err != nil {
		return WALStatus{}, err
	}
	// The log-only mode's record of the slot (walstate.go), from its
	// creation on: writers may emit as soon as the slot exists.
	// Looked for first: CREATE TABLE IF NOT EXISTS needs CREATE on the
	// schema even when the table exists.
	var logExists bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", d.WALLogTable()).Scan(&logExists); err != nil {
		return WALStatus{}, fmt.Errorf("outbox: looking for %s: %w", d.WALLogTable(), err)
	}
	if !logExists {
		if _, err := db.ExecContext(ctx, walLogTableDDL(d.WALLogTable())); err != nil {
			return WALStatus{}, fmt.Errorf("%w: creating %s: %w", ErrWALUnavailable, d.WALLogTable(), err)
		}
	}
	var plugin string
	var here bool
	err = db.QueryRowContext(ctx, "SELECT COALESCE(plugin, ''), database IS NOT DISTINCT FROM current_database() FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&plugin, &here)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if err := createCheckedSlot(ctx, db, d.WALLogTable(), slot, pub); err != nil {
			return WALStatus{}, err
		}
	case err != nil:
		return WALStatus{}, fmt.Errorf("outbox: reading slot %s: %w", slot, err)
	case plugin != "pgoutput" || !here:
		return WALStatus{}, fmt.Errorf("%w: slot %s exists but is not a pgoutput slot of this database: name another WALConfig.Slot", ErrInvalidConfig, slot)
	default:
		// A slot that exists (made by a relay in table mode, say) gets
		// a row if it has none.
		if _, err := db.ExecContext(ctx, "INSERT INTO "+d.WALLogTable()+" (slot_name, confirmed_lsn) SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots "+
			"WHERE slot_name = $1 AND confirmed_flush_lsn IS NOT NULL ON CONFLICT (slot_name) DO NOTHING", slot); err != nil {
			return WALStatus{}, fmt.Errorf("outbox: recording slot %s in %s: %w", slot, d.WALLogTable(), err)
		}
	}
	return ReadWALStatus(ctx, ob, db, WALConfig{Slot: slot, Publication: pub})
}

// createCheckedSlot creates slot (pgoutput) and reads it once (checkSlot),
// creating it again while the server's decoder cannot read it, up to
// slotCreateAttempts slots. Each slot it creates is recorded in walLog
// (the log-only mode's state table) before it is read, as a relay
// records the slot it creates (walLogState.slotCreated): where walLog has
// a row for slot already (the slot existed and is gone), or for one
// dropped here as unreadable (log-only writers may have emitted into it),
// the window from the recorded position to the new start is recorded as
// a loss, whatever happens next. Errors wrap ErrWALUnavailable (and
// ErrSlotUnreadable after slotCreateAttempts unreadable slots, the last
// one left in place); another process creating the slot meanwhile is no
// error.
func createCheckedSlot(ctx context.Context, db *sql.DB, walLog, slot, pub string) error {
	reason := "missing (dropped)"
	for attempt := 1; ; attempt++ {
		var start string
		err := db.QueryRowContext(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", slot).Scan(&start)
		switch {
		case sqlerr.PostgresCode(err) == "42710": // created meanwhile
			return nil
		case err != nil:
			return fmt.Errorf("%w: creating slot %s: %w", ErrWALUnavailable, slot, err)
		}
		res, err := db.ExecContext(ctx, slotCreatedSQL(walLog, slot, reason, start))
		if n, rerr := rowsAffected(res, err); rerr == nil && n == 0 {
			_, err = db.ExecContext(ctx, slotFoundSQL(walLog, slot, start))
		} else {
			err = rerr
		}
		if err != nil {
			return fmt.Errorf("outbox: recording slot %s in %s: %w", slot, walLog, err)
		}
		if h := createWALCheckHook.Load(); h != nil {
			err = unreadable((*h)(slot))
		}
		if err == nil {
			err = checkSlot(ctx, dbQuery(db), slot, pub)
		}
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, ErrSlotUnreadable):
			return fmt.Errorf("%w: slot %s created: %w", ErrWALUnavailable, slot, err)
		case attempt == slotCreateAttempts:
			return fmt.Errorf("slot %s created %d times, unreadable each time: %w", slot, attempt, err)
		}
		if _, err := db.ExecContext(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
			return fmt.Errorf("%w: dropping the unreadable slot %s: %w", ErrWALUnavailable, slot, err)
		}
		reason = WALLossUnreadableAtCreation
	}
}

// createWALCheckHook, if set (tests), runs before createCheckedSlot reads
// a slot it created; its error stands for the read's (SQLSTATE XX000:
// the decoder's).
var createWALCheckHook atomic.Pointer[func(slot string) error]

// rowsAffected is res.RowsAffected after an ExecContext that returned err.
func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
