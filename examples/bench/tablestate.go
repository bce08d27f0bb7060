package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/sqloutbox/outbox/driver"
)

// Table conditions are part of a measurement. Every table the bench
// creates on PostgreSQL has autovacuum (and its TOAST table's) turned off
// for it (conditionTables), so no autovacuum or autoanalyze ever runs on
// it whatever the server's settings; and no table is analyzed unless a
// mode asks for it (the drain's "analyzed" variant). What a measurement
// ran on is read back and asserted before it starts (tableState).

// Drain variants: the table as the preload left it (no statistics), or
// analyzed right after the preload.
const (
	variantNeverAnalyzed = "never_analyzed"
	variantAnalyzed      = "analyzed"
)

// conditionTables turns autovacuum off for every table of the run's
// PostgreSQL schema that does not have it off yet. Called right after the
// bench creates tables (Migrate, orders, helper tables), before rows are
// written; a no-op elsewhere (MariaDB's purge and SQLite have no per-table
// switch).
func (db *database) conditionTables(ctx context.Context) error {
	if db.dialect != driver.Postgres {
		return nil
	}
	rows, err := db.admin.QueryContext(ctx, `SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT coalesce(c.reloptions @> '{autovacuum_enabled=false}', false)`, db.schema)
	if err != nil {
		return fmt.Errorf("listing tables: %w", err)
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return err
		}
		tables = append(tables, t)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	for _, t := range tables {
		if _, err := db.admin.ExecContext(ctx, "ALTER TABLE "+t+" SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)"); err != nil {
			return fmt.Errorf("turning autovacuum off for %s: %w", t, err)
		}
	}
	return nil
}

// analyze gathers statistics for table (the drain's analyzed variant only).
func analyze(ctx context.Context, db *database, table string) error {
	var q string
	switch db.dialect {
	case driver.Postgres:
		q = "ANALYZE " + table
	case driver.MySQL:
		q = "ANALYZE TABLE " + table
	default:
		q = "ANALYZE"
	}
	rows, err := db.admin.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("analyze %s: %w", table, err)
	}
	return rows.Close()
}

// RelationSize is the size on disk of a table or one of its indexes.
type RelationSize struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
}

// TableState is what a measurement ran on, read from the server.
type TableState struct {
	Table string `json:"table"`
	// PostgreSQL: the server's autovacuum setting, the table's reloptions
	// (autovacuum_enabled=false, set by the bench), pg_stat_user_tables'
	// last_analyze and last_autoanalyze (null: never; RFC 3339 otherwise),
	// live and dead tuples.
	ServerAutovacuum string  `json:"server_autovacuum,omitempty"`
	RelOptions       string  `json:"reloptions,omitempty"`
	LastAnalyze      *string `json:"last_analyze"`
	LastAutoanalyze  *string `json:"last_autoanalyze"`
	NLiveTup         int64   `json:"n_live_tup"`
	NDeadTup         int64   `json:"n_dead_tup"`
	// MySQL/MariaDB: InnoDB's history list length (undo not yet purged,
	// server-wide; Innodb_history_list_length) and the table's persistent
	// statistics (mysql.innodb_table_stats: InnoDB computes them itself at
	// creation and recalculates them after 10 % of the rows changed).
	HistoryListLength int64   `json:"history_list_length,omitempty"`
	InnoDBStatsUpdate *string `json:"innodb_stats_last_update,omitempty"`
	InnoDBStatsRows   int64   `json:"innodb_stats_n_rows,omitempty"`
	// Relations: the table and each of its indexes (PostgreSQL
	// pg_relation_size), or the table's tablespace file (MariaDB
	// INNODB_SYS_TABLESPACES.ALLOCATED_SIZE, one file for the table and its
	// indexes).
	Relations []RelationSize `json:"relations,omitempty"`
}

// String is the state on one line.
func (s *TableState) String() string {
	if s == nil {
		return "-"
	}
	var b strings.Builder
	// Names without the run's schema.
	schema := s.Table[:strings.LastIndex(s.Table, ".")+1]
	fmt.Fprintf(&b, "%s:", strings.TrimPrefix(s.Table, schema))
	switch {
	case s.ServerAutovacuum != "":
		fmt.Fprintf(&b, " autovacuum=%s reloptions=%s last_analyze=%s last_autoanalyze=%s n_live_tup=%d n_dead_tup=%d",
			s.ServerAutovacuum, s.RelOptions, orNull(s.LastAnalyze), orNull(s.LastAutoanalyze), s.NLiveTup, s.NDeadTup)
	case s.InnoDBStatsUpdate != nil || s.HistoryListLength != 0:
		fmt.Fprintf(&b, " history_list_length=%d innodb_stats_last_update=%s innodb_stats_n_rows=%d", s.HistoryListLength, orNull(s.InnoDBStatsUpdate), s.InnoDBStatsRows)
	}
	for _, r := range s.Relations {
		fmt.Fprintf(&b, " %s=%s", strings.TrimPrefix(r.Name, schema), kib(r.Bytes))
	}
	return b.String()
}

