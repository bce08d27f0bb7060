package tests

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
)

// TestMigrateFromVersion3 upgrades a table left at schema version 3 (the
// hold index over every unsent row) on the dialects whose version 4
// replaces it with held_idx, and checks the recorded version and the
// index set. (Claims against held_idx are covered by every hold test.)
func TestMigrateFromVersion3(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{testdb.All[0], testdb.All[3]} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := driver.Config{Dialect: tg.Dialect, Table: e.Table}
			base, schema := e.Table, ""
			if e.Schema != "" {
				base = e.Table[len(e.Schema)+1:]
				schema = e.Schema + "."
			}
			// Back to version 3: hold_idx as version 1 made it, no held_idx,
			// no meta table (version 5), no relay mode (SQLite 6,
			// PostgreSQL 7).
			for _, q := range []string{
				"DROP INDEX " + schema + base + "_held_idx",
				"CREATE INDEX " + base + "_hold_idx ON " + e.Table + " (aggregate_type, aggregate_id, next_retry_at) WHERE status <> 1",
				"DROP TABLE " + e.Table + "_meta",
				"ALTER TABLE " + e.Table + "_relay DROP COLUMN mode",
				"DELETE FROM " + e.Table + "_migrations WHERE version >= 4",
			} {
				if tg.Dialect == driver.SQLite && q[:6] == "CREATE" {
					q = "CREATE INDEX " + base + "_hold_idx ON " + base + " (aggregate_type, aggregate_id, next_retry_at) WHERE status <> 1"
				}
				if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			want, err := driver.LatestSchemaVersion(tg.Dialect)
			if err != nil {
				t.Fatal(err)
			}
			if v, latest, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || v != 3 || latest != want {
				t.Fatalf("SchemaVersion = %d, %d, %v; want 3, %d", v, latest, err, want)
			}
			if err := driver.Migrate(ctx, e.RelayDB, cfg); err != nil {
				t.Fatal(err)
			}
			if v, _, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || v != want {
				t.Fatalf("after Migrate: version %d, %v; want %d", v, err, want)
			}
			got := indexNames(t, ctx, e)
			if got[base+"_hold_idx"] || !got[base+"_held_idx"] {
				t.Fatalf("indexes after upgrade: %v; want %s_held_idx and no %s_hold_idx", got, base, base)
			}
		})
	}
}

func indexNames(t *testing.T, ctx context.Context, e *testdb.Env) map[string]bool {
	t.Helper()
	var rows *sql.Rows
	var err error
	if e.Target.Dialect == driver.Postgres {
		rows, err = e.RelayDB.QueryContext(ctx, "SELECT indexname FROM pg_indexes WHERE schemaname = $1", e.Schema)
	} else {
		rows, err = e.RelayDB.QueryContext(ctx, "SELECT name FROM sqlite_master WHERE type = 'index'")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		got[n] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestMarkSentAsyncCommitStaysInItsTransaction: on PostgreSQL mark-sent
// commits with synchronous_commit off, set for its own transaction only;
// the relay's pooled connection must come back with the server's setting
// (lease writes and dead-letter marks keep waiting for the flush).
func TestMarkSentAsyncCommitStaysInItsTransaction(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[0], driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("a", 1)) }); err != nil {
		t.Fatal(err)
	}
	d, err := dialect.New(dialect.Postgres, e.Table)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := e.RelayDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var id int64
	if err := conn.QueryRowContext(ctx, "SELECT id FROM "+e.Table).Scan(&id); err != nil {
		t.Fatal(err)
	}
	q, args := d.MarkSent([]int64{id}, "")
	res, err := conn.ExecContext(ctx, q, args...)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("mark-sent updated %d rows, want 1", n)
	}
	var setting string
	if err := conn.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "on" {
		t.Fatalf("after mark-sent the connection has synchronous_commit = %s, want on", setting)
	}
}

