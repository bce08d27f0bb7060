package relay

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
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
	// ByStatus counts rows per status: 0 pending, 1 sent, 2 failed (dead).
	Pending, Sent, Dead int64
	// OldestPending is the age of the oldest pending row, 0 if none.
	OldestPending time.Duration
	// Partitions lists every relay partition that has a lease row or
	// pending rows, in order.
	Partitions []PartitionStats
}

// ReadStats reads a Stats snapshot of table (default driver.DefaultTable)
// with three short queries: rows by status, pending rows per partition
// (through the pending index), and the lease table. It returns
// ErrInvalidConfig (wrapped) for a bad dialect or table name, or the
// database error.
func ReadStats(ctx context.Context, db *sql.DB, d driver.Dialect, table string) (Stats, error) {
	if table == "" {
		table = driver.DefaultTable
	}
	dd, err := dialect.New(dialect.Name(d), table)
	if err != nil {
		return Stats{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var st Stats
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
