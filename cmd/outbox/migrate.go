package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sqloutbox/outbox/driver"
)

// open parses --dsn, connects within ctx and returns the target and its
// database. mustExist: see connect.
func (a *app) open(ctx context.Context, mustExist bool) (*target, *sql.DB, error) {
	t, err := parseDSN(a.dsn)
	if err != nil {
		return nil, nil, err
	}
	// Validate the table name before touching the database.
	if _, err := driver.New(driver.Config{Dialect: t.dialect, Table: a.table}); err != nil {
		return nil, nil, err
	}
	db, err := connect(ctx, t, mustExist)
	if err != nil {
		return nil, nil, err
	}
	if t.dialect == driver.SQLite {
		db.SetMaxOpenConns(1) // one writer at a time: queue in database/sql
	}
	return t, db, nil
}

// commandContext bounds a command's database work by --timeout.
func (a *app) commandContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), a.timeout)
}

func (a *app) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, check or print the outbox schema",
		Long: `Apply, check or print the outbox table's schema (the table, its lease,
relay-member, archive and migrations tables). The schema is versioned and
ships inside this build.`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	var applyPartitions int
	apply := &cobra.Command{
		Use:   "apply",
		Short: "Create or upgrade the outbox table (safe to run twice and concurrently)",
		Long: `Create or upgrade the outbox table named by --table to the schema version
this build needs. Safe to run twice and from several processes at once
(PostgreSQL: advisory lock and transactional DDL; MySQL/MariaDB: GET_LOCK;
SQLite: BEGIN IMMEDIATE). A missing SQLite file is created.

The relay partition count is stored in the table the first time: --partitions
(default 32) on a new table; an existing table keeps the size of its lease
table. With --partitions on a table that already stores another count, it
migrates and then exits 1 (relay.Repartition changes the count).`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, args []string) error {
			return a.migrateApply(cmd, applyPartitions)
		}),
	}
	apply.Flags().IntVar(&applyPartitions, "partitions", 0, "relay partition count of a new table (default 32); on an existing one, the count it must store")
	cmd.AddCommand(apply)
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "Show the schema version; exit 3 if it is not up to date",
		Long: `Show the outbox table's applied schema version and the version this build
needs. Exits 0 when they are equal, 3 when they differ (not migrated,
outdated, or migrated by a newer build), 1 on a database error.`,
		Args: cobra.NoArgs,
		RunE: a.wrap(a.migrateStatus),
	})
	var dialect string
	var printPartitions int
	printCmd := &cobra.Command{
		Use:   "print",
		Short: "Print the schema DDL for your own migration tool (no database needed)",
		Long: `Print the schema as SQL statements for --dialect and --table, for teams that
apply migrations with goose, atlas or Flyway. Needs no database; without
--dialect the dialect is inferred from --dsn. The migrations bookkeeping
table that 'migrate apply' keeps is not included.`,
		Example: "  outbox migrate print --dialect postgres --table app.outbox_message",
		Args:    cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
			return a.migratePrint(dialect, printPartitions)
		}),
	}
	printCmd.Flags().StringVar(&dialect, "dialect", "", "postgres, mysql (also MariaDB) or sqlite; default inferred from --dsn")
	printCmd.Flags().IntVar(&printPartitions, "partitions", 0, "relay partition count the schema stores on a new table (default 32)")
	cmd.AddCommand(printCmd)
	return cmd
}

func (a *app) migrateApply(cmd *cobra.Command, partitions int) error {
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	t, db, err := a.open(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg := driver.Config{Dialect: t.dialect, Table: a.table, Partitions: partitions}
	ob, err := driver.New(cfg)
	if err != nil {
		return err
	}
	before, _, err := driver.SchemaVersion(ctx, db, cfg)
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx, db); err != nil {
		return err
	}
	after, latest, err := driver.SchemaVersion(ctx, db, cfg)
	if err != nil {
		return err
	}
	parts, err := ob.PartitionCount(ctx, db)
	if err != nil {
		return err
	}
	if a.json {
		return writeJSON(a.stdout, map[string]any{
			"table": a.table, "dialect": t.dialect, "previous": before, "current": after, "latest": latest, "partitions": parts,
		})
	}
	if before == after {
		fmt.Fprintf(a.stdout, "table %s (%s) is up to date at schema version %d, %d relay partitions\n", a.table, t.dialect, after, parts)
	} else {
		fmt.Fprintf(a.stdout, "migrated table %s (%s) from schema version %d to %d, %d relay partitions\n", a.table, t.dialect, before, after, parts)
	}
	return nil
}

func (a *app) migrateStatus(cmd *cobra.Command, _ []string) error {
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	// A missing SQLite file is "not migrated" (exit 3), and status must not
	// create it as a side effect: read it only if it exists.
	t, err := parseDSN(a.dsn)
	if err != nil {
		return err
	}
	cur, latest := 0, 0
	if _, statErr := os.Stat(t.path); t.dialect == driver.SQLite && errors.Is(statErr, os.ErrNotExist) {
		if _, err := driver.New(driver.Config{Dialect: t.dialect, Table: a.table}); err != nil {
			return err
		}
		if latest, err = driver.LatestSchemaVersion(t.dialect); err != nil {
			return err
		}
	} else {
		t, db, err := a.open(ctx, false)
		if err != nil {
			return err
		}
		defer db.Close()
		if cur, latest, err = driver.SchemaVersion(ctx, db, driver.Config{Dialect: t.dialect, Table: a.table}); err != nil {
			return err
		}
	}
	upToDate := cur == latest
	if a.json {
		if err := writeJSON(a.stdout, map[string]any{
			"table": a.table, "dialect": t.dialect, "current": cur, "latest": latest, "up_to_date": upToDate,
		}); err != nil {
			return err
		}
	} else {
		verdict := "up to date"
		switch {
		case cur == 0:
			verdict = "not migrated: run `outbox migrate apply`"
		case cur < latest:
			verdict = "outdated: run `outbox migrate apply`"
		case cur > latest:
			verdict = "newer than this build: use a newer outbox command"
		}
		fmt.Fprintf(a.stdout, "table %s (%s): schema version %d, this build needs %d: %s\n", a.table, t.dialect, cur, latest, verdict)
	}
	if !upToDate {
		return &exitError{code: exitOutdated}
	}
	return nil
}

func (a *app) migratePrint(dialect string, partitions int) error {
	var d driver.Dialect
	switch strings.ToLower(dialect) {
	case "postgres", "postgresql", "pg":
		d = driver.Postgres
	case "mysql", "mariadb":
		d = driver.MySQL
	case "sqlite", "sqlite3":
		d = driver.SQLite
	case "":
		if a.dsn == "" {
			return usageErrorf("migrate print needs --dialect (postgres, mysql or sqlite) or --dsn")
		}
		t, err := parseDSN(a.dsn)
		if err != nil {
			return err
		}
		d = t.dialect
	default:
		return usageErrorf("unknown --dialect %q: want postgres, mysql or sqlite", dialect)
	}
	ddl, err := driver.DDL(driver.Config{Dialect: d, Table: a.table, Partitions: partitions})
	if err != nil {
		return err
	}
	if a.json {
		return writeJSON(a.stdout, map[string]any{"table": a.table, "dialect": d, "ddl": ddl})
	}
	_, err = fmt.Fprint(a.stdout, ddl)
	return err
}
