package tests

import (
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testdb"
)

// TestClaimUsesHoldIndex is the regression test for a claim that scanned
// every earlier row (sent history included) per candidate on SQLite,
// because the planner could not match the partial hold index: the plan
// must probe hold_idx, never walk the primary key for the hold check.
func TestClaimUsesHoldIndex(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[3], driver.Config{})
	d, err := dialect.New(dialect.SQLite, e.Table)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := e.RelayDB.Query("EXPLAIN QUERY PLAN "+d.Query("claim"), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	text := strings.Join(plan, "\n")
	if strings.Count(text, "hold_idx") < 2 || strings.Contains(text, "SEARCH h USING INTEGER PRIMARY KEY") {
		t.Fatalf("claim plan does not probe the hold index:\n%s", text)
	}
	if !strings.Contains(text, "pending_idx") {
		t.Fatalf("claim plan does not walk the pending index:\n%s", text)
	}
}
