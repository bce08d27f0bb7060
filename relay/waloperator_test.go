package relay_test

// What operators and other programs can do to the WAL source's slot,
// publication and state table under a running relay, and what the relay
// does about it: each was a state the relay could not leave by itself, or
// did not report, until a helper asked to break the WAL source found it
// (2026-12-07).

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/logmsg"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// TestWALPublicationDroppedUnderTheStream: an operator drops the
// publication while the relay streams (DROP PUBLICATION, or `outbox wal
// drop` run against a live relay), and a change of any table of the
// database is committed before the relay creates the publication again.
// The walsender fails at that change with "publication ... does not
// exist" (42704, raised by pgoutput in its change callback), and fails
// there in every read: pgoutput looks the publication up in the catalog as
// of each change, and at that change there was none, whatever exists now
// (PostgreSQL 15; shown in psql: DROP PUBLICATION, an INSERT into any
// table, CREATE PUBLICATION, and every peek of the slot fails at the
// INSERT). Before, the relay created the publication again at each
// reconnect and retried the slot for ever: the rows were claimed from the
// table, and the slot kept the server's WAL from that point until the disk
// was full or an operator dropped it; log-only events were stuck. Now
// such a failure counts as a slot the server cannot read
// (relay/walslot.go): after RecreateUnreadableAfter (1 s here, 30 s by
// default) the relay reads it once more, drops it and creates another.
//
// Table mode: A-2, committed while the publication was missing (its row
// is the failing change), is claimed from the table; nothing is lost, no
// loss is recorded, and A-3 comes from the new slot's stream.
//
// Log-only mode: A-2, a logical decoding message emitted after the failing
// change (an INSERT into a table of the test's own), is in the part of the
// WAL no slot can read any more: the window is recorded as a loss (Ready
// wraps ErrWALLoss), and A-3 comes from the new slot's stream.
func TestWALPublicationDroppedUnderTheStream(t *testing.T) {
	t.Parallel()
	for _, logOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "table", true: "log-only"}[logOnly], func(t *testing.T) {
			t.Parallel()
			e, wal := modeEnv(t, logOnly)
			wal.Publication = relay.PublicationName(e.Table)
			scratch := e.Table + "_scratch"
			if _, err := e.RelayDB.Exec("CREATE TABLE " + scratch + " (id int)"); err != nil {
				t.Fatal(err)
			}
			logs := &syncLog{}
			b := setupOn(t, e, func(c *relay.Config) {
				c.Source, c.WAL, c.PollInterval = relay.SourceWAL, wal, 30*time.Second
				c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
			}, func(r *relay.Relay) { r.RecreateUnreadableAfter(time.Second) })
			ctx := b.ctx
			waitStreaming(t, b, wal.Slot)
			b.emit(t, event("A", 1))
			if _, err := b.pub.Wait(ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
				t.Fatal(err)
			}
			if _, err := e.RelayDB.ExecContext(ctx, "DROP PUBLICATION "+wal.Publication); err != nil {
				t.Fatal(err)
			}
			if logOnly {
				// The failing change; in table mode A-2's row is one.
				if _, err := e.RelayDB.ExecContext(ctx, "INSERT INTO "+scratch+" VALUES (1)"); err != nil {
					t.Fatal(err)
				}
			}
			b.emit(t, event("A", 2)) // committed while no publication exists
			written := currentLSN(t, ctx, e.RelayDB)
			// The slot passes A-2's transaction: recreated after it.
			waitSlotPast(t, ctx, e.RelayDB, wal.Slot, written, "the slot past the transactions committed without a publication")
			waitStreaming(t, b, wal.Slot)
			fromStream, _ := b.r.WALCounts()
			b.emit(t, event("A", 3))
			msgs, err := b.pub.Wait(ctx, func(m []relay.Message) bool { return strings.Contains(fmt.Sprint(order(m, "A")), "A-3") })
			if err != nil {
				t.Fatal(err)
			}
			want := "[A-1 A-2 A-3]"
			if logOnly {
				want = "[A-1 A-3]"
			}
			if got := fmt.Sprint(firstDeliveries(order(msgs, "A"))); got != want {
				t.Fatalf("A first delivered as %s, want %s", got, want)
			}
			if now, _ := b.r.WALCounts(); now == fromStream {
				t.Fatalf("A-3 did not come from the stream (%d messages from it before and after)", now)
			}
			recreated := 0
			for _, l := range logs.lines() {
				if strings.HasPrefix(fmt.Sprint(l["msg"]), "replication slot unreadable") {
					recreated++
					if !strings.Contains(fmt.Sprint(l["error"]), "publication") {
						t.Errorf("the recreation's log line does not give the server's error: %v", l)
					}
				}
			}
			if recreated != 1 {
				t.Errorf("slot recreated %d times, want 1", recreated)
			}
			wantRecreationLoss(t, b, wal, logOnly, "does not exist")
		})
	}
}

