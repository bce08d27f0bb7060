package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/handwritten"
)

// BaselineResult is part 5: the seed's relay.
type BaselineResult struct {
	Rows         int     `json:"rows"`
	Sent         int     `json:"sent"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	Description  string  `json:"description"`
}

const baselineDescription = "seed relay: SELECT ... WHERE status = 0 ORDER BY id LIMIT 100; per event one synchronous sarama SendMessage (acks=all) then one UPDATE; sleeps 1 s after a batch of fewer than 100 (a full batch polls again at once, which favours the seed)"

// seedBatch is the seed relay's LIMIT; seedPoll its sleep after a short batch.
const (
	seedBatch = 100
	seedPoll  = time.Second
)

// seedRelay is the seed's relay, rebuilt: poll, then per event one
// synchronous send and one UPDATE.
type seedRelay struct {
	db       *sql.DB
	sp       sarama.SyncProducer
	topic    string
	sel, upd string
	// sent, if set, is called right after the broker acknowledged a
	// message (SendMessage returned), before its UPDATE.
	sent func(messageID string, at time.Time)
}

// seedIndex gives table the seed's index on (status, next_retry_at), which
// its claim ("status = 0 ORDER BY id") reads; the library's schema has no
// index on status since schema version 9 on PostgreSQL (8 on SQLite: its
// pending rows are a table of their own), and without it the seed's claim
// would walk the primary key, an unfair measure of the seed. MySQL/MariaDB
// tables have (status, id) already.
func seedIndex(ctx context.Context, db *database, table string) error {
	if db.dialect == driver.MySQL {
		return nil
	}
	name := table[strings.LastIndex(table, ".")+1:] + "_seed_status_idx"
	q := "CREATE INDEX IF NOT EXISTS " + name + " ON " + table + " (status, next_retry_at)"
	if db.dialect == driver.SQLite && strings.Contains(table, ".") {
		q = "CREATE INDEX IF NOT EXISTS " + table[:strings.LastIndex(table, ".")+1] + name + " ON " + table[strings.LastIndex(table, ".")+1:] + " (status, next_retry_at)"
	}
	if _, err := db.admin.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("the seed's index on %s: %w", table, err)
	}
	return nil
}

// newSeedRelay connects a synchronous producer (acks=all, the seed's 3 s
// send timeout) and prepares the seed's statements on table.
func newSeedRelay(db *sql.DB, dialect driver.Dialect, ph func(int) string, table string, brokers []string, topic string) (*seedRelay, error) {
	sc := sarama.NewConfig()
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Return.Successes = true
	sc.Producer.Timeout = 3 * time.Second
	sp, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		return nil, err
	}
	return &seedRelay{
		db: db, sp: sp, topic: topic,
		sel: fmt.Sprintf("SELECT id, message_id, aggregate_type, aggregate_id, event_type, payload FROM %s WHERE status = 0 ORDER BY id LIMIT %d", table, seedBatch),
		upd: "UPDATE " + table + " SET status = 1, sent_at = " + handwritten.Now(dialect) + ", updated_at = " + handwritten.Now(dialect) + " WHERE id = " + ph(1),
	}, nil
}

func (s *seedRelay) Close() { _ = s.sp.Close() }

// run relays until done(sent so far) is true or ctx ends (then it returns
// the count and nil). done is checked before every poll and every send.
func (s *seedRelay) run(ctx context.Context, done func(sent int) bool) (int, error) {
	type row struct {
		id               int64
		mid, at, aid, et string
		payload          []byte
	}
	sent := 0
	stopped := func(err error) bool { return err != nil && ctx.Err() != nil }
	for !done(sent) {
		rs, err := s.db.QueryContext(ctx, s.sel)
		if stopped(err) {
			return sent, nil
		}
		if err != nil {
			return sent, err
		}
		var batch []row
		for rs.Next() {
			var r row
			if err := rs.Scan(&r.id, &r.mid, &r.at, &r.aid, &r.et, &r.payload); err != nil {
				rs.Close()
				return sent, err
			}
			batch = append(batch, r)
		}
		if err := rs.Close(); stopped(err) {
			return sent, nil
		} else if err != nil {
			return sent, err
		}
		for _, r := range batch {
			if done(sent) {
				break
			}
			_, _, err := s.sp.SendMessage(&sarama.ProducerMessage{Topic: s.topic, Key: sarama.StringEncoder(r.aid), Value: sarama.ByteEncoder(r.payload),
				Headers: []sarama.RecordHeader{{Key: []byte("outbox-message-id"), Value: []byte(r.mid)}, {Key: []byte("outbox-event-type"), Value: []byte(r.et)}}})
			if err != nil {
				return sent, fmt.Errorf("seed send: %w", err)
			}
			if s.sent != nil {
				s.sent(r.mid, time.Now())
			}
			if _, err := s.db.ExecContext(ctx, s.upd, r.id); stopped(err) {
				return sent, nil
			} else if err != nil {
				return sent, fmt.Errorf("seed update: %w", err)
			}
			sent++
		}
		if len(batch) < seedBatch && !done(sent) {
			// The seed's poll interval (its behaviour, not a wait for a
			// condition of the bench).
			t := time.NewTimer(seedPoll)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return sent, nil
			}
		}
	}
	return sent, nil
}

// runBaseline drains a preload of rows with the seed's relay for at most
// capFor and reports events/s.
func runBaseline(ctx context.Context, db *database, brokers []string, rows, aggs int, capFor time.Duration) (*BaselineResult, error) {
	env, err := db.newOutbox(ctx, "ob_seed", 1)
	if err != nil {
		return nil, err
	}
	defer env.close()
	if err := preload(ctx, db, env, rows, aggs, false, "s-"); err != nil {
		return nil, err
	}
	topic, err := topicFor(ctx, brokers, "seed-"+randomHex(3))
	if err != nil {
		return nil, err
	}
	if err := seedIndex(ctx, db, env.table); err != nil {
		return nil, err
	}
	s, err := newSeedRelay(env.relay, db.dialect, db.ph, env.table, brokers, topic)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	res := &BaselineResult{Rows: rows, Description: baselineDescription}
	start := time.Now()
	deadline := start.Add(capFor)
	sent, err := s.run(ctx, func(sent int) bool { return sent >= rows || !time.Now().Before(deadline) })
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	el := time.Since(start)
	res.Sent = sent
	res.Seconds = round2(el.Seconds())
	res.EventsPerSec = round2(float64(res.Sent) / el.Seconds())
	return res, nil
}
