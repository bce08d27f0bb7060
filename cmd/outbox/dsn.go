package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers driver "pgx"
	_ "modernc.org/sqlite"             // registers driver "sqlite"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// target is a parsed --dsn: which database, how to open it, and how to
// name it in messages without its password.
type target struct {
	dialect driver.Dialect
	// open returns the *sql.DB (not yet connected).
	open func() (*sql.DB, error)
	// where names the server ("host:port") or the SQLite file.
	where string
	// path is the SQLite file ("" otherwise).
	path string
	// raw is the DSN as given (ListenPostgres needs it).
	raw string
}

// parseDSN infers the dialect from raw, the --dsn as given, and prepares
// to open it. Errors are usage errors: the DSN cannot be understood.
func parseDSN(raw string) (*target, error) {
	switch {
	case raw == "":
		return nil, usageErrorf("no database given: set --dsn or OUTBOX_DSN")
	case strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://"):
		u, err := url.Parse(raw)
		if err != nil {
			return nil, usageErrorf("cannot parse the PostgreSQL URL %s: %v", redactDSN(raw), dsn.RedactURLError(err))
		}
		host := u.Hostname()
		if host == "" {
			host = "localhost"
		}
		port := u.Port()
		if port == "" {
			port = "5432"
		}
		return &target{
			dialect: driver.Postgres, where: net.JoinHostPort(host, port), raw: raw,
			open: func() (*sql.DB, error) { return sql.Open("pgx", raw) },
		}, nil
	case strings.HasPrefix(raw, "mysql://") || strings.Contains(raw, "@tcp(") || strings.Contains(raw, "@unix("):
		cfg, err := dsn.MySQLConfig(raw)
		if err != nil {
			return nil, usageErrorf("cannot parse the MySQL DSN %s: %v", redactDSN(raw), err)
		}
		return &target{
			dialect: driver.MySQL, where: cfg.Addr, raw: raw,
			open: func() (*sql.DB, error) {
				c, err := mysql.NewConnector(cfg)
				if err != nil {
					return nil, err
				}
				return sql.OpenDB(c), nil
			},
		}, nil
	case strings.HasPrefix(raw, "sqlite:") || strings.HasPrefix(raw, "file:") || (strings.HasSuffix(raw, ".db") && !libpqKeywordValue.MatchString(raw)):
		path, query, _ := strings.Cut(raw, "?")
		path = strings.TrimPrefix(strings.TrimPrefix(path, "sqlite:"), "file:")
		path = strings.TrimPrefix(path, "//") // sqlite:///abs/path
		if path == "" {
			return nil, usageErrorf("the SQLite DSN %q names no file", raw)
		}
		user, err := url.ParseQuery(query)
		if err != nil {
			return nil, usageErrorf("cannot parse the SQLite DSN parameters of %q: %v", raw, err)
		}
		full := dsn.SQLite(path, user)
		return &target{
			dialect: driver.SQLite, where: path, path: path, raw: raw,
			open: func() (*sql.DB, error) { return sql.Open("sqlite", full) },
		}, nil
	case libpqKeywordValue.MatchString(raw):
		// libpq's keyword/value form (host=db port=5432 dbname=app
		// user=relay), which the application's lib/pq or pgx accepts too.
		cfg, err := pgconn.ParseConfig(raw)
		if err != nil {
			return nil, usageErrorf("cannot parse the PostgreSQL connection string %s: %v", redactDSN(raw), dsn.RedactURLError(err))
		}
		return &target{
			dialect: driver.Postgres, where: net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), raw: raw,
			open: func() (*sql.DB, error) { return sql.Open("pgx", raw) },
		}, nil
	default:
		return nil, usageErrorf("cannot tell the database from --dsn %s: want postgres://..., host=... dbname=... (libpq's keyword/value form), mysql://... or user:pass@tcp(host:port)/db, or sqlite:PATH", redactDSN(raw))
	}
}

// libpqKeywordValue matches a libpq keyword/value connection string: it
// starts with one of libpq's connection keywords and "=".
var libpqKeywordValue = regexp.MustCompile(`^\s*(host|hostaddr|port|dbname|user|password|sslmode|application_name|connect_timeout|options|service|target_session_attrs)\s*=`)

// connect opens t and checks the connection within ctx. mustExist refuses
// to create a missing SQLite file (every command but migrate apply).
func connect(ctx context.Context, t *target, mustExist bool) (*sql.DB, error) {
	if t.dialect == driver.SQLite && mustExist {
		if _, err := os.Stat(t.path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("sqlite database %s does not exist: run `outbox migrate apply` to create it", t.path)
			}
			return nil, fmt.Errorf("cannot open sqlite database %s: %w", t.path, err)
		}
	}
	db, err := t.open()
	if err == nil {
		err = db.PingContext(ctx)
		if err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		if t.dialect == driver.SQLite {
			return nil, fmt.Errorf("cannot open sqlite database %s: %w", t.where, err)
		}
		return nil, fmt.Errorf("cannot connect to %s at %s: %w", t.dialect, t.where, connectCause(err))
	}
	return db, nil
}