// TestWALSlotCreationHeldByAnOpenTransaction: the relay creates its slot
// while a transaction is left open elsewhere; the server's creation waits
// for it to end. The relay says so at WARN (after WarnSlotCreationAfter:
// 200 ms here, 10 s by default) instead of waiting silently, and claims
// from the table meanwhile; once the transaction ends the slot is
// created, the relay streams it, and A-2 follows in order. Before, nothing was logged beyond
// "publication created" for as long as the transaction stayed open (found
// by a helper trying to break the WAL source). On a private server: an
// open transaction on the shared one would hold every test's slot.
func TestWALSlotCreationHeldByAnOpenTransaction(t *testing.T) {
	t.Parallel()
	pg := privateserver.StartPostgres(t, map[string]string{"wal_level": "logical"})
	e := testdb.NewOn(t, walTarget, pg.DSN, driver.Config{})
	wal := relay.WALConfig{DSN: e.DSN, Slot: strings.ToLower(testdb.RandomName("outbox_test_"))}
	dropWAL(t, e, wal)
	other, err := sql.Open("pgx", e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	open, err := other.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback()
	if _, err := open.Exec("CREATE TEMPORARY TABLE held (id int)"); err != nil { // an xid
		t.Fatal(err)
	}
	logs := &syncLog{}
	b := setupOn(t, e, func(c *relay.Config) {
		c.Source, c.WAL, c.PollInterval = relay.SourceWAL, wal, 50*time.Millisecond
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	}, func(r *relay.Relay) { r.WarnSlotCreationAfter(200 * time.Millisecond) })
	eventually(t, b.ctx, "a warning that the slot's creation waits", func() bool { return logged(logs, "WARN", "replication slot still being created", "", "") })
	b.emit(t, event("A", 1))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
		t.Fatalf("A-1 not claimed while the slot is being created: %v", err)
	}
	if err := open.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitStreaming(t, b, wal.Slot)
	wantA2(t, b, false) // the 50 ms poll may claim A-2 first on a loaded machine (a CI run)
}

