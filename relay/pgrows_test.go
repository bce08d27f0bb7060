package relay_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// pgRows returns, for e's PostgreSQL table, exec (runs a statement on the
// relay pool; one that fails fails t) and insert (n outbox rows from
// message m-<from>: 100 aggregates, 32 partitions, 200-byte payloads;
// pending through the table's triggers), for the tests that build a
// table's state in bulk and count what a statement reads.
func pgRows(t *testing.T, ctx context.Context, e *testdb.Env) (exec func(string), insert func(from, n int)) {
	exec = func(q string) {
		t.Helper()
		if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	insert = func(from, n int) {
		t.Helper()
		exec(fmt.Sprintf("INSERT INTO %s (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers) "+
			"SELECT 'm-' || g, 'order', 'agg-' || (g %% 100), 'created', 't', g %% 32, 'application/json', convert_to(repeat('x', 200), 'UTF8'), '' "+
			"FROM generate_series(%d, %d) g", e.Table, from, from+n-1))
	}
	return exec, insert
}
