package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// The wake-up NOTIFY (PostgreSQL), sent outside the writers' transactions.
//
// PostgreSQL serializes the commits of all transactions that queued a
// NOTIFY on one database-wide lock, taken in PreCommit_Notify and held until
// the commit's WAL record is flushed, so that notifications enter the queue
// in commit order. A NOTIFY folded into each writer's transaction (as the
// commit hook did until issue 12) therefore put every writer of the
// database in one line for its WAL flush: with 64 writers and
// synchronous_commit on, 1,235 to 1,655 commits/s instead of 3,600 to 4,000
// without it (internal/testkit/notifybench, BENCHMARKS.md).
//
// Instead, each wrapped connector (one per *sql.DB) has a notifier: one
// goroutine and one connection of its own, opened from the same wrapped
// driver connector as the pool's. After a COMMIT that wrote rows returns,
// the commit hook signals it (a non-blocking send into a channel of
// capacity 1), and the notifier sends
//
//	SELECT pg_notify('<channel>', ''), set_config('synchronous_commit', 'off', true)
//
// as one autocommit statement. Only that statement's tiny transaction takes
// the notification lock; writers never wait for it.
//
// Coalescing, and why no wake-up is lost: a signal is a token in the
// channel, sent after the writer's COMMIT returned. The notifier takes the
// token, then starts its statement. Whatever commits while a statement is
// in flight leaves one token (the rest find the channel full), so exactly
// one more NOTIFY follows. A commit C that returned has put its token in
// the channel or found one there; either way the notifier takes a token
// after C returned and only then starts the NOTIFY that follows, so that
// NOTIFY's statement begins after C's rows are visible and a relay it wakes
// claims them. A NOTIFY that fails is sent again, on a new connection,
// until it succeeds or the connector is closed: failures delay wake-ups,
// they do not drop them (the relays' poll remains the last resort).
//
// synchronous_commit is off for the notifier's own statement only
// (set_config's is_local: for its implicit transaction, no session state,
// so it is also safe through PgBouncer's transaction pooling): its commit
// need not wait for a WAL flush, which shortens both the wake-up and the
// time it holds the notification lock. Nothing is lost by that: the NOTIFY
// carries no data, the rows it announces were committed by the writers
// with their own settings, and after a server crash every LISTENer
// reconnects and catches up anyway (relay.ListenPostgres wakes its relay
// after each connection).

// notifyTimeout bounds one NOTIFY statement, including the connection it
// may have to open first.
const notifyTimeout = 5 * time.Second

// closeFlushTimeout bounds how long Close waits for the NOTIFY owed at
// Close to be sent.
const closeFlushTimeout = time.Second

// notifier sends the wake-up NOTIFY for the commits of one wrapped
// connector; see the comment above. The zero value is not usable: make it
// with newNotifier. A nil *notifier does nothing (dialects other than
// PostgreSQL, Config.DisableNotify).
type notifier struct {
	o       *Outbox
	connect func(context.Context) (sqldriver.Conn, error)
	query   string
	log     *slog.Logger

	kick    chan struct{} // capacity 1: a NOTIFY is owed
	started atomic.Bool   // fast path of start
	mu      sync.Mutex    // guards closed and starting the loop
	closed  bool
	stop    chan struct{} // closed by close
	done    chan struct{} // closed when the loop returns (if it ran)
	ctx     context.Context
	cancel  context.CancelFunc
}

