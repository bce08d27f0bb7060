package orm

import (
	"context"
	"testing"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestBunSavepoints: bun's RunInTx on a bun.Tx (SAVEPOINT, ROLLBACK TO
// SAVEPOINT, RELEASE SAVEPOINT) over the wrapped *sql.DB with pgdialect
// (lib/pq and pgx connections), mysqldialect and sqlitedialect.
func TestBunSavepoints(t *testing.T) {
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			testSavepoints(t, tg, func(t *testing.T, e *testdb.Env, items string) orm {
				var d schema.Dialect
				switch tg.Dialect {
				case driver.Postgres:
					d = pgdialect.New()
				case driver.MySQL:
					d = mysqldialect.New()
				case driver.SQLite:
					d = sqlitedialect.New()
				}
				// Not closed: bun's Close closes e.DB, which testdb owns.
				return bunORM{db: bun.NewDB(e.DB, d), items: items}
			})
		})
	}
}

type bunORM struct {
	db    *bun.DB
	items string
}

func (b bunORM) Outer(ctx context.Context, fn func(context.Context, txn) error) error {
	return b.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		return fn(ctx, bunTx{tx, b.items})
	})
}

type bunTx struct {
	tx    bun.Tx
	items string
}

func (b bunTx) Insert(ctx context.Context, id string) error {
	_, err := b.tx.NewInsert().Model(&item{ID: id}).ModelTableExpr(b.items).Exec(ctx)
	return err
}

func (b bunTx) Nested(ctx context.Context, fn func(context.Context, txn) error) error {
	return b.tx.RunInTx(ctx, nil, func(ctx context.Context, sp bun.Tx) error {
		return fn(ctx, bunTx{sp, b.items})
	})
}
