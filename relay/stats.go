package relay

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sqloutbox/outbox/driver"
)

// PartitionStats is the backlog and ownership of one relay partition.
type PartitionStats struct {
	Partition int
	// Pending rows and the age of the oldest (database clock).
	Pending       int64
	OldestPending time.Duration
	// Owner is the instance holding the lease ("" if none or expired),
	// Epoch its fencing token, LeaseLeft the time until it expires.
	Owner     string
	Epoch     int64
	LeaseLeft time.Duration
}

// Stats is a snapshot of one outbox table.
type Stats struct {
	// PartitionCount is the relay partition count stored in the table
	// (driver.Outbox.PartitionCount).
	PartitionCount int
	// LeaseRows is the number of rows in the lease table: PartitionCount
	// once a relay has run, 0 before.
	LeaseRows int
	// OutOfRange is the number of pending rows in partitions outside
	// 0..PartitionCount-1: rows no relay can own, written by a writer
	// configured with another count. Their partitions are in Partitions.
	OutOfRange int64
	// Pending, Sent and Dead count rows per state: pending (the pending
	// set), sent (neither pending nor dead), dead (status 2).
	Pending, Sent, Dead int64
	// OldestPending is the age of the oldest pending row, 0 if none.
	OldestPending time.Duration
	// Partitions lists every relay partition that has a lease row or
	// pending rows, in order (including any outside
	// 0..PartitionCount-1).
	Partitions []PartitionStats
}

// Mismatch returns nil if the snapshot's partitions agree, else an error
// wrapping ErrPartitionMismatch that says how they disagree: the lease
// table has rows but not PartitionCount of them, or a partition outside
// 0..PartitionCount-1 has pending rows or a lease row.
func (s Stats) Mismatch() error {
	var problems []string
	if s.LeaseRows != 0 && s.LeaseRows != s.PartitionCount {
		problems = append(problems, fmt.Sprintf("the lease table has %d rows", s.LeaseRows))
	}
	if s.OutOfRange > 0 {
		problems = append(problems, fmt.Sprintf("%d pending rows are in partitions no relay owns", s.OutOfRange))
	}
	for _, p := range s.Partitions {
		if (p.Partition < 0 || p.Partition >= s.PartitionCount) && p.Pending == 0 {
			problems = append(problems, fmt.Sprintf("the lease table has a row for partition %d", p.Partition))
			break
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the table stores %d partitions; %s", ErrPartitionMismatch, s.PartitionCount, strings.Join(problems, "; "))
}

// ReadStats reads a Stats snapshot of ob's table through db with four
// short queries: the stored partition count, rows by status, pending rows
// per partition (through the pending index), and the lease table. It
// returns ErrInvalidConfig (wrapped) for a nil ob or db, or the database
// error (a schema older than the stored partition count fails too).
func ReadStats(ctx context.Context, ob *driver.Outbox, db *sql.DB) (Stats, error) {
	if ob == nil || db == nil {
		return Stats{}, fmt.Errorf("%w: ReadStats needs a *driver.Outbox and a *sql.DB", ErrInvalidConfig)
	}
	dd, err := dialectOf(ob)
	if err != nil {
		return Stats{}, err
	}
	table := ob.Config().Table
	var st Stats
	if err := db.QueryRowContext(ctx, dd.Query("partitions")).Scan(&st.PartitionCount); err != nil {
		return st, fmt.Errorf("outbox: reading the partition count of %s: %w", table, err)
	}
	rows, err := db.QueryContext(ctx, dd.Query("stats_status"))
	if err != nil {
		return st, fmt.Errorf("outbox: stats of %s: %w", table, err)
	}
	for rows.Next() {
		var status int
		var n int64
		if err := rows.Scan(&status, &n); err != nil {
			rows.Close()
			return st, err
		}
		switch status {
		case 0:
			st.Pending = n
		case 1:
			st.Sent = n
		case 2:
			st.Dead = n
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}
	byPart := map[int]*PartitionStats{}
	part := func(p int) *PartitionStats {
		if ps, ok := byPart[p]; ok {
			return ps
		}
		byPart[p] = &PartitionStats{Partition: p}
		return byPart[p]
	}
	if rows, err = db.QueryContext(ctx, dd.Query("stats_pending")); err != nil {
		return st, fmt.Errorf("outbox: pending stats of %s: %w", table, err)
	}
	for rows.Next() {
		var p int
		var n, ageMicros int64
		if err := rows.Scan(&p, &n, &ageMicros); err != nil {
			rows.Close()
			return st, err
		}
		ps := part(p)
		ps.Pending, ps.OldestPending = n, time.Duration(ageMicros)*time.Microsecond
		st.OldestPending = max(st.OldestPending, ps.OldestPending)
		if p < 0 || p >= st.PartitionCount {
			st.OutOfRange += n
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}
	if rows, err = db.QueryContext(ctx, dd.Lease("lease_owners")); err != nil {
		return st, fmt.Errorf("outbox: lease stats of %s: %w", table, err)
	}
	for rows.Next() {
		var p int
		var owner string
		var epoch, leftMS int64
		if err := rows.Scan(&p, &owner, &epoch, &leftMS); err != nil {
			rows.Close()
			return st, err
		}
		st.LeaseRows++
		ps := part(p)
		ps.Epoch = epoch
		if owner != "" && leftMS > 0 {
			ps.Owner, ps.LeaseLeft = owner, time.Duration(leftMS)*time.Millisecond
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}
	keys := make([]int, 0, len(byPart))
	for p := range byPart {
		keys = append(keys, p)
	}
	sort.Ints(keys)
	for _, p := range keys {
		st.Partitions = append(st.Partitions, *byPart[p])
	}
	return st, nil
}
