package inboxkafka

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sqloutbox/outbox/inbox"
)

// skipParked skips the one parked message msg (policy SkipAfterPark).
func skipParked(ctx context.Context, in *inbox.Inbox, db *sql.DB, msg inbox.Message) error {
	n, err := in.Skip(ctx, db, inbox.ParkedFilter{AggregateType: msg.AggregateType, AggregateID: msg.AggregateID})
	if err != nil {
		return fmt.Errorf("inboxkafka: skipping parked message %s: %w", msg.ID, err)
	}
	_ = n
	return nil
}
