package relay

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/internal/dialect"
)

// The PostgreSQL claim runs on one connection of its own (issue 34).
//
// The claim is a PL/pgSQL function: the first call in a session compiles
// it and plans its statements, reading some 900 catalog pages: 17-20 ms
// on the idle benchmark machine, 23-112 ms under load, against 0.4-0.9 ms
// for a warm call (15 fresh sessions; BENCHMARKS.md, "Issue 34"). Taken from the pool, the claim ran on
// whichever of the relay's connections was free: usually the one the loop
// used last, but on the other one as soon as a mark-sent, a lease
// heartbeat or a health probe held that one. So the first time the load
// made those overlap, one claim paid the cold
// session's cost, and every event committed meanwhile waited for it. From
// the pool, a claim also waited for a connection whenever a mark-sent and
// a heartbeat (whose commits wait for the WAL flush) held both.
//
// So the loop holds one connection for its claims, from Run's start (where
// one call with no partitions plans every statement of the function)
// until Run returns, and replaces it only after an error. Mark-sent and
// the background loops use the rest of the pool. A connection is pinned
// only if the pool is unbounded or at least two of its connections stay
// unpinned (minUnpinned): relays that share a small pool must not take
// every connection, or their mark-sent, lease acquisitions and heartbeats
// would wait forever, and one connection left over is not enough either
// once the application holds it: with SetMaxOpenConns(2) and a transaction
// of the application open on one connection until an event is published,
// the pinned claim took the other and the relay could not take its leases
// (TestLateCommitIsPublished hung). A relay that finds no room claims
// through the pool as before.

// minUnpinned is how many connections of a bounded pool stay out of the
// claim sessions pinned on it.
const minUnpinned = 2

// pinned counts the claim connections pinned per pool, in this process.
var pinned = struct {
	sync.Mutex
	n map[*sql.DB]int
}{n: map[*sql.DB]int{}}

// claimSession returns the loop's claim connection, taking and warming one
// if it has none; nil if the claim goes through the pool (MySQL/MariaDB
// and SQLite, or no room to pin one).
func (r *Relay) claimSession(ctx context.Context) (*sql.Conn, error) {
	if r.claimConn != nil || !r.d.HasClaimFloor() {
		return r.claimConn, nil
	}
	pinned.Lock()
	limit := r.db.Stats().MaxOpenConnections
	room := limit == 0 || limit-(pinned.n[r.db]+1) >= minUnpinned
	if room {
		pinned.n[r.db]++
	}
	pinned.Unlock()
	if !room {
		return nil, nil
	}
	c, err := r.db.Conn(ctx)
	if err == nil {
		if err = r.warmClaim(ctx, c); err != nil {
			_ = c.Close()
		}
	}
	if err != nil {
		unpin(r.db)
		return nil, err
	}
	r.claimConn = c
	return c, nil
}

// claimStatement returns the claim prepared on the claim connection (one
// round trip per claim: lib/pq sends an unprepared statement with
// arguments as Parse/Describe, waits, then Bind/Execute, and the backend
// sleeps between the two until the relay's goroutine is scheduled again),
// preparing it if it is not; nil if it cannot be prepared (the claim then
// runs unprepared on the connection).
func (r *Relay) claimStatement(ctx context.Context) *sql.Stmt {
	if r.claimConn == nil {
		return nil
	}
	if r.claimStmt == nil && !r.claimNoPrep {
		st, err := r.claimConn.PrepareContext(ctx, r.d.ClaimFloor())
		if err != nil {
			r.claimNoPrep = true
			return nil
		}
		r.claimStmt = st
	}
	return r.claimStmt
}

// openedAtStart is how many connections besides the claim connection Run
// opens before its first claim (openPool): one for mark-sent, one for the
// lease heartbeat and the health probe, database/sql's default
// MaxIdleConns.
const openedAtStart = 2

// openWait bounds how long openPool waits for one connection: a pool held
// by the application is left to open its connections on demand.
const openWait = 250 * time.Millisecond

// openPool opens, before the first claim, the connections the relay's
// mark-sent and background loops use beside the claim connection, and
// puts them back in the pool as idle ones. Opened on demand, the first
// mark-sent's connection queued behind every connection the application
// opened at the same moment (PostgreSQL starts sessions one at a time):
// in issue 34's exactly-once benchmark, 32 writers starting with the
// relay, it waited 0.9-1.2 s, and the relay, which waits for a batch's
// mark before it records the next one, stalled that long. Only on
// PostgreSQL (where the claim connection is pinned), and only on an
// unbounded pool or one with room for them beside the connections in
// use; each wait is bounded by openWait, and a failure is left to the
// statement that needs the connection.
func (r *Relay) openPool(ctx context.Context) {
	if !r.d.HasClaimFloor() {
		return
	}
	st := r.db.Stats()
	if st.MaxOpenConnections > 0 && st.MaxOpenConnections-st.InUse < openedAtStart {
		return
	}
	var conns []*sql.Conn
	for range openedAtStart {
		cctx, cancel := context.WithTimeout(ctx, openWait)
		c, err := r.db.Conn(cctx)
		if err == nil {
			err = c.PingContext(cctx)
		}
		cancel()
		if err != nil {
			if c != nil {
				_ = c.Close()
			}
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		_ = c.Close() // back to the pool
	}
}

func unpin(db *sql.DB) {
	pinned.Lock()
	defer pinned.Unlock()
	if pinned.n[db]--; pinned.n[db] <= 0 {
		delete(pinned.n, db)
	}
}

// warmClaim calls the claim function once on c with no partitions, so
// that the session compiles it and plans each of its statements (the
// claim, the floor proof's check and its new proof) before a claim needs
// them. It claims nothing; its floor report is discarded. The new proof
// takes a transaction ID (a commit record without a WAL flush), as every
// proof does.
func (r *Relay) warmClaim(ctx context.Context, c *sql.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := c.QueryContext(qctx, r.d.ClaimFloor(), r.floor.floor, r.floor.epoch, 0,
		dialect.IDArray(nil), dialect.IntArray(nil), int64(0), true)
	if err != nil {
		return fmt.Errorf("preparing the claim session: %w", err)
	}
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return fmt.Errorf("preparing the claim session: %w", err)
	}
	return rows.Close()
}

// dropClaimSession gives the claim connection back to the pool (after an
// error, or when Run returns); the next claim takes a new one.
func (r *Relay) dropClaimSession() {
	if r.claimStmt != nil {
		_ = r.claimStmt.Close()
		r.claimStmt = nil
	}
	r.claimNoPrep = false
	if r.walStmt != nil { // prepared on the claim connection, or the pool
		_ = r.walStmt.Close()
		r.walStmt = nil
	}
	r.walNoPrep = false
	if r.claimConn != nil {
		_ = r.claimConn.Close()
		r.claimConn = nil
		unpin(r.db)
	}
}
