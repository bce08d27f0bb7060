package orm

import (
	"context"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestSqlxSavepoints: sqlx has no nested transactions; applications write
// SAVEPOINT, ROLLBACK TO SAVEPOINT and RELEASE SAVEPOINT by hand on the
// *sqlx.Tx, as here, over the wrapped *sql.DB on every target.
func TestSqlxSavepoints(t *testing.T) {
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			testSavepoints(t, tg, func(t *testing.T, e *testdb.Env, items string) orm {
				// The name only picks sqlx's bind variables ($1 or ?).
				name := map[driver.Dialect]string{driver.Postgres: "postgres", driver.MySQL: "mysql", driver.SQLite: "sqlite3"}[tg.Dialect]
				return sqlxORM{db: sqlx.NewDb(e.DB, name), items: items}
			})
		})
	}
}

type sqlxORM struct {
	db    *sqlx.DB
	items string
}

func (s sqlxORM) Outer(ctx context.Context, fn func(context.Context, txn) error) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(ctx, &sqlxTx{tx: tx, items: s.items, next: new(int)}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

type sqlxTx struct {
	tx    *sqlx.Tx
	items string
	next  *int // savepoint counter shared by one outer transaction
}

func (s *sqlxTx) Insert(ctx context.Context, id string) error {
	_, err := s.tx.NamedExecContext(ctx, "INSERT INTO "+s.items+" (id) VALUES (:id)", item{ID: id})
	return err
}

func (s *sqlxTx) Nested(ctx context.Context, fn func(context.Context, txn) error) error {
	*s.next++
	sp := fmt.Sprintf("sp_%d", *s.next)
	if _, err := s.tx.ExecContext(ctx, "SAVEPOINT "+sp); err != nil {
		return err
	}
	if err := fn(ctx, s); err != nil {
		if _, rbErr := s.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+sp); rbErr != nil {
			return fmt.Errorf("%w; rollback to %s: %w", err, sp, rbErr)
		}
		return err
	}
	_, err := s.tx.ExecContext(ctx, "RELEASE SAVEPOINT "+sp)
	return err
}