func orNull(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

func kib(n int64) string { return fmt.Sprintf("%dKiB", n/1024) }

// tableState reads table's state. With expect set, it also asserts the
// conditions of that variant: never_analyzed wants last_analyze and
// last_autoanalyze null and autovacuum off for the table; analyzed wants
// last_analyze set (PostgreSQL; on MariaDB and SQLite nothing is
// asserted).
func (db *database) tableState(ctx context.Context, table, expect string) (*TableState, error) {
	s := &TableState{Table: table}
	switch db.dialect {
	case driver.Postgres:
		var relopts sql.NullString
		var la, laa sql.NullTime
		if err := db.admin.QueryRowContext(ctx, `SELECT current_setting('autovacuum'), array_to_string(c.reloptions, ','),
			s.last_analyze, s.last_autoanalyze, s.n_live_tup, s.n_dead_tup
			FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = $1::regclass`, table).
			Scan(&s.ServerAutovacuum, &relopts, &la, &laa, &s.NLiveTup, &s.NDeadTup); err != nil {
			return nil, fmt.Errorf("reading the state of %s: %w", table, err)
		}
		s.RelOptions = relopts.String
		s.LastAnalyze, s.LastAutoanalyze = timeOrNil(la), timeOrNil(laa)
		rows, err := db.admin.QueryContext(ctx, `SELECT $1::regclass::text, pg_relation_size($1::regclass)
			UNION ALL SELECT * FROM (SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid) FROM pg_index i WHERE i.indrelid = $1::regclass ORDER BY 1) x`, table)
		if err != nil {
			return nil, fmt.Errorf("reading the sizes of %s: %w", table, err)
		}
		if s.Relations, err = scanSizes(rows); err != nil {
			return nil, err
		}
		switch expect {
		case variantNeverAnalyzed:
			if s.LastAnalyze != nil || s.LastAutoanalyze != nil {
				return nil, fmt.Errorf("%s was analyzed (last_analyze %s, last_autoanalyze %s); the measurement wants it never analyzed", table, orNull(s.LastAnalyze), orNull(s.LastAutoanalyze))
			}
		case variantAnalyzed:
			if s.LastAnalyze == nil {
				return nil, fmt.Errorf("%s: last_analyze is null after ANALYZE", table)
			}
		}
		if expect != "" && !strings.Contains(s.RelOptions, "autovacuum_enabled=false") {
			return nil, fmt.Errorf("%s: autovacuum is not off for the table (reloptions %q)", table, s.RelOptions)
		}
	case driver.MySQL:
		var name string
		if err := db.admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'").Scan(&name, &s.HistoryListLength); err != nil {
			return nil, fmt.Errorf("reading the history list length: %w", err)
		}
		bare := table[strings.LastIndex(table, ".")+1:]
		var upd sql.NullString
		err := db.admin.QueryRowContext(ctx, "SELECT CAST(last_update AS CHAR), n_rows FROM mysql.innodb_table_stats WHERE database_name = ? AND table_name = ?", db.schema, bare).
			Scan(&upd, &s.InnoDBStatsRows)
		if err != nil && err != sql.ErrNoRows {
			return nil, fmt.Errorf("reading the statistics of %s: %w", table, err)
		}
		if upd.Valid {
			s.InnoDBStatsUpdate = &upd.String
		}
		rows, err := db.admin.QueryContext(ctx, "SELECT NAME, ALLOCATED_SIZE FROM information_schema.INNODB_SYS_TABLESPACES WHERE NAME = ?", db.schema+"/"+bare)
		if err != nil {
			return nil, fmt.Errorf("reading the size of %s: %w", table, err)
		}
		if s.Relations, err = scanSizes(rows); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func timeOrNil(t sql.NullTime) *string {
	if !t.Valid {
		return nil
	}
	s := t.Time.UTC().Format("2006-01-02T15:04:05Z")
	return &s
}

func scanSizes(rows *sql.Rows) ([]RelationSize, error) {
	var out []RelationSize
	for rows.Next() {
		var r RelationSize
		if err := rows.Scan(&r.Name, &r.Bytes); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Close()
}
