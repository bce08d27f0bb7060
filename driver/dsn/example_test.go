package dsn_test

import (
	"fmt"
	"net/url"

	"github.com/sqloutbox/outbox/driver/dsn"
)

// A mysql:// URL becomes a go-sql-driver configuration, for
// mysql.NewConnector or, formatted, for sql.Open("mysql", ...).
func ExampleMySQLConfig() {
	cfg, err := dsn.MySQLConfig("mysql://app:s3cret@db.example/shop?parseTime=true")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Addr, cfg.User, cfg.DBName)
	fmt.Println(cfg.FormatDSN())
	// Output:
	// db.example:3306 app shop
	// app:s3cret@tcp(db.example:3306)/shop?parseTime=true
}

// The project's SQLite DSN, for sql.Open("sqlite", ...) or modernc.org/sqlite's
// Driver.OpenConnector; parameters of your own are kept.
func ExampleSQLite() {
	fmt.Println(dsn.SQLite("/var/lib/app/app.db", nil))
	fmt.Println(dsn.SQLite("app.db", url.Values{"_time_format": {"sqlite"}}))
	// Output:
	// file:/var/lib/app/app.db?_pragma=busy_timeout%2810000%29&_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29&_pragma=foreign_keys%281%29&_txlock=immediate
	// file:app.db?_pragma=busy_timeout%2810000%29&_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29&_pragma=foreign_keys%281%29&_time_format=sqlite&_txlock=immediate
}
