package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// roleWithoutReplication creates a login role of t's own without the
// REPLICATION attribute, with every privilege on e's schema and tables
// (the role an application's relay might run as before its operator
// grants REPLICATION), dropped when t ends; it returns a DSN of e's
// database as that role.
func roleWithoutReplication(t *testing.T, e *testdb.Env) string {
	t.Helper()
	role := strings.ToLower(testdb.RandomName("outbox_test_role_"))
	schema, _, ok := strings.Cut(e.Table, ".")
	if !ok {
		t.Fatalf("table %s has no schema", e.Table)
	}
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN NOREPLICATION NOSUPERUSER",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + role,
	} {
		if _, err := e.RelayDB.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Runs after the relays stopped (registered before them); the
		// role's privileges go with DROP OWNED.
		for _, q := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := e.RelayDB.Exec(q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// TestWALRoleWithoutReplication: a role without the REPLICATION attribute
// (a misconfiguration the guide names) gets clear errors where it meets
// the WAL source, and loses nothing:
//   - a relay with the WAL source whose WALConfig.DSN is that role's says
//     why it cannot stream (the server's "permission denied to start WAL
//     sender" / "must be superuser or replication role"), and claims from
//     the table meanwhile: are published;
//   - a relay of the log-only mode, whose events are in no table, is not
//     ready (ErrUnhealthy, with the server's error) once its stream has
//     not opened for UnhealthyAfter, and ready again once the role has
//     REPLICATION and the stream opened (A-1 published);
//   - relay.CreateWAL as that role fails with ErrWALUnavailable naming the
//     server's refusal: to create the publication (the role does not own
//     the table), then, once the owner made it, to create the slot;
//   - relay.Repartition as that role, with a log-only slot recorded, is
//     refused with ErrNotDrained: it cannot read the slot to check it.
func TestWALRoleWithoutReplication(t *testing.T) {
	t.Parallel()
	t.Run("relay", func(t *testing.T) {
		t.Parallel()
		e, wal := walEnv(t)
		wal.DSN = roleWithoutReplication(t, e)
		var logs testdb.SyncBuffer
		b := walSetup(t, e, wal, func(c *relay.Config) {
			c.PollInterval = 50 * time.Millisecond // the table is the only way here
			c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		})
		b.emit(t, event("A", 1))
		b.emit(t, event("A", 2))
		msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 2 })
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(order(msgs, "A")); got != "[A-1 A-2]" {
			t.Fatalf("A delivered as %s", got)
		}
		eventually(t, b.ctx, "a log line saying why the WAL source cannot stream", func() bool {
			s := logs.String()
			return strings.Contains(s, "WAL source unavailable") && (strings.Contains(s, "replication role") || strings.Contains(s, "permission denied"))
		})
		if b.r.OnStream() {
			t.Fatal("the relay claims to stream")
		}
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "WAL source unavailable") {
				t.Log(l)
				break
			}
		}
		if stream, _ := b.r.WALCounts(); stream != 0 {
			t.Fatalf("%d messages from a stream that cannot open", stream)
		}
	})

	t.Run("log-only relay", func(t *testing.T) {
		t.Parallel()
		e, wal := logEnv(t)
		// Made ahead by the table's owner (`outbox wal create`), so that
		// the relay's role needs no privilege on the schema (before the
		// fix its CREATE TABLE IF NOT EXISTS of the state table failed).
		if _, err := relay.CreateWAL(t.Context(), e.Outbox, e.RelayDB, wal); err != nil {
			t.Fatal(err)
		}
		dsn := roleWithoutReplication(t, e)
		wal.DSN = dsn
		b := walSetup(t, e, wal, func(c *relay.Config) { c.UnhealthyAfter = 500 * time.Millisecond })
		b.emit(t, event("A", 1)) // in the slot only: nothing relays it while the stream cannot open
		eventually(t, b.ctx, "the log-only relay not ready", func() bool {
			err := b.r.Ready()
			return errors.Is(err, relay.ErrUnhealthy) && strings.Contains(err.Error(), "replication role")
		})
		t.Log(b.r.Ready())
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.RelayDB.Exec("ALTER ROLE " + u.User.Username() + " REPLICATION"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
			t.Fatal(err)
		}
		eventually(t, b.ctx, "the log-only relay ready once it streams", func() bool { return b.r.Ready() == nil })
	})

	t.Run("CreateWAL", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		e, wal := walEnv(t)
		dsn := roleWithoutReplication(t, e)
		db := openDB(t, dsn)
		_, err := relay.CreateWAL(ctx, e.Outbox, db, wal)
		if !errors.Is(err, relay.ErrWALUnavailable) || !strings.Contains(err.Error(), "creating publication") || !strings.Contains(err.Error(), "42501") {
			t.Fatalf("CreateWAL as a role that owns not the table = %v, want ErrWALUnavailable with the server's refusal to create the publication (42501)", err)
		}
		// The table's owner created the publication, and the role may
		// create the state table in the schema: the slot is refused.
		schema, _, _ := strings.Cut(e.Table, ".")
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"CREATE PUBLICATION " + relay.PublicationName(e.Table) + " FOR TABLE " + e.Table + " WITH (publish = 'insert')",
			"GRANT CREATE ON SCHEMA " + schema + " TO " + u.User.Username()} {
			if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		_, err = relay.CreateWAL(ctx, e.Outbox, db, wal)
		if !errors.Is(err, relay.ErrWALUnavailable) || !strings.Contains(err.Error(), "creating slot") || !strings.Contains(err.Error(), "42501") {
			t.Fatalf("CreateWAL as a role without REPLICATION = %v, want ErrWALUnavailable with the server's refusal to create the slot (42501)", err)
		}
		t.Log(err)
	})

	t.Run("Repartition", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		e, wal := logEnv(t)
		if _, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, wal); err != nil {
			t.Fatal(err)
		}
		db := openDB(t, roleWithoutReplication(t, e))
		err := relay.Repartition(ctx, e.Outbox, db, 4)
		if !errors.Is(err, relay.ErrNotDrained) || !strings.Contains(err.Error(), "the role needs REPLICATION") || !strings.Contains(err.Error(), wal.Slot) {
			t.Fatalf("Repartition as a role without REPLICATION = %v, want ErrNotDrained naming the slot and the attribute", err)
		}
		if got, err := e.Outbox.PartitionCount(ctx, e.RelayDB); err != nil || got == 4 {
			t.Fatalf("stored count = %d, %v; want it unchanged", got, err)
		}
	})
}

// openDB opens a pool to dsn (pgx), closed when t ends.
func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
