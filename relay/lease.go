package relay

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"
)

// Lease defaults.
const (
	// DefaultLeaseTTL is how long a partition lease lasts without renewal,
	// by the database clock.
	DefaultLeaseTTL = 10 * time.Second
	// MinLeaseTTL is the shortest LeaseTTL New accepts.
	MinLeaseTTL = 500 * time.Millisecond
)

// leaseSet is what the loop may work on: owned partitions (with their
// fencing epochs) and until when, by the host's monotonic clock, that
// ownership can be trusted.
type leaseSet struct {
	epochs       map[int]int64
	trustedUntil time.Time
}

// leases keeps this instance's share of the relay partitions: it
// heartbeats its membership, renews what it owns, takes free or expired
// partitions up to its fair share, and asks the loop to give up the excess
// (the loop releases a partition only after its in-flight work on it is
// recorded). See the package documentation for the state machine.
type leases struct {
	r          *Relay
	id         string
	partitions int
	ttl, beat  time.Duration
	mode       string // delivery mode stored in the membership row (modeOf)

	// pruned is when this instance last removed the membership rows
	// expired for longer than MemberPruneAfter LeaseTTLs (zero: not yet).
	pruned time.Time

	// conflict is the last other-mode instance a heartbeat saw ("" none),
	// so that the error is logged when it appears or changes.
	conflict string

	// op serializes a heartbeat round with a release by the loop: a
	// heartbeat that read the leases before a release must not write the
	// released partition back into owned.
	op sync.Mutex

	mu        sync.Mutex
	owned     map[int]int64
	trusted   time.Time
	toRelease map[int]bool
	changed   chan struct{} // signalled when partitions were acquired or trusted again after a lapse
	kick      chan struct{} // a heartbeat now, please: another relay released partitions or joined short (peers.go)

	// Catching up (run, heartbeat): while this instance owns fewer
	// partitions than its share and another one is expected to release
	// them, it beats every catchUpBeat instead of every beat, for at most
	// two beats after its share or the membership last changed.
	lastDeficit, lastLive int
	catchUpUntil          time.Time
	catchingUp            bool

	// short is how many partitions this instance lacked of its share
	// after its last heartbeat took what was free (0 while it releases).
	short int
}

// isShort reports whether the last heartbeat left this instance short of
// its share: the rest is owned by other relays, which give it up at their
// next heartbeat.
func (l *leases) isShort() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.short > 0
}

// catchUpBeat is the heartbeat interval of an instance catching up: a
// twentieth of beat, at least 50 ms (125 ms at the default LeaseTTL).
func (l *leases) catchUpBeat() time.Duration { return max(l.beat/20, 50*time.Millisecond) }

func newInstanceID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	if len(id) > 128 {
		id = id[len(id)-128:]
	}
	return id
}

func (l *leases) ttlMicros() int64 { return l.ttl.Microseconds() }

// start creates the lease rows if the lease table is empty (no relay ran
// on this table yet), and checks the stored count, the lease table and
// the pending rows against l.partitions. A lease table that has rows is
// never resized here: if it disagrees, start returns ErrPartitionMismatch
// (Repartition is the one way to change it).
func (l *leases) start(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, l.r.cfg.QueryTimeout)
	defer cancel()
	var rows int
	if err := l.r.db.QueryRowContext(qctx, "SELECT COUNT(*) FROM "+l.r.d.LeaseTable()).Scan(&rows); err != nil {
		return fmt.Errorf("counting lease rows: %w", err)
	}
	if rows == 0 {
		args := make([]any, l.partitions)
		for i := range args {
			args[i] = i
		}
		// Relays starting at once all insert the same rows; the
		// statement ignores the ones another inserted first.
		if _, err := l.r.db.ExecContext(qctx, l.r.d.LeaseInit(l.partitions), args...); err != nil {
			return fmt.Errorf("creating lease rows: %w", err)
		}
	}
	mismatch, err := l.r.inspectPartitions(ctx, l.partitions, true)
	if err != nil {
		return err
	}
	return mismatch
}

