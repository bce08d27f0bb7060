package dialect_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestClaimExclusionsMatchModel runs the claim MySQL/MariaDB and SQLite
// use (ClaimBatch: partitions, ids to skip, id ranges known sent) on a
// real server against a model computed in Go: the first batch pending
// rows in id order, of the given partitions, outside the skipped ids and
// ranges, exactly, never one pending row hidden or out of order. Each
// round draws a new claim: up to 2,000 skipped ids (written as "<>" and
// "NOT BETWEEN" ranges, more than the relay's largest batch), up to 64
// sent ranges (the relay's maxSentRanges), a random subset of 32
// partitions and a batch of 1-800, over 6,000 rows of which a third are
// sent (300 rounds on MariaDB, 40 on SQLite). The range optimizer turns these conditions into gaps in the
// index range it scans (Dialect.ClaimExcluding); a wrong gap would hide a
// pending row, which the relay would then publish after later rows of its
// aggregate.
func TestClaimExclusionsMatchModel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tg     testdb.Target
		rounds int // SQLite (modernc, under -race) is slow to claim: fewer rounds
	}{{testdb.Target{Name: "mysql", Dialect: driver.MySQL}, 300}, {testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, 40}} {
		tg := c.tg
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			name := map[driver.Dialect]dialect.Name{driver.MySQL: dialect.MySQL, driver.SQLite: dialect.SQLite}[tg.Dialect]
			d, err := dialect.New(name, e.Table)
			if err != nil {
				t.Fatal(err)
			}
			const rows, parts = 6000, 32
			rng := rand.New(rand.NewPCG(1, 2))
			part := make([]int, rows+1) // by id
			sent := map[int64]bool{}
			var vals []string
			now := "CURRENT_TIMESTAMP"
			if tg.Dialect == driver.MySQL {
				now = "UTC_TIMESTAMP(6)"
			}
			for id := 1; id <= rows; id++ {
				part[id] = rng.IntN(parts)
				vals = append(vals, fmt.Sprintf("('m%d', 'order', 'a%d', 't', '', %d, 'application/json', '{}', '', %s, %s)", id, id%50, part[id], now, now))
				if len(vals) == 500 || id == rows {
					if _, err := e.RelayDB.Exec("INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers, created_at, updated_at) VALUES " + strings.Join(vals, ", ")); err != nil {
						t.Fatal(err)
					}
					vals = vals[:0]
				}
				if rng.IntN(3) == 0 {
					sent[int64(id)] = true
				}
			}
			sentIDs := make([]int64, 0, len(sent))
			for id := range sent {
				sentIDs = append(sentIDs, id)
			}
			slices.Sort(sentIDs)
			for c := 0; c < len(sentIDs); c += 500 {
				ids := sentIDs[c:min(c+500, len(sentIDs))]
				if _, err := e.RelayDB.Exec("UPDATE " + e.Table + " SET status = 1 WHERE id IN (" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(ids)), ","), "[]") + ")"); err != nil {
					t.Fatal(err)
				}
			}
			for round := range c.rounds {
				skip := make([]int64, rng.IntN(2000))
				for i := range skip {
					skip[i] = int64(1 + rng.IntN(rows))
				}
				ranges := dialect.IDRanges(sentIDs[:rng.IntN(len(sentIDs))], nil)
				ranges = ranges[max(0, len(ranges)-64):]
				var ps []int
				for p := range parts {
					if rng.IntN(4) != 0 {
						ps = append(ps, p)
					}
				}
				batch := 1 + rng.IntN(800)

				skipped, owned := map[int64]bool{}, map[int]bool{}
				for _, id := range skip {
					skipped[id] = true
				}
				for _, p := range ps {
					owned[p] = true
				}
				want := make([]int64, 0, batch)
				for id := int64(1); id <= rows && len(want) < batch; id++ {
					hidden := sent[id] || !owned[part[id]] || skipped[id]
					if tg.Dialect == driver.MySQL { // SQLite ignores sent ranges
						for _, r := range ranges {
							hidden = hidden || (id >= r[0] && id <= r[1])
						}
					}
					if !hidden {
						want = append(want, id)
					}
				}
				q, args := d.ClaimBatch(batch, ps, skip, ranges)
				got := claimedIDs(t, e, q, args)
				if !slices.Equal(got, want) {
					t.Fatalf("round %d (%d skipped ids, %d sent ranges, %d partitions, batch %d): claimed %d rows %v..., want %d rows %v...",
						round, len(skip), len(ranges), len(ps), batch, len(got), got[:min(10, len(got))], len(want), want[:min(10, len(want))])
				}
			}
		})
	}
}

// claimedIDs runs a claim statement and returns the ids it claimed.
func claimedIDs(t *testing.T, e *testdb.Env, q string, args []any) []int64 {
	t.Helper()
	rows, err := e.RelayDB.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id, age int64
		var mid, typ, agg, evt, topic, ct, headers string
		var p, attempts int
		var payload []byte
		if err := rows.Scan(&id, &mid, &typ, &agg, &evt, &topic, &p, &ct, &payload, &headers, &attempts, &age); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}