// TestWALRowTheRelayCannotDecode: a row inserted by hand whose headers are
// JSON but not strings reaches the stream; the relay cannot decode it
// (nor can a claim: the polling relay fails on it too, naming the row,
// until it is fixed). Before, the stream failed at that record at every
// reconnect, for ever: deleting or fixing the row did not help (the
// record stays in the WAL), the slot's position never passed it and the
// server kept WAL from there; in log-only mode every later event waited
// (found by a helper trying to break the WAL source). Now the row is left
// to the table, its transaction opens a gap that a claim covers, and once
// the operator deletes the row the relay goes back to the stream: A-1,
// committed behind it, is published, A-2 comes from the stream, and the
// slot passes the row's record.
func TestWALRowTheRelayCannotDecode(t *testing.T) {
	t.Parallel()
	for _, logOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "table", true: "log-only"}[logOnly], func(t *testing.T) {
			t.Parallel()
			e, wal := modeEnv(t, logOnly)
			logs := &syncLog{}
			b := setupOn(t, e, func(c *relay.Config) {
				c.Source, c.WAL, c.PollInterval = relay.SourceWAL, wal, 30*time.Second
				c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
			})
			ctx := b.ctx
			waitStreaming(t, b, wal.Slot)
			if _, err := e.RelayDB.ExecContext(ctx, "INSERT INTO "+e.Table+` (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, headers)
				VALUES ('P-1', 'acct', 'P', 't', 0, 'application/json', '\x00', '{"n": 1}')`); err != nil {
				t.Fatal(err)
			}
			written := currentLSN(t, ctx, e.RelayDB)
			b.emit(t, event("A", 1))
			eventually(t, ctx, "a warning naming the row the stream could not decode", func() bool {
				return logged(logs, "WARN", "WAL source: rows of the outbox table in the stream could not be decoded", "error", "headers of row")
			})
			if _, err := e.RelayDB.ExecContext(ctx, "DELETE FROM "+e.Table+" WHERE message_id = 'P-1'"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.pub.Wait(ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
				t.Fatalf("A-1 not published once the row was deleted: %v", err)
			}
			waitStreaming(t, b, wal.Slot)
			wantA2(t, b, true)
			waitSlotPast(t, ctx, e.RelayDB, wal.Slot, written, "the slot past the row's record")
		})
	}
}

// TestWALSlotHeldByAReaderThatIsNotARelay: a replication connection that
// is not an outbox relay (named pg_recvlogical here: a debugging session,
// or a CDC tool pointed at the relay's slot) reads the slot and never
// confirms. The relay does not terminate it (it may be run on purpose),
// but says so at WARN, naming its pid and application_name, claims from
// the table meanwhile, and in log-only mode is not ready (its events wait
// in the slot, read by no relay); once the reader stops, the relay takes
// the slot and is ready again. Before, it stood by for ever with DEBUG
// lines only, and a log-only relay stayed ready while nothing relayed its
// events (found by a helper trying to break the WAL source).
func TestWALSlotHeldByAReaderThatIsNotARelay(t *testing.T) {
	t.Parallel()
	for _, logOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "table", true: "log-only"}[logOnly], func(t *testing.T) {
			t.Parallel()
			e, wal := modeEnv(t, logOnly)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pub := relay.PublicationName(e.Table)
			if _, err := e.RelayDB.ExecContext(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+e.Table+" WITH (publish = 'insert')"); err != nil {
				t.Fatal(err)
			}
			reader := frozenReader(t, ctx, e.DSN, "pg_recvlogical", wal.Slot, pub)
			defer reader.Close(context.Background())
			logs := &syncLog{}
			b := setupOn(t, e, func(c *relay.Config) {
				c.Source, c.WAL, c.PollInterval = relay.SourceWAL, wal, 50*time.Millisecond
				c.LeaseTTL, c.LeaseHeartbeat = relay.MinLeaseTTL, relay.MinLeaseTTL/4
				c.UnhealthyAfter = time.Second
				c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
			})
			eventually(t, b.ctx, "a warning naming the reader", func() bool {
				return logged(logs, "WARN", "WAL source: the slot is held by a reader that is not an outbox relay", "error", `application_name "pg_recvlogical"`)
			})
			if logOnly {
				eventually(t, b.ctx, "the log-only relay not ready", func() bool {
					err := b.r.Ready()
					return err != nil && strings.Contains(err.Error(), "not by an outbox relay")
				})
			} else {
				b.emit(t, event("A", 1)) // claimed from the table meanwhile
				if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
					t.Fatal(err)
				}
				if err := b.r.Ready(); err != nil {
					t.Errorf("table mode not ready: %v", err)
				}
			}
			if err := reader.Close(ctx); err != nil {
				t.Fatal(err)
			}
			waitStreaming(t, b, wal.Slot)
			b.emit(t, event("A", 2))
			if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return slices.Contains(order(m, "A"), "A-2") }); err != nil {
				t.Fatal(err)
			}
			eventually(t, b.ctx, "the relay ready", func() bool { return b.r.Ready() == nil })
		})
	}
}