// census counts the live instances and returns one whose delivery mode
// differs from l.mode, as "instance (mode)" ("" if none).
func (l *leases) census(ctx context.Context) (live int, other string, err error) {
	var o sql.NullString
	if err := l.r.db.QueryRowContext(ctx, l.r.d.Lease("member_census"), l.mode).Scan(&live, &o); err != nil {
		return 0, "", fmt.Errorf("counting relay instances: %w", err)
	}
	return live, o.String, nil
}

// join registers this instance's membership with its delivery mode, then
// looks for a live instance in another mode: if there is one, it removes
// its own row again and returns ErrModeMismatch. Writing before reading
// makes two relays that start at once in different modes unable to both
// miss each other: each statement commits on its own, so whichever reads
// second sees the other's row (both may refuse).
func (l *leases) join(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, l.r.cfg.QueryTimeout)
	defer cancel()
	if _, err := l.r.db.ExecContext(qctx, l.r.d.Lease("member_beat"), l.id, l.ttlMicros(), l.mode); err != nil {
		return fmt.Errorf("membership heartbeat: %w", err)
	}
	_, other, err := l.census(qctx)
	if err != nil || other == "" {
		return err
	}
	if _, err := l.r.db.ExecContext(qctx, l.r.d.Lease("member_leave"), l.id); err != nil {
		l.r.log.Warn("leaving the relay group failed; the membership expires by itself", "error", err)
	}
	return fmt.Errorf("%w: this relay runs %q, live relay %s; stop every relay of table %s before changing the mode (a crashed relay's membership expires after LeaseTTL)",
		ErrModeMismatch, l.mode, other, l.r.table)
}

// snapshot returns what the loop may claim now, and the partitions it
// should release once its in-flight work is recorded.
func (l *leases) snapshot() (leaseSet, []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := leaseSet{epochs: make(map[int]int64, len(l.owned)), trustedUntil: l.trusted}
	var rel []int
	for p, e := range l.owned {
		if l.toRelease[p] {
			rel = append(rel, p)
			continue
		}
		set.epochs[p] = e
	}
	sort.Ints(rel)
	return set, rel
}

// released records that the loop gave partitions up, and reports the
// partitions still owned (Observer.Leases) at once: the relays taking them
// over may have them before this one's next heartbeat.
func (l *leases) released(ps []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ps {
		delete(l.owned, p)
		delete(l.toRelease, p)
	}
	l.r.cfg.Observer.Leases(len(l.owned))
}

// release gives partitions up in the database; the ones it could not
// release (they expire by themselves) are logged in one line.
func (l *leases) release(ctx context.Context, ps []int) {
	failed, err := l.releaseEach(ctx, ps)
	if err != nil {
		l.r.log.Warn("releasing partition leases failed; they expire by themselves", "partitions", failed, "error", err)
	}
	if len(failed) < len(ps) {
		l.announce(ctx)
	}
}

// releaseEach gives partitions up in the database, one statement each,
// and returns those it could not release with the first error (nil if
// all were released). It logs nothing: a closed pool fails every
// partition, and the caller says so once.
func (l *leases) releaseEach(ctx context.Context, ps []int) (failed []int, first error) {
	l.op.Lock()
	defer l.op.Unlock()
	for _, p := range ps {
		qctx, cancel := context.WithTimeout(ctx, l.r.cfg.QueryTimeout)
		_, err := l.r.db.ExecContext(qctx, l.r.d.Lease("lease_release"), p, l.id)
		cancel()
		if err != nil {
			failed = append(failed, p)
			if first == nil {
				first = err
			}
		}
	}
	l.released(ps)
	return failed, first
}

// MemberPruneAfter is how many LeaseTTLs a membership row (<table>_relay)
// may stay expired before a live relay deletes it: 10, 100 s at the
// default LeaseTTL. A relay that stops deletes its own row; one that was
// killed leaves it, expired, until then. Every relay prunes at its first
// heartbeat and then once a minute (memberPruneEvery).
const MemberPruneAfter = 10

