package driver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestRawUnwrapsToTheDriversConnection: inside (*sql.Conn).Raw the
// connection is the wrapper's, and driver.Unwrap returns the driver's own
// (its type is the driver package's), on every target; Unwrap of what the
// wrapper did not make returns it unchanged.
func TestRawUnwrapsToTheDriversConnection(t *testing.T) {
	t.Parallel()
	pkgs := map[string]string{
		"pq":     "github.com/lib/pq",
		"pgx":    "github.com/jackc/pgx/v5/stdlib",
		"mysql":  "github.com/go-sql-driver/mysql",
		"sqlite": "modernc.org/sqlite",
	}
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			ctx := context.Background()
			c, err := e.DB.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = c.Raw(func(dc any) error {
				if pkgOf(dc) != "github.com/sqloutbox/outbox/driver" {
					t.Errorf("Raw got %T, want the wrapper's connection", dc)
				}
				inner := driver.Unwrap(dc)
				if got := pkgOf(inner); got != pkgs[tg.Name] {
					t.Errorf("Unwrap returned %T (package %s), want the driver's connection from %s", inner, got, pkgs[tg.Name])
				}
				if again := driver.Unwrap(inner); again != inner {
					t.Errorf("Unwrap of the driver's connection returned %T, want it unchanged", again)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMySQLMultiResultThroughRaw: go-sql-driver/mysql's documented
// multi-result API (driver.Execer inside Raw, the result asserted to
// mysql.Result) works on a wrapped connection: the result is the driver's
// own. Under sqlmw it was sqlmw's result type, without AllRowsAffected.
func TestMySQLMultiResultThroughRaw(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.Target{Name: "mysql", Dialect: driver.MySQL}, driver.Config{})
	cfg, err := mysql.ParseDSN(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MultiStatements = true
	mc, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(e.Outbox.WrapConnector(mc))
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE multi (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(8))"); err != nil {
		t.Fatal(err)
	}
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Raw(func(dc any) error {
		//lint:ignore SA1019 go-sql-driver/mysql documents its multi-result API through Execer
		ex, ok := dc.(sqldriver.Execer)
		if !ok {
			t.Fatalf("%T is not a driver.Execer", dc)
		}
		res, err := ex.Exec("INSERT INTO multi (v) VALUES ('a'), ('b'); INSERT INTO multi (v) VALUES ('c'), ('d'), ('e')", nil)
		if err != nil {
			return err
		}
		mres, ok := res.(mysql.Result)
		if !ok {
			t.Fatalf("result %T is not a mysql.Result", res)
		}
		if got, want := mres.AllRowsAffected(), []int64{2, 3}; !slices.Equal(got, want) {
			t.Errorf("AllRowsAffected = %v, want %v", got, want)
		}
		if got, want := mres.AllLastInsertIds(), []int64{1, 3}; !slices.Equal(got, want) {
			t.Errorf("AllLastInsertIds = %v, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// pkgOf is the package path of v's (pointed-to) type.
func pkgOf(v any) string {
	ty := reflect.TypeOf(v)
	if ty.Kind() == reflect.Pointer {
		ty = ty.Elem()
	}
	return ty.PkgPath()
}

// TestPreparedControlStatementUsesConnectionChecker: a savepoint command
// prepared through the wrapper gets the wrapper's statement type; its
// arguments are still checked by the driver's connection when the driver's
// statement has no checker, as database/sql does without the wrapper. (It
// answered driver.ErrSkip, so database/sql's default conversion rejected
// what the connection's checker accepts.)
func TestPreparedControlStatementUsesConnectionChecker(t *testing.T) {
	t.Parallel()
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]sqldriver.Connector{
		"driver":  checkerConnector{},
		"wrapped": ob.WrapConnector(checkerConnector{}),
	} {
		t.Run(name, func(t *testing.T) {
			db := sql.OpenDB(c)
			defer db.Close()
			for _, q := range []string{"SELECT $1", "RELEASE SAVEPOINT x"} {
				st, err := db.Prepare(q)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.Exec(checkedValue{}); err != nil {
					t.Errorf("%s: %v", q, err)
				}
				st.Close()
			}
		})
	}
}

// checkedValue is a type only checkerConn's CheckNamedValue accepts.
type checkedValue struct{}

type checkerConnector struct{}

func (checkerConnector) Connect(context.Context) (sqldriver.Conn, error) { return checkerConn{}, nil }
func (checkerConnector) Driver() sqldriver.Driver                        { return nil }

// checkerConn checks arguments; its statements do not.
type checkerConn struct{}

func (checkerConn) Prepare(string) (sqldriver.Stmt, error) { return checkerStmt{}, nil }
func (checkerConn) Close() error                           { return nil }
func (checkerConn) Begin() (sqldriver.Tx, error)           { return nil, errors.New("no transactions") }

func (checkerConn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if _, ok := nv.Value.(checkedValue); ok {
		nv.Value = "checked"
		return nil
	}
	return sqldriver.ErrSkip
}

type checkerStmt struct{}

func (checkerStmt) Close() error  { return nil }
func (checkerStmt) NumInput() int { return 1 }
func (checkerStmt) Exec(args []sqldriver.Value) (sqldriver.Result, error) {
	if len(args) != 1 || args[0] != "checked" {
		return nil, fmt.Errorf("args %v not converted by the connection's checker", args)
	}
	return sqldriver.RowsAffected(0), nil
}
func (checkerStmt) Query([]sqldriver.Value) (sqldriver.Rows, error) {
	return nil, errors.New("no queries")
}
