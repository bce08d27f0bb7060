package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
)

// ListenPostgres wakes a relay in another process than the writers: it
// holds one PostgreSQL connection of its own (outside any pool that could
// recycle it), LISTENs on the table's channel (ob.Channel(), quoted), and
// calls wake for every notification the writers' outbox driver sends
// (driver.Config's DisableNotify: on by default for Postgres, sent after
// COMMIT returned, one for all the commits that returned while the
// previous one was in flight). wake should coalesce (Relay.Notify does).
// A notification with the payload "lease", which a relay sends when it
// gives partitions up (rebalancing, or stopping) or joins short of its
// share, also makes the running relays of ob in this process beat at
// once, instead of at their next heartbeat (relay/peers.go).
//
//	go relay.ListenPostgres(ctx, ob, dsn, r.Notify, logger)
//
// dsn is a libpq-style URL or key=value string (as pgx accepts). It
// reconnects with backoff (100 ms doubling to 30 s) when the connection
// drops, and calls wake after each (re)connection, since notifications sent
// while disconnected are lost (the relay's poll would find them too). It
// returns ctx's error once ctx ends, or an error wrapping ErrInvalidConfig
// (logged too) for a nil ob or one whose dialect is not driver.Postgres;
// logger may be nil (slog.Default()). ob names the table (its channel).
func ListenPostgres(ctx context.Context, ob *driver.Outbox, dsn string, wake func(), logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	if ob == nil || ob.Config().Dialect != driver.Postgres {
		err := fmt.Errorf("%w: ListenPostgres needs a *driver.Outbox of dialect postgres", ErrInvalidConfig)
		logger.Error("not listening for commit notifications", "component", "outbox.listen", "error", err)
		return err
	}
	d, err := dialectOf(ob)
	if err != nil {
		return err
	}
	log := logger.With("component", "outbox.listen", "channel", d.Channel())
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 100*time.Millisecond, 30*time.Second, 0
	bo.Reset()
	kick := func() { wakePeers(ob, nil) }
	for {
		err := listenOnce(ctx, dsn, d.Channel(), wake, kick, bo.Reset)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := bo.NextBackOff()
		log.Warn("listening for commit notifications failed; reconnecting", "error", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// listenOnce listens on channel over one connection until it fails or
// ctx ends: wake for every notification, and kick too for a relay's
// release of partitions (payload leasePayload: peers.go).
func listenOnce(ctx context.Context, dsn, channel string, wake, kick func(), connected func()) error {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if n.Payload == leasePayload {
			kick()
		}
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, dialect.ListenStatement(channel)).ReadAll(); err != nil {
		return fmt.Errorf("LISTEN %s: %w", channel, err)
	}
	connected()
	wake() // catch up on what committed while not listening
	for {
		if err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		wake()
	}
}