// TestMigrateToVersion6NamesTheSequence upgrades a PostgreSQL table at
// schema version 5 whose identity sequence does not have the name the
// version 6 commit hook calls nextval on (a table renamed after it was
// created keeps its sequence's old name): the migration renames it to
// <table>_id_seq and sets CACHE 1, the rows written before keep their ids
// and are published, and the ids written after continue above them.
func TestMigrateToVersion6NamesTheSequence(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[0], driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 1; i <= 3; i++ {
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("before", i)) }); err != nil {
			t.Fatal(err)
		}
	}
	base := e.Table[len(e.Schema)+1:]
	// Back to version 5, with the sequence under another name and cached.
	for _, q := range []string{
		"DROP FUNCTION " + e.Table + "_claim",
		"ALTER SEQUENCE " + e.Table + "_id_seq RENAME TO " + base + "_legacy_ids",
		"ALTER SEQUENCE " + e.Schema + "." + base + "_legacy_ids CACHE 20",
		"ALTER TABLE " + e.Table + "_meta DROP COLUMN floor_epoch",
		"ALTER TABLE " + e.Table + "_relay DROP COLUMN mode",
		"DELETE FROM " + e.Table + "_migrations WHERE version >= 6",
	} {
		if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg := driver.Config{Dialect: driver.Postgres, Table: e.Table}
	want, err := driver.LatestSchemaVersion(driver.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	if v, latest, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || v != 5 || latest != want {
		t.Fatalf("SchemaVersion = %d, %d, %v; want 5, %d", v, latest, err, want)
	}
	if err := driver.Migrate(ctx, e.RelayDB, cfg); err != nil {
		t.Fatal(err)
	}
	var seq string
	var cache int64
	if err := e.RelayDB.QueryRowContext(ctx,
		"SELECT pg_get_serial_sequence($1, 'id'), s.seqcache FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence($1, 'id')::regclass",
		e.Table).Scan(&seq, &cache); err != nil {
		t.Fatal(err)
	}
	if want := e.Schema + "." + base + "_id_seq"; seq != want || cache != 1 {
		t.Fatalf("after Migrate the id sequence is %s with CACHE %d, want %s with CACHE 1", seq, cache, want)
	}
	var epoch int64
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT floor_epoch FROM "+e.Table+"_meta WHERE id = 1").Scan(&epoch); err != nil || epoch != 0 {
		t.Fatalf("meta floor_epoch = %d, %v; want 0", epoch, err)
	}
	for i := 1; i <= 2; i++ {
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("after", i)) }); err != nil {
			t.Fatalf("commit after the upgrade: %v", err)
		}
	}
	var maxBefore, minAfter int64
	if err := e.RelayDB.QueryRowContext(ctx,
		"SELECT MAX(id) FILTER (WHERE aggregate_id = 'before'), MIN(id) FILTER (WHERE aggregate_id = 'after') FROM "+e.Table).Scan(&maxBefore, &minAfter); err != nil {
		t.Fatal(err)
	}
	if minAfter <= maxBefore {
		t.Fatalf("ids after the upgrade start at %d, not above the %d written before", minAfter, maxBefore)
	}
	pub := outboxtest.NewPublisher()
	startRelay(t, e, pub, nil)
	msgs, err := pub.WaitForCount(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.AggregateID)
	}
	if fmt.Sprint(got) != "[before before before after after]" {
		t.Fatalf("published %v, want the three rows from before the upgrade, then the two after", got)
	}
}