// connectCause shortens pgx's connect error, which repeats the same cause
// once per attempt (sslmode=prefer tries TLS, then plain), on several lines.
func connectCause(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || ce.Unwrap() == nil {
		return err
	}
	var uniq []string
	for _, line := range strings.Split(ce.Unwrap().Error(), "\n") {
		if line = strings.TrimSpace(line); line != "" && !slices.Contains(uniq, line) {
			uniq = append(uniq, line)
		}
	}
	return &rewordedError{msg: fmt.Sprintf("user=%s database=%s: %s", ce.Config.User, ce.Config.Database, strings.Join(uniq, "; ")), err: err}
}

// rewordedError shows msg and wraps err.
type rewordedError struct {
	msg string
	err error
}

func (e *rewordedError) Error() string { return e.msg }
func (e *rewordedError) Unwrap() error { return e.err }

// checkSchema returns a clear error unless table is migrated to the
// version this build needs: the version writers and relays need
// (driver.RequiredSchemaVersion), or with latest every version this build
// knows (the admin page needs the optional dead letters' index).
func checkSchema(ctx context.Context, db *sql.DB, t *target, table string, latest bool) error {
	cur, newest, err := driver.SchemaVersion(ctx, db, driver.Config{Dialect: t.dialect, Table: table})
	if err != nil {
		return err
	}
	need := newest
	if !latest {
		if need, err = driver.RequiredSchemaVersion(t.dialect); err != nil {
			return err
		}
	}
	switch {
	case cur == 0:
		return fmt.Errorf("table %s does not exist or is not migrated in the %s database at %s: run `outbox migrate apply`", table, t.dialect, t.where)
	case cur < need:
		return fmt.Errorf("table %s is at schema version %d, this build needs %d: run `outbox migrate apply`", table, cur, newest)
	case cur > newest:
		return fmt.Errorf("table %s is at schema version %d, newer than this build knows (%d): use a newer outbox command", table, cur, newest)
	}
	return nil
}

// outbox describes the table named by --table in t's dialect (no
// database is touched): what package relay and metrics are built from.
// partitions asserts the stored relay partition count (0: read it).
func (a *app) outbox(t *target, partitions int) (*driver.Outbox, error) {
	return driver.New(driver.Config{Dialect: t.dialect, Table: a.table, Partitions: partitions})
}

// isConfigError reports errors that stem from bad flag values.
func isConfigError(err error) bool {
	return errors.Is(err, driver.ErrInvalidConfig) || errors.Is(err, relay.ErrInvalidConfig) ||
		errors.Is(err, relay.ErrInvalidSelector) || errors.Is(err, kafka.ErrConfig)
}

// redacted is what replaces a password.
const redacted = "xxxxx"

var (
	// scheme://user:password@ when url.Parse cannot read the URL.
	urlUserinfo = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@]*@`)
	// password=... in key=value DSNs and URL query strings.
	passwordParam = regexp.MustCompile(`(?i)\b(password|passwd|pwd)\s*=\s*('(?:[^'\\]|\\.)*'|[^&\s]*)`)
)

// redactDSN returns dsn with any password replaced by xxxxx: the userinfo
// password of a URL (postgres://, mysql://), the user:pass@ of a
// go-sql-driver DSN, and password= parameters.
func redactDSN(dsn string) string {
	if i := strings.Index(dsn, "://"); i > 0 && !strings.ContainsAny(dsn[:i], "@(/") {
		if u, err := url.Parse(dsn); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), redacted)
			}
			dsn = u.String()
		} else {
			dsn = urlUserinfo.ReplaceAllString(dsn, "${1}:"+redacted+"@")
		}
	} else if pw, start, end, ok := mysqlPassword(dsn); ok && pw != "" {
		dsn = dsn[:start] + redacted + dsn[end:]
	}
	return passwordParam.ReplaceAllString(dsn, "${1}="+redacted)
}

// mysqlPassword locates the password of a go-sql-driver DSN
// ([user[:password]@][net[(addr)]]/dbname[?params]) the way its parser
// does: the last '@' before the last '/', then the first ':' before it.
func mysqlPassword(dsn string) (pw string, start, end int, ok bool) {
	slash := strings.LastIndexByte(dsn, '/')
	if slash < 0 {
		return "", 0, 0, false
	}
	at := strings.LastIndexByte(dsn[:slash], '@')
	if at < 0 {
		return "", 0, 0, false
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 {
		return "", 0, 0, false
	}
	return dsn[colon+1 : at], colon + 1, at, true
}

// dsnPassword returns the password in dsn, if any, so that it can be
// scrubbed from any message (a driver might quote it).
func dsnPassword(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") || strings.HasPrefix(dsn, "mysql://") {
		if u, err := url.Parse(dsn); err == nil && u.User != nil {
			pw, _ := u.User.Password()
			return pw
		}
		return ""
	}
	if strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(") {
		pw, _, _, _ := mysqlPassword(dsn)
		return pw
	}
	return ""
}

// redact scrubs the DSN and its password, and the broker's passwords,
// from a message.
func (a *app) redact(msg string) string {
	msg = scrub(msg, a.secrets)
	if a.dsn == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, a.dsn, redactDSN(a.dsn))
	if pw := dsnPassword(a.dsn); len(pw) >= 3 { // shorter ones would mangle ordinary text
		msg = strings.ReplaceAll(msg, pw, redacted)
	}
	if m := passwordParam.FindAllStringSubmatch(a.dsn, -1); m != nil {
		for _, x := range m {
			if len(x[2]) >= 3 {
				msg = strings.ReplaceAll(msg, x[2], redacted)
			}
		}
	}
	return msg
}