// TestWALUnusablePublicationDoesNotKeepWAL: an operator alters the
// publication so that it no longer publishes inserts while the relay
// streams; at its next stream the relay refuses it (saying what to run)
// and claims from the table. In table mode it also moves its slot to the
// server's current position (every 10 s at most), so that the slot does not
// keep the server's WAL, without bound, for rows the table holds. Before,
// the slot's position stayed where the stream stopped for as long as
// nobody fixed the publication, while the relay reported itself ready
// (found by a helper). Once the publication is fixed the relay streams
// again, from a claim, in order. A slot holding a logical decoding
// message of the table (a log-only writer beside this table-mode relay:
// its event is in no table) is not moved.
func TestWALUnusablePublicationDoesNotKeepWAL(t *testing.T) {
	t.Parallel()
	for _, message := range []bool{false, true} {
		t.Run(map[bool]string{false: "rows", true: "a log-only event in the slot"}[message], func(t *testing.T) {
			t.Parallel()
			e, wal := walEnv(t)
			wal.Publication = relay.PublicationName(e.Table)
			logs := &syncLog{}
			b := setupOn(t, e, func(c *relay.Config) {
				c.Source, c.WAL, c.PollInterval = relay.SourceWAL, wal, 50*time.Millisecond
				c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			})
			ctx := b.ctx
			waitStreaming(t, b, wal.Slot)
			if _, err := e.RelayDB.ExecContext(ctx, "ALTER PUBLICATION "+wal.Publication+" SET (publish = 'update')"); err != nil {
				t.Fatal(err)
			}
			// The stream ends (in life: a network cut, a restart, a deploy).
			if _, err := e.RelayDB.ExecContext(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", wal.Slot); err != nil {
				t.Fatal(err)
			}
			if message {
				if _, err := e.RelayDB.ExecContext(ctx, "SELECT pg_logical_emit_message(true, $1, 'x')", logmsg.Prefix(e.Outbox.Config().Table)); err != nil {
					t.Fatal(err)
				}
			}
			b.emit(t, event("A", 1))
			if _, err := b.pub.Wait(ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
				t.Fatalf("A-1 not claimed from the table: %v", err)
			}
			if message {
				eventually(t, ctx, "the relay leaving the slot where it is", func() bool {
					return logged(logs, "", "WAL source: not moving the unused slot: it holds logical decoding messages", "", "")
				})
				return
			}
			written := currentLSN(t, ctx, e.RelayDB)
			waitSlotPast(t, ctx, e.RelayDB, wal.Slot, written, "the unused slot moved past the writes made since")
			if b.r.OnStream() {
				t.Fatal("the relay streams a publication without inserts")
			}
			if _, err := e.RelayDB.ExecContext(ctx, "ALTER PUBLICATION "+wal.Publication+" SET (publish = 'insert')"); err != nil {
				t.Fatal(err)
			}
			waitStreaming(t, b, wal.Slot)
			wantA2(t, b, false) // the 50 ms poll may claim A-2 first on a loaded machine (a CI run)
		})
	}
}

// TestWALLogOnlyStateTableDropped: the log-only mode's state table
// (<table>_wal_log, the record of the slot's position that measures a
// lost slot's window) is dropped by hand while the relay streams. Events
// still flow, but a lost slot could not be measured: the relay says so at
// WARN, naming the table. Before, it said so at DEBUG only (found by a
// helper trying to break the WAL source).
func TestWALLogOnlyStateTableDropped(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	logs := &syncLog{}
	b := walSetup(t, e, wal, func(c *relay.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	waitStreaming(t, b, wal.Slot)
	b.emit(t, event("A", 1))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
		t.Fatal(err)
	}
	state := e.Table + "_wal_log"
	if _, err := e.RelayDB.ExecContext(b.ctx, "DROP TABLE "+state); err != nil {
		t.Fatal(err)
	}
	eventually(t, b.ctx, "a warning that the state table cannot be used", func() bool {
		return logged(logs, "WARN", "log-only mode: the slot's state table cannot be read or written", "table", "_wal_log")
	})
	b.emit(t, event("A", 2))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return slices.Contains(order(m, "A"), "A-2") }); err != nil {
		t.Fatal(err)
	}
}