// newNotifier returns the notifier for connections opened by connect, or
// nil when o sends no NOTIFY (not PostgreSQL, Config.DisableNotify or
// Config.LogOnly).
// Nothing runs and nothing connects before the first signal.
func (o *Outbox) newNotifier(connect func(context.Context) (sqldriver.Conn, error)) *notifier {
	if o.cfg.Dialect != Postgres || o.cfg.DisableNotify || o.cfg.LogOnly {
		// LogOnly: the events are in no table, so a relay woken to
		// claim would find none; the WAL source's relays are woken by
		// their stream. The NOTIFY cost a log-only commit about a tenth
		// of its time (BENCHMARKS.md).
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := o.cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &notifier{
		o:       o,
		connect: connect,
		query:   "SELECT pg_notify('" + o.dialect.Channel() + "', ''), set_config('synchronous_commit', 'off', true)",
		log:     log.With("component", "outbox.notify", "channel", o.dialect.Channel()),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		ctx:     ctx,
		cancel:  cancel,
	}
}

// signal records that a NOTIFY is owed and starts the loop on first use.
// It never blocks; after close it does nothing.
func (n *notifier) signal() {
	if n == nil {
		return
	}
	select {
	case n.kick <- struct{}{}:
	default: // one is owed already and will be sent after this point
	}
	if n.started.Load() {
		return
	}
	n.mu.Lock()
	if !n.closed && !n.started.Load() {
		n.started.Store(true)
		go n.loop()
	}
	n.mu.Unlock()
}

// close stops the notifier: a NOTIFY still owed is sent first (waiting at
// most closeFlushTimeout), then its connection is closed. Later signals do
// nothing; close is safe to call twice and on nil.
func (n *notifier) close() {
	if n == nil {
		return
	}
	n.mu.Lock()
	already := n.closed
	n.closed = true
	running := n.started.Load()
	n.mu.Unlock()
	if already {
		return
	}
	close(n.stop)
	if !running {
		n.cancel()
		return
	}
	t := time.NewTimer(closeFlushTimeout)
	defer t.Stop()
	select {
	case <-n.done:
	case <-t.C:
		// The server does not answer: give up on the owed NOTIFY. The
		// loop returns once its statement does (its context is cancelled).
	}
	n.cancel()
}

func (n *notifier) loop() {
	defer close(n.done)
	var c *conn // the notifier's own connection; nil until (re)opened
	defer func() {
		if c != nil {
			_ = c.Close()
		}
	}()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 100*time.Millisecond, 10*time.Second, 0
	for {
		select {
		case <-n.kick:
		case <-n.stop:
			select {
			case <-n.kick: // owed at close: one attempt
				_ = n.send(&c)
			default:
			}
			return
		}
		failures := 0
		for {
			err := n.send(&c)
			if err == nil {
				if failures > 0 {
					n.log.Info("wake-up NOTIFY sent again after failures", "failures", failures)
				}
				break
			}
			failures++
			if failures == 1 {
				// Usually a connection that died while idle (server
				// restart, idle timeout, pg_terminate_backend): retry at
				// once on a new one.
				continue
			}
			if n.ctx.Err() != nil {
				return
			}
			if failures == 2 {
				bo.Reset()
			}
			wait := bo.NextBackOff()
			n.log.Warn("sending the wake-up NOTIFY failed; retrying (relays in other processes wake at their poll meanwhile)",
				"error", err, "failures", failures, "retry_in", wait.String())
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-n.stop:
				t.Stop()
				_ = n.send(&c) // the owed NOTIFY, one last attempt
				return
			}
		}
	}
}

// send sends one NOTIFY on *c, opening a connection first if *c is nil.
// On failure it closes the connection and sets *c to nil, so the next
// attempt reconnects.
func (n *notifier) send(c **conn) error {
	ctx, cancel := context.WithTimeout(n.ctx, notifyTimeout)
	defer cancel()
	if *c == nil {
		pc, err := n.connect(ctx)
		if err != nil {
			return err
		}
		// A bare wrapper (no statement cache, never bound): its exec
		// helpers handle drivers without ExecerContext.
		*c = n.o.newConn(pc)
	}
	err := recovered(func() error { _, err := (*c).execParentOrPrepare(ctx, n.query, nil); return err })
	if err != nil {
		_ = (*c).Close()
		*c = nil
		return err
	}
	return nil
}
