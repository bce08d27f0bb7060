package handwritten

import (
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/driver"
)

func TestInsert(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    driver.Dialect
		rows int
		want string
	}{
		{driver.Postgres, 1, "INSERT INTO t (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers, created_at, updated_at) VALUES ($1, $2, $3, $4, NULL, $5, $6, $7, NULL, clock_timestamp(), clock_timestamp())"},
		{driver.MySQL, 1, "INSERT INTO t (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers, created_at, updated_at) VALUES (?, ?, ?, ?, NULL, ?, ?, ?, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"},
	} {
		if got := Insert(c.d, "t", c.rows); got != c.want {
			t.Errorf("%s, %d rows:\n got %s\nwant %s", c.d, c.rows, got, c.want)
		}
	}
	q := Insert(driver.Postgres, "t", 10)
	if !strings.Contains(q, "$70, NULL") || strings.Contains(q, "$71") || strings.Count(q, "), (") != 9 {
		t.Errorf("ten rows: %s", q)
	}
	if n := strings.Count(Insert(driver.SQLite, "t", 3), "?"); n != 3*ArgsPerRow {
		t.Errorf("sqlite, 3 rows: %d placeholders", n)
	}
}