// TestWALPublicationWithAnotherTable: the publication an operator named
// (WALConfig.Publication) publishes another table too. Its rows are not
// the relay's: they are skipped (by the outbox table's OID), and the
// outbox table's rows still come from the stream. Before, the first
// insert into the other table failed the stream ("not an outbox table")
// at that record at every reconnect.
func TestWALPublicationWithAnotherTable(t *testing.T) {
	t.Parallel()
	e, wal := walEnv(t)
	other := e.Table + "_other"
	wal.Publication = strings.ToLower(testdb.RandomName("outbox_test_pub_"))
	for _, q := range []string{"CREATE TABLE " + other + " (id int PRIMARY KEY)",
		"CREATE PUBLICATION " + wal.Publication + " FOR TABLE " + e.Table + ", " + other + " WITH (publish = 'insert')"} {
		if _, err := e.RelayDB.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = e.RelayDB.Exec("DROP PUBLICATION IF EXISTS " + wal.Publication) })
	logs := &syncLog{}
	b := walSetup(t, e, wal, func(c *relay.Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	waitStreaming(t, b, wal.Slot)
	if _, err := e.RelayDB.ExecContext(b.ctx, "INSERT INTO "+other+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	b.emit(t, event("A", 1))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
		t.Fatal(err)
	}
	if fromStream, fromTable := b.r.WALCounts(); fromStream != 1 {
		t.Errorf("%d events from the stream, %d claimed; want A-1 from the stream", fromStream, fromTable)
	}
	if _, err := e.RelayDB.ExecContext(b.ctx, "INSERT INTO "+other+" VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	wantA2(t, b, true)
	for _, l := range logs.lines() {
		if l["level"] == "WARN" {
			t.Errorf("WARN: %v", l)
		}
	}
}

// modeEnv is logEnv in log-only mode, walEnv otherwise.
func modeEnv(t *testing.T, logOnly bool) (*testdb.Env, relay.WALConfig) {
	t.Helper()
	if logOnly {
		return logEnv(t)
	}
	return walEnv(t)
}

// wantA2 emits A-2 and checks that A's first deliveries are [A-1 A-2]
// and, if fromStream, that A-2 came from b's stream (a relay whose
// fallback poll is short may claim it first).
func wantA2(t *testing.T, b *bundle, fromStream bool) {
	t.Helper()
	before, _ := b.r.WALCounts()
	b.emit(t, event("A", 2))
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) >= 2 })
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(firstDeliveries(order(msgs, "A"))); got != "[A-1 A-2]" {
		t.Fatalf("A first delivered as %s", got)
	}
	if now, _ := b.r.WALCounts(); fromStream && now == before {
		t.Errorf("A-2 did not come from the stream")
	}
}

// logged reports whether logs hold a line at level ("" any) whose message
// starts with msg and whose field key contains want ("" any).
func logged(logs *syncLog, level, msg, key, want string) bool {
	for _, l := range logs.lines() {
		if (level == "" || l["level"] == level) && strings.HasPrefix(fmt.Sprint(l["msg"]), msg) &&
			(want == "" || strings.Contains(fmt.Sprint(l[key]), want)) {
			return true
		}
	}
	return false
}

// currentLSN is the server's current WAL position, as text.
func currentLSN(t *testing.T, ctx context.Context, db *sql.DB) string {
	t.Helper()
	var lsn string
	if err := db.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// waitSlotPast waits until slot's confirmed position is at lsn or past
// it; what says what that means, for the failure.
func waitSlotPast(t *testing.T, ctx context.Context, db *sql.DB, slot, lsn, what string) {
	t.Helper()
	eventually(t, ctx, what, func() bool {
		var past bool
		err := db.QueryRowContext(ctx, "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", slot, lsn).Scan(&past)
		return err == nil && past
	})
}