// memberPruneEvery is how often a relay's heartbeat prunes expired
// membership rows.
const memberPruneEvery = time.Minute

// prune deletes the membership rows expired for longer than
// MemberPruneAfter LeaseTTLs, at most once per memberPruneEvery; a
// failure is logged, never returned (the rows are only clutter).
func (l *leases) prune(ctx context.Context) {
	now := time.Now()
	if !l.pruned.IsZero() && now.Sub(l.pruned) < memberPruneEvery {
		return
	}
	l.pruned = now
	res, err := l.r.db.ExecContext(ctx, l.r.d.Lease("member_prune"), MemberPruneAfter*l.ttlMicros())
	if err != nil {
		l.r.log.Warn("pruning expired relay memberships failed; the next heartbeat tries again in a minute", "error", err)
		return
	}
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		l.r.log.Info("pruned the membership rows of relays expired for longer than 10 lease TTLs", "rows", n, "after", (MemberPruneAfter * l.ttl).String())
	}
}

// heartbeat runs one round: membership, renewal, balancing.
func (l *leases) heartbeat(ctx context.Context) error {
	l.op.Lock()
	defer l.op.Unlock()
	qctx, cancel := context.WithTimeout(ctx, l.r.cfg.QueryTimeout)
	defer cancel()
	db, d := l.r.db, l.r.d
	started := time.Now() // the trust window starts before the renewal
	if _, err := db.ExecContext(qctx, d.Lease("member_beat"), l.id, l.ttlMicros(), l.mode); err != nil {
		return fmt.Errorf("membership heartbeat: %w", err)
	}
	l.prune(qctx)
	if d.RenewsLeasesOneByOne() {
		// MySQL/MariaDB: one partition per statement, by primary key, so
		// that no renewal holds one lease row while waiting for another
		// (the mark-sent fence holds shared locks on lease rows in its own
		// order; see Dialect.RenewsLeasesOneByOne). The partitions are the
		// ones owned at the last heartbeat (acquisitions update it); the
		// statement's owner condition never renews one lost meanwhile.
		l.mu.Lock()
		held := sortedKeys(l.owned)
		l.mu.Unlock()
		for _, p := range held {
			if _, err := db.ExecContext(qctx, d.Lease("lease_renew_one"), l.ttlMicros(), p, l.id); err != nil {
				return fmt.Errorf("renewing the lease of partition %d: %w", p, err)
			}
		}
	} else if _, err := db.ExecContext(qctx, d.Lease("lease_renew"), l.ttlMicros(), l.id); err != nil {
		return fmt.Errorf("renewing leases: %w", err)
	}
	mine, err := l.mine(qctx)
	if err != nil {
		return err
	}
	live, other, err := l.census(qctx)
	if err != nil {
		return err
	}
	if other != l.conflict {
		l.conflict = other
		if other != "" {
			l.r.log.Error("a relay in another delivery mode runs on this table: the exactly-once guarantee does not hold while both run (stop the relays of one mode)",
				"mode", l.mode, "other_instance", other, "error", ErrModeMismatch)
		}
	}
	live = max(live, 1)
	target := (l.partitions + live - 1) / live

	l.mu.Lock()
	for p := range l.owned {
		if _, ok := mine[p]; !ok {
			l.r.log.Warn("partition lease lost", "partition", p, "instance", l.id)
		}
	}
	l.owned = mine
	// A cycle that ran while the trust window had lapsed claimed nothing
	// and used up its wake-up; wake the loop once the leases are trusted
	// again, or those commits wait for the next poll.
	lapsed := len(mine) > 0 && !time.Now().Before(l.trusted)
	l.trusted = started.Add(l.ttl - l.ttl/5)
	l.r.cfg.Observer.Leases(len(mine))
	pendingRelease := len(l.toRelease)
	var releasing []int
	if excess := len(mine) - target; excess > 0 && pendingRelease == 0 {
		ps := make([]int, 0, len(mine))
		for p := range mine {
			ps = append(ps, p)
		}
		sort.Sort(sort.Reverse(sort.IntSlice(ps)))
		for _, p := range ps[:excess] {
			l.toRelease[p] = true
		}
		releasing = ps[:excess]
		sort.Ints(releasing)
	}
	deficit := target - len(mine)
	// A joining instance owns less than its share until the others give
	// partitions up at their next heartbeat: it beats faster meanwhile, so
	// that released partitions do not wait up to a whole beat for it (a
	// handover from one relay to two cost up to LeaseHeartbeat, 2.5 s, of
	// latency to half the aggregates: emit-to-consumer p99 1.5 s, issue 36).
	now := time.Now()
	if deficit != l.lastDeficit || live != l.lastLive {
		l.catchUpUntil = now.Add(2 * l.beat)
	}
	l.lastDeficit, l.lastLive = deficit, live
	l.catchingUp = deficit > 0 && pendingRelease == 0 && now.Before(l.catchUpUntil)
	l.short = 0
	if pendingRelease == 0 {
		l.short = max(deficit, 0)
	}
	l.mu.Unlock()
	if len(releasing) > 0 {
		l.r.log.Info("releasing partition leases to balance the relays", "instance", l.id,
			"partitions", releasing, "owned", len(mine), "target", target, "instances", live)
	}
	if lapsed {
		select {
		case l.changed <- struct{}{}:
		default:
		}
	}

	if deficit <= 0 || pendingRelease > 0 {
		return nil
	}
	free, err := l.free(qctx)
	if err != nil {
		return err
	}
	// Take the deficit from the free partitions in partition order; a
	// round that loses some to another instance (it took them first)
	// goes on with the next free ones.
	acquired := 0
	for len(free) > 0 && acquired < deficit {
		take := free[:min(deficit-acquired, len(free))]
		free = free[len(take):]
		n, err := l.acquire(qctx, take)
		acquired += n
		if err != nil {
			return err
		}
	}
	if acquired > 0 {
		if mine, err = l.mine(qctx); err != nil {
			return err
		}
		l.mu.Lock()
		l.owned = mine
		if acquired >= deficit {
			l.catchingUp = false // its share is taken: back to the normal beat
		}
		l.short = max(deficit-acquired, 0)
		l.mu.Unlock()
		l.r.cfg.Observer.Leases(len(mine))
		l.r.log.Info("partition leases acquired", "instance", l.id, "acquired", acquired, "owned", len(mine), "instances", live)
		select {
		case l.changed <- struct{}{}:
		default:
		}
	}
	return nil
}

