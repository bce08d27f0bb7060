// Package handwritten builds the SQL an application writes by hand when it
// implements the outbox itself, as the seed article does: the baseline the
// benchmarks (examples/bench, driver's BenchmarkCommit) compare the
// library against. examples/bench, a module of its own, imports it as
// well: Go's internal rule goes by import path, and
// github.com/sqloutbox/outbox/examples/bench lies under
// github.com/sqloutbox/outbox.
package handwritten

import (
	"strconv"
	"strings"

	"github.com/sqloutbox/outbox/driver"
)

// Now is the dialect's current-timestamp expression in the outbox table's
// timestamp columns, the one the driver's own INSERT uses:
// clock_timestamp() on PostgreSQL, UTC_TIMESTAMP(6) on MySQL/MariaDB,
// integer Unix milliseconds on SQLite.
func Now(d driver.Dialect) string {
	switch d {
	case driver.Postgres:
		return "clock_timestamp()"
	case driver.MySQL:
		return "UTC_TIMESTAMP(6)"
	}
	return "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
}

// placeholder is the n-th (1-based) bind placeholder of dialect d.
func placeholder(d driver.Dialect, n int) string {
	if d == driver.Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// ArgsPerRow is the number of arguments Insert takes per event, in the
// order message ID, aggregate type, aggregate ID, event type, partition
// key, content type, payload (topic and headers are NULL).
const ArgsPerRow = 7

// Insert is a hand-written INSERT of rows events into table (rows >= 1):
// rows*ArgsPerRow arguments, timestamps from Now.
func Insert(d driver.Dialect, table string, rows int) string {
	now := Now(d)
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers, created_at, updated_at) VALUES ")
	n := 0
	for r := 0; r < rows; r++ {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for k := 0; k < ArgsPerRow; k++ {
			n++
			b.WriteString(placeholder(d, n))
			b.WriteString(", ")
			if k == 3 {
				b.WriteString("NULL, ") // topic
			}
		}
		b.WriteString("NULL, " + now + ", " + now + ")") // headers, created_at, updated_at
	}
	return b.String()
}