// TestMigrateAddsRelayMode upgrades a table from the version before the
// relay mode (PostgreSQL 6, MySQL/MariaDB 4, SQLite 5) with a relay's
// membership row in it: the row takes the mode every earlier build ran
// ('at-least-once'). On the servers whose DDL commits by itself the
// migration must be idempotent (a failure before the version is recorded
// is finished by the next run): running it again over the added column
// must succeed.
func TestMigrateAddsRelayMode(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, time.Minute)
		d, err := dialect.New(dialect.Name(tg.Dialect), e.Table)
		if err != nil {
			t.Fatal(err)
		}
		mode := migrationVersion(d, "relay_mode")
		if mode == 0 || mode > d.LatestVersion() {
			t.Fatalf("relay_mode migration is version %d, latest %d", mode, d.LatestVersion())
		}
		far := "'2999-01-01 00:00:00'"
		if tg.Dialect == driver.SQLite {
			far = "32503680000000"
		}
		mustExec(t, e.RelayDB, "ALTER TABLE "+e.Table+"_relay DROP COLUMN mode")
		mustExec(t, e.RelayDB, d.Bind("DELETE FROM "+e.Table+"_migrations WHERE version >= ?"), mode)
		mustExec(t, e.RelayDB, "INSERT INTO "+e.Table+"_relay (instance_id, expires_at) VALUES ('old-build', "+far+")")
		cfg := driver.Config{Dialect: tg.Dialect, Table: e.Table}
		if v, latest, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || v != mode-1 || latest != d.LatestVersion() {
			t.Fatalf("SchemaVersion = %d, %d, %v; want %d, %d", v, latest, err, mode-1, d.LatestVersion())
		}
		if err := driver.Migrate(ctx, e.RelayDB, cfg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := e.RelayDB.QueryRowContext(ctx, "SELECT mode FROM "+e.Table+"_relay WHERE instance_id = 'old-build'").Scan(&got); err != nil || got != "at-least-once" {
			t.Fatalf("mode of the earlier build's membership = %q, %v; want at-least-once", got, err)
		}
		if tg.Dialect == driver.SQLite {
			return // one transaction: a failed migration leaves nothing to finish
		}
		mustExec(t, e.RelayDB, d.Bind("DELETE FROM "+e.Table+"_migrations WHERE version >= ?"), mode)
		if err := driver.Migrate(ctx, e.RelayDB, cfg); err != nil {
			t.Fatalf("Migrate again over the added column: %v", err)
		}
		if v, _, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || v != d.LatestVersion() {
			t.Fatalf("after the second Migrate: version %d, %v; want %d", v, err, d.LatestVersion())
		}
	})
}

// TestMigrateSaysWhere: Migrate logs at INFO which database and table it
// created the schema in (a DSN without a database name writes into the
// driver's default one, and nothing else would say so), and nothing when
// the schema is already up to date.
func TestMigrateSaysWhere(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, time.Minute)
		var logs testdb.SyncBuffer
		cfg := driver.Config{Dialect: tg.Dialect, Table: e.Table + "_fresh", Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
		want := map[driver.Dialect]string{driver.Postgres: "SELECT current_database()", driver.MySQL: "SELECT DATABASE()", driver.SQLite: "SELECT file FROM pragma_database_list WHERE name = 'main'"}[tg.Dialect]
		var db sql.NullString
		if err := e.RelayDB.QueryRowContext(ctx, want).Scan(&db); err != nil {
			t.Fatal(err)
		}
		_, latest, err := driver.SchemaVersion(ctx, e.RelayDB, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := driver.Migrate(ctx, e.RelayDB, cfg); err != nil {
			t.Fatal(err)
		}
		lines := jsonLines(t, &logs)
		if len(lines) != 1 || lines[0]["msg"] != "outbox schema created" || lines[0]["level"] != "INFO" ||
			lines[0]["table"] != cfg.Table || lines[0]["from_version"] != 0.0 || lines[0]["to_version"] != float64(latest) {
			t.Fatalf("log after creating: %v", lines)
		}
		if got := lines[0]["database"]; db.Valid && got != db.String {
			t.Errorf("database %v, want %q", got, db.String)
		}
		if err := driver.Migrate(ctx, e.RelayDB, cfg); err != nil {
			t.Fatal(err)
		}
		if lines := jsonLines(t, &logs); len(lines) != 1 {
			t.Errorf("Migrate of an up-to-date schema logged: %v", lines[1:])
		}
	})
}

