// Package inbox is the consumer side of the outbox: an idempotent
// consumer that records each message ID in an inbox table with a unique
// key, in the same transaction as the message's business effect (the seed
// article's unique-key method). A redelivered message (at-least-once)
// finds its ID already there and changes nothing.
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Dialect selects the SQL of the inbox table: "postgres", "mysql" or "sqlite".
type Dialect string

// Inbox dedupes messages by ID in table.
type Inbox struct {
	db      *sql.DB
	dialect Dialect
	table   string
}

// New returns an Inbox on table (letters, digits, underscores) of db.
func New(db *sql.DB, d Dialect, table string) *Inbox { return &Inbox{db: db, dialect: d, table: table} }

// Migrate creates the inbox table if it does not exist.
func (in *Inbox) Migrate(ctx context.Context) error {
	_, err := in.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+in.table+" (message_id VARCHAR(128) PRIMARY KEY)")
	return err
}

func (in *Inbox) insert() string {
	switch in.dialect {
	case "postgres":
		return "INSERT INTO " + in.table + " (message_id) VALUES ($1) ON CONFLICT DO NOTHING"
	case "mysql":
		return "INSERT IGNORE INTO " + in.table + " (message_id) VALUES (?)"
	default:
		return "INSERT OR IGNORE INTO " + in.table + " (message_id) VALUES (?)"
	}
}

// ErrNoMessageID is returned for a message without an ID.
var ErrNoMessageID = errors.New("inbox: message has no ID")

// Handle runs apply in a transaction that also records messageID, unless
// the ID was recorded before: then it returns duplicate = true and apply
// does not run. Either the effect and the record commit together or
// neither does, so a crash between them makes the broker redeliver and
// the effect happen exactly once.
func (in *Inbox) Handle(ctx context.Context, messageID string, apply func(ctx context.Context, tx *sql.Tx) error) (duplicate bool, err error) {
	if strings.TrimSpace(messageID) == "" {
		return false, ErrNoMessageID
	}
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	res, err := tx.ExecContext(ctx, in.insert(), messageID)
	if err != nil {
		return false, fmt.Errorf("inbox: recording %s: %w", messageID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return true, nil
	}
	if err := apply(ctx, tx); err != nil {
		return false, err
	}
	return false, tx.Commit()
}
