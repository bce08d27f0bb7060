package orm

import (
	"context"
	"testing"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// item is the business row every ORM writes.
type item struct {
	ID string `gorm:"primaryKey" bun:"id,pk" db:"id"`
}

// TestGORMSavepoints: GORM's nested Transaction (SAVEPOINT, ROLLBACK TO
// SAVEPOINT) over the wrapped *sql.DB with GORM's postgres (lib/pq and pgx
// connections), mysql and sqlite dialectors, each given the pool as Conn.
func TestGORMSavepoints(t *testing.T) {
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			testSavepoints(t, tg, func(t *testing.T, e *testdb.Env, items string) orm {
				var d gorm.Dialector
				switch tg.Dialect {
				case driver.Postgres:
					d = postgres.New(postgres.Config{Conn: e.DB})
				case driver.MySQL:
					d = mysql.New(mysql.Config{Conn: e.DB})
				case driver.SQLite:
					// gorm.io/driver/sqlite over modernc.org/sqlite: with Conn
					// set it never opens its own (mattn) driver.
					d = sqlite.New(sqlite.Config{Conn: e.DB})
				}
				db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
				if err != nil {
					t.Fatal(err)
				}
				return gormORM{db: db, items: items}
			})
		})
	}
}

type gormORM struct {
	db    *gorm.DB
	items string
}

func (g gormORM) Outer(ctx context.Context, fn func(context.Context, txn) error) error {
	return g.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return fn(tx.Statement.Context, gormTx{tx, g.items})
	})
}

type gormTx struct {
	db    *gorm.DB
	items string
}

func (g gormTx) Insert(_ context.Context, id string) error {
	return g.db.Table(g.items).Create(&item{ID: id}).Error
}

func (g gormTx) Nested(_ context.Context, fn func(context.Context, txn) error) error {
	return g.db.Transaction(func(tx *gorm.DB) error {
		return fn(tx.Statement.Context, gormTx{tx, g.items})
	})
}
