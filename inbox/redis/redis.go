// Package inboxredis is a Redis pre-filter for package inbox (the seed
// article's "Redis SETNX" method, as a front for the table rather than a
// replacement): inbox.Handle asks it before beginning a transaction, and a
// key that exists skips the message without touching the database.
//
//	f, err := inboxredis.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
//	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "shipping", Filter: f})
//
// Seen is one EXISTS; Mark, called by the inbox only after the database
// commit, is one SET with an expiry (a key written before a handler that
// then failed would drop the message). The inbox table stays the
// authority: a Redis error in Seen means "unknown" and the table decides,
// and a key that is missing (expired, evicted, lost with a Redis restart,
// deleted by hand) costs one database transaction that finds the
// duplicate, never a second effect. Redis never decides that a message is
// new.
//
// An outage costs what the client's timeouts allow: Handle waits for Seen
// (and, after the commit, Mark) to fail before it goes on, so give the
// client short dial, read and write timeouts (say 50-200 ms) and few
// retries; the table then decides at the price of those timeouts.
//
// It lives in its own module (github.com/sqloutbox/outbox/inbox/redis) so
// that inbox users without Redis do not download go-redis.
package inboxredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/inbox"
)

// DefaultPrefix starts every key; DefaultExpiry is a key's lifetime.
const (
	DefaultPrefix = "inbox:"
	// DefaultExpiry is 24 h: a redelivery is nearly always minutes after
	// the first delivery, and a day of keys is what a Redis sized for a
	// cache holds comfortably. It may be shorter than the inbox's retention
	// window (7 days by default): older duplicates are then found by the
	// table, at the cost of a transaction. Longer than the window is
	// harmless (a key only ever says "processed").
	DefaultExpiry = 24 * time.Hour
)

// ErrInvalidConfig is returned by New for a nil client or an invalid option.
var ErrInvalidConfig = errors.New("inboxredis: invalid config")

// Filter implements inbox.Filter on Redis. It is safe for concurrent use.
type Filter struct {
	client redis.UniversalClient
	prefix string
	expiry time.Duration
}

var _ inbox.Filter = (*Filter)(nil)

// Option configures a Filter.
type Option func(*Filter) error

// WithPrefix sets the key prefix (default DefaultPrefix); keys are
// prefix + len(consumer) + ":" + consumer + ":" + id, so consumers and IDs
// containing ":" cannot collide. An empty prefix is refused.
func WithPrefix(p string) Option {
	return func(f *Filter) error {
		if p == "" {
			return fmt.Errorf("%w: empty prefix", ErrInvalidConfig)
		}
		f.prefix = p
		return nil
	}
}

// WithExpiry sets how long a key lives (default DefaultExpiry); at least
// one second (Redis's EX unit).
func WithExpiry(d time.Duration) Option {
	return func(f *Filter) error {
		if d < time.Second {
			return fmt.Errorf("%w: expiry %v, want at least 1s", ErrInvalidConfig, d)
		}
		f.expiry = d
		return nil
	}
}

// New returns a Filter on client (a *redis.Client, *redis.ClusterClient or
// *redis.Ring). It does not contact Redis. It returns ErrInvalidConfig
// (wrapped) for a nil client or an invalid option.
func New(client redis.UniversalClient, opts ...Option) (*Filter, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidConfig)
	}
	f := &Filter{client: client, prefix: DefaultPrefix, expiry: DefaultExpiry}
	for _, o := range opts {
		if err := o(f); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// Key returns the Redis key of (consumer, id).
func (f *Filter) Key(consumer, id string) string {
	return f.prefix + strconv.Itoa(len(consumer)) + ":" + consumer + ":" + id
}

// Seen reports whether the key of (consumer, id) exists (one EXISTS). An
// error (Redis unreachable, timed out) is returned as is, wrapped: the
// inbox then asks the table.
func (f *Filter) Seen(ctx context.Context, consumer, id string) (bool, error) {
	n, err := f.client.Exists(ctx, f.Key(consumer, id)).Result()
	if err != nil {
		return false, fmt.Errorf("inboxredis: EXISTS: %w", err)
	}
	return n == 1, nil
}

// Mark sets the key of (consumer, id) with the expiry (one SET ... EX).
func (f *Filter) Mark(ctx context.Context, consumer, id string) error {
	if err := f.client.Set(ctx, f.Key(consumer, id), "1", f.expiry).Err(); err != nil {
		return fmt.Errorf("inboxredis: SET: %w", err)
	}
	return nil
}
