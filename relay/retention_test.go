package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// TestRetentionAndStats: sent rows past the retention go, in batches of at
// most 1,000, to the archive or nowhere; recent, pending and dead rows
// stay; ReadStats reports the table before and after.
func TestRetentionAndStats(t *testing.T) {
	t.Parallel()
	for _, archive := range []bool{false, true} {
		t.Run(fmt.Sprintf("archive=%v", archive), func(t *testing.T) {
			t.Parallel()
			forEach(t, func(t *testing.T, tg testdb.Target) {
				b := setup(t, tg, func(c *relay.Config) { c.MaxAttempts = 1 })
				b.pub.FailWith(func(m relay.Message) error {
					if m.AggregateID == "dead" {
						return errors.New("refused")
					}
					return nil
				})
				var evs []outbox.Event
				for i := 0; i < 2500; i++ {
					evs = append(evs, event(fmt.Sprintf("a%d", i%40), i))
				}
				evs = append(evs, event("dead", 1))
				b.emit(t, evs...)
				eventually(t, b.ctx, "2,500 sent and one dead", func() bool {
					st, err := relay.ReadStats(b.ctx, b.e.Outbox, b.e.RelayDB)
					return err == nil && st.Sent == 2500 && st.Dead == 1
				})
				sctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
				defer cancel()
				if err := b.r.Stop(sctx); err != nil {
					t.Fatal(err)
				}
				b.emit(t, event("pending", 1)) // no relay now: stays pending
				back := map[driver.Dialect]string{
					driver.Postgres: "created_at - interval '8 days'",
					driver.MySQL:    "created_at - INTERVAL 8 DAY",
					driver.SQLite:   "created_at - 8 * 86400000",
				}[tg.Dialect]
				if _, err := b.e.RelayDB.Exec("UPDATE " + b.e.Table + " SET created_at = " + back + " WHERE status <> 2 AND id <= (SELECT m FROM (SELECT MIN(id) + 2199 AS m FROM " + b.e.Table + ") x)"); err != nil {
					t.Fatal(err)
				}
				st, err := relay.ReadStats(b.ctx, b.e.Outbox, b.e.RelayDB)
				if err != nil {
					t.Fatal(err)
				}
				if st.Pending != 1 || st.Sent != 2500 || st.Dead != 1 || st.OldestPending <= 0 || len(st.Partitions) != 32 {
					t.Fatalf("stats before retention: %+v", st)
				}
				ret, err := relay.NewRetention(b.e.Outbox, b.e.RelayDB, relay.RetentionConfig{Archive: archive, Logger: quiet()})
				if err != nil {
					t.Fatal(err)
				}
				n, err := ret.RunOnce(b.ctx)
				if err != nil || n != 2200 {
					t.Fatalf("RunOnce = %d, %v; want 2200", n, err)
				}
				st, err = relay.ReadStats(b.ctx, b.e.Outbox, b.e.RelayDB)
				if err != nil {
					t.Fatal(err)
				}
				if st.Pending != 1 || st.Sent != 300 || st.Dead != 1 {
					t.Fatalf("stats after retention: %+v", st)
				}
				var archived int
				if archive {
					if err := b.e.RelayDB.QueryRow("SELECT COUNT(*) FROM " + b.e.Table + "_archive").Scan(&archived); err != nil {
						t.Fatal(err)
					}
					if archived != 2200 {
						t.Errorf("%d archived rows, want 2200", archived)
					}
				}
				if n, err := ret.RunOnce(b.ctx); err != nil || n != 0 {
					t.Errorf("second RunOnce = %d, %v; want 0", n, err)
				}
			})
		})
	}
	if _, err := relay.NewRetention(sqliteOutbox(t), nil, relay.RetentionConfig{}); !errors.Is(err, relay.ErrInvalidConfig) {
		t.Errorf("nil db: %v", err)
	}
	if _, err := relay.NewRetention(nil, &sql.DB{}, relay.RetentionConfig{}); !errors.Is(err, relay.ErrInvalidConfig) {
		t.Errorf("nil outbox: %v", err)
	}
}

// TestDeleteOnPublish: acknowledged rows are gone at once; failed ones stay.
func TestDeleteOnPublish(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg, func(c *relay.Config) { c.DeleteOnPublish = true; c.MaxAttempts = 1 })
		b.pub.FailWith(func(m relay.Message) error {
			if m.AggregateID == "bad" {
				return errors.New("refused")
			}
			return nil
		})
		b.emit(t, event("ok", 1), event("ok", 2), event("bad", 1))
		if _, err := b.pub.WaitForCount(b.ctx, 2); err != nil {
			t.Fatal(err)
		}
		eventually(t, b.ctx, "published rows deleted", func() bool {
			st, err := relay.ReadStats(b.ctx, b.e.Outbox, b.e.RelayDB)
			return err == nil && st.Sent == 0 && st.Pending == 0 && st.Dead == 1
		})
	})
}