// sortedKeys returns m's partitions in ascending order.
func sortedKeys(m map[int]int64) []int {
	ps := make([]int, 0, len(m))
	for p := range m {
		ps = append(ps, p)
	}
	sort.Ints(ps)
	return ps
}

// acquire takes the free partitions ps for this instance and returns how
// many it took (the others were taken by another instance first, or, on
// MySQL/MariaDB, were locked by another transaction at that moment and
// wait for the next heartbeat). One statement takes them all, one commit:
// a relay starting beside busy writers used to commit once per partition
// before its first claim, and under a saturated burst the 32 commits took
// 100-140 ms on PostgreSQL; on MariaDB, where one commit took 9-48 ms
// under 16 to 64 writers, they add up to a second or more (issue 26,
// BENCHMARKS.md). On MySQL/MariaDB a SELECT ... FOR UPDATE SKIP LOCKED
// locks the rows first, in the same transaction, so the transaction never
// waits while it holds a lease row (Dialect.LeaseLockFree).
func (l *leases) acquire(ctx context.Context, ps []int) (int, error) {
	db, d := l.r.db, l.r.d
	parts := make([]any, len(ps))
	for i, p := range ps {
		parts[i] = p
	}
	lock := d.LeaseLockFree(len(ps))
	if lock == "" {
		res, err := db.ExecContext(ctx, d.LeaseAcquire(len(ps)), append([]any{l.id, l.ttlMicros()}, parts...)...)
		if err != nil {
			return 0, fmt.Errorf("acquiring partitions %v: %w", ps, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("acquiring partitions %v: %w", ps, err)
		}
		return int(n), nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("acquiring partitions %v: %w", ps, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	locked, err := scanColumn[int](tx.QueryContext(ctx, lock, parts...))
	if err != nil {
		return 0, fmt.Errorf("acquiring partitions %v: locking the free ones: %w", ps, err)
	}
	if len(locked) == 0 {
		return 0, nil
	}
	args := []any{l.id, l.ttlMicros()}
	for _, p := range locked {
		args = append(args, p)
	}
	res, err := tx.ExecContext(ctx, d.LeaseAcquire(len(locked)), args...)
	if err != nil {
		return 0, fmt.Errorf("acquiring partitions %v: %w", locked, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("acquiring partitions %v: %w", locked, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("acquiring partitions %v: %w", locked, err)
	}
	return int(n), nil
}

// scanColumn reads a one-column result (a query's rows and error, as
// QueryContext returns them).
func scanColumn[T any](rows *sql.Rows, err error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (l *leases) mine(ctx context.Context) (map[int]int64, error) {
	rows, err := l.r.db.QueryContext(ctx, l.r.d.Lease("lease_mine"), l.id)
	if err != nil {
		return nil, fmt.Errorf("reading own leases: %w", err)
	}
	defer rows.Close()
	m := map[int]int64{}
	for rows.Next() {
		var p int
		var e int64
		if err := rows.Scan(&p, &e); err != nil {
			return nil, err
		}
		m[p] = e
	}
	return m, rows.Err()
}

func (l *leases) free(ctx context.Context) ([]int, error) {
	ps, err := scanColumn[int](l.r.db.QueryContext(ctx, l.r.d.Lease("lease_free")))
	if err != nil {
		return nil, fmt.Errorf("reading free leases: %w", err)
	}
	return ps, nil
}

// run heartbeats every l.beat until ctx ends (every catchUpBeat while
// catching up: see leases.catchingUp), and at once when kicked (another
// relay released partitions: peers.go).
func (l *leases) run(ctx context.Context) {
	t := time.NewTimer(l.next())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kick:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		t.Reset(l.beat) // from the start of this round, as a ticker would
		var fast bool
		err := l.heartbeat(ctx)
		if err != nil && ctx.Err() == nil {
			l.r.log.Warn("lease heartbeat failed; leases lapse unless a later one succeeds", "instance", l.id, "error", err)
		}
		if ctx.Err() == nil {
			l.r.watchPartitions(ctx, l.partitions, false)
		}
		l.mu.Lock()
		if err != nil {
			// A failing database gets the normal beat, not a fast one.
			l.catchingUp = false
		}
		fast = l.catchingUp
		l.mu.Unlock()
		if fast {
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			t.Reset(l.catchUpBeat())
		}
	}
}

// next is the wait before the first heartbeat of run.
func (l *leases) next() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.catchingUp {
		return l.catchUpBeat()
	}
	return l.beat
}

// leave releases every partition and the membership (graceful stop). If
// the database cannot be reached (a pool closed before the relay stopped,
// a database down) it logs one WARN line naming the partitions left to
// expire, not one per partition.
func (l *leases) leave(ctx context.Context) {
	l.mu.Lock()
	ps := make([]int, 0, len(l.owned))
	for p := range l.owned {
		ps = append(ps, p)
	}
	l.mu.Unlock()
	sort.Ints(ps)
	failed, err := l.releaseEach(ctx, ps)
	qctx, cancel := context.WithTimeout(ctx, l.r.cfg.QueryTimeout)
	defer cancel()
	if _, lerr := l.r.db.ExecContext(qctx, l.r.d.Lease("member_leave"), l.id); lerr != nil && err == nil {
		err = lerr
	}
	if len(failed) < len(ps) {
		l.announce(ctx)
	}
	if err == nil {
		return
	}
	l.r.log.Warn("leaving the relay group failed; the partition leases and the membership expire by themselves after LeaseTTL (stop the relay and wait for Run before closing its pool)",
		"partitions", failed, "lease_ttl", l.ttl.String(), "error", err)
}