// jsonLines parses the JSON log lines written to b.
func jsonLines(t *testing.T, b *testdb.SyncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// migrationVersion is the version of d's migration named name (0: none).
func migrationVersion(d *dialect.Dialect, name string) int {
	for _, m := range d.Migrations() {
		if m.Name == name {
			return m.Version
		}
	}
	return 0
}

// TestDeadIndexIsOptional: the dead letters' index (PostgreSQL 8, SQLite
// 7) is marked optional: a build whose latest migration it was ran its
// writers and relays on the version before. The pending set (PostgreSQL
// 9, SQLite 8) is required and comes after it, so this build needs both:
// a table without them is refused by the relays' check
// (ErrSchemaOutdated), reports the older version, and Migrate adds them
// back. On MySQL/MariaDB, whose (status, id) index has served since
// version 1, there is no such migration and every version is required.
func TestDeadIndexIsOptional(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, time.Minute)
		d, err := dialect.New(dialect.Name(tg.Dialect), e.Table)
		if err != nil {
			t.Fatal(err)
		}
		v := migrationVersion(d, "dead_idx")
		if tg.Dialect == driver.MySQL {
			if v != 0 || d.RequiredVersion() != d.LatestVersion() {
				t.Fatalf("MySQL: dead_idx migration %d, required %d, latest %d", v, d.RequiredVersion(), d.LatestVersion())
			}
			return
		}
		// The pending set follows it and is required; after that only
		// optional migrations (PostgreSQL 10: the held dead letters'
		// index, for the admin page).
		pv := migrationVersion(d, "pending")
		if v == 0 || !d.Migrations()[v-1].Optional || pv != v+1 || d.RequiredVersion() != pv {
			t.Fatalf("dead_idx migration is version %d, pending set %d, required %d, latest %d; want it optional, followed by the required pending set", v, pv, d.RequiredVersion(), d.LatestVersion())
		}
		for _, m := range d.Migrations()[pv:] {
			if !m.Optional {
				t.Fatalf("migration %d (%s) after the pending set is required, want optional", m.Version, m.Name)
			}
		}
		exists := func() bool {
			q := "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'outbox_message_dead_idx'"
			args := []any{e.Schema}
			if tg.Dialect == driver.SQLite {
				q, args = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'outbox_message_dead_idx'", nil
			}
			var n int
			if err := e.RelayDB.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1
		}
		if !exists() {
			t.Fatal("Migrate did not create the dead letters' index")
		}
		drop := "DROP INDEX " + e.Schema + ".outbox_message_dead_idx"
		if tg.Dialect == driver.SQLite {
			drop = "DROP INDEX outbox_message_dead_idx"
		}
		mustExec(t, e.RelayDB, drop)
		mustExec(t, e.RelayDB, d.Bind("DELETE FROM "+e.Table+"_migrations WHERE version >= ?"), v)
		if err := d.Check(ctx, e.RelayDB); !errors.Is(err, dialect.ErrSchemaOutdated) {
			t.Fatalf("the relays' check of a table at version %d: %v, want ErrSchemaOutdated (the pending set is required)", v-1, err)
		}
		cfg := driver.Config{Dialect: tg.Dialect, Table: e.Table}
		if cur, latest, err := driver.SchemaVersion(ctx, e.RelayDB, cfg); err != nil || cur != v-1 || latest != d.LatestVersion() {
			t.Fatalf("SchemaVersion = %d, %d, %v; want %d, %d", cur, latest, err, v-1, d.LatestVersion())
		}
		if err := driver.Migrate(ctx, e.RelayDB, cfg); err != nil {
			t.Fatal(err)
		}
		if !exists() {
			t.Fatal("Migrate did not add the dead letters' index back")
		}
	})
}
