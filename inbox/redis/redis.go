package inboxredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

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
	// DefaultTripAfter is how many consecutive failed Seen or Mark calls
	// open the circuit breaker.
	DefaultTripAfter = 3
	// DefaultCooldown is how long the open breaker answers ErrUnavailable
	// before one call probes Redis again.
	DefaultCooldown = 5 * time.Second
)

var (
	// ErrInvalidConfig is returned (wrapped) by New for a nil client or an
	// invalid option, and by NewRunner for an invalid Config.
	ErrInvalidConfig = errors.New("inboxredis: invalid config")
	// ErrUnavailable is Seen's and Mark's error while the circuit breaker
	// is open (Redis failed DefaultTripAfter times in a row): nothing was
	// sent; the inbox asks the table.
	ErrUnavailable = errors.New("inboxredis: Redis unavailable (circuit breaker open)")
)

// Filter implements inbox.Filter on Redis. It is safe for concurrent use.
type Filter struct {
	client    redis.UniversalClient
	prefix    string
	expiry    time.Duration
	tripAfter uint32
	cooldown  time.Duration
	cb        *gobreaker.CircuitBreaker[struct{}]
}

var (
	_ inbox.Filter      = (*Filter)(nil)
	_ inbox.BatchMarker = (*Filter)(nil)
)

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

// WithBreaker sets the circuit breaker's trip count (consecutive failures,
// at least 1; default DefaultTripAfter) and its cooldown (at least 1 ms;
// default DefaultCooldown).
func WithBreaker(tripAfter int, cooldown time.Duration) Option {
	return func(f *Filter) error {
		if tripAfter < 1 || cooldown < time.Millisecond {
			return fmt.Errorf("%w: breaker trips after %d failures with a cooldown of %v, want at least 1 and 1ms", ErrInvalidConfig, tripAfter, cooldown)
		}
		f.tripAfter, f.cooldown = uint32(tripAfter), cooldown
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
	f := &Filter{client: client, prefix: DefaultPrefix, expiry: DefaultExpiry, tripAfter: DefaultTripAfter, cooldown: DefaultCooldown}
	for _, o := range opts {
		if err := o(f); err != nil {
			return nil, err
		}
	}
	f.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "inboxredis",
		MaxRequests: 1,
		Timeout:     f.cooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= f.tripAfter },
		// A caller's cancelled context says nothing about Redis.
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
	})
	return f, nil
}

// call runs op through the breaker; an open (or busy half-open) breaker
// is ErrUnavailable.
func (f *Filter) call(op func() error) error {
	_, err := f.cb.Execute(func() (struct{}, error) { return struct{}{}, op() })
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		return ErrUnavailable
	}
	return err
}

// Open reports whether the circuit breaker is open or half-open (Redis
// failed lately), for a status page.
func (f *Filter) Open() bool { return f.cb.State() != gobreaker.StateClosed }

// Key returns the Redis key of (consumer, id).
func (f *Filter) Key(consumer, id string) string {
	return f.prefix + strconv.Itoa(len(consumer)) + ":" + consumer + ":" + id
}

// Seen reports whether the key of (consumer, id) exists (one EXISTS). An
// error (Redis unreachable, timed out) is returned wrapped, and
// ErrUnavailable while the breaker is open: the inbox then asks the table.
func (f *Filter) Seen(ctx context.Context, consumer, id string) (bool, error) {
	var n int64
	err := f.call(func() (err error) {
		n, err = f.client.Exists(ctx, f.Key(consumer, id)).Result()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("inboxredis: EXISTS: %w", err)
	}
	return n == 1, nil
}

// Mark sets the key of (consumer, id) with the expiry (one SET ... EX).
// Its error is wrapped; ErrUnavailable while the breaker is open.
func (f *Filter) Mark(ctx context.Context, consumer, id string) error {
	if err := f.call(func() error { return f.client.Set(ctx, f.Key(consumer, id), "1", f.expiry).Err() }); err != nil {
		return fmt.Errorf("inboxredis: SET: %w", err)
	}
	return nil
}

// MarkAll sets the keys of (consumer, id) for every id, with the expiry, in
// one pipelined round trip (inbox.HandleBatch calls it after a batch's
// commit). Its error is wrapped; ErrUnavailable while the breaker is open.
func (f *Filter) MarkAll(ctx context.Context, consumer string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	err := f.call(func() error {
		_, err := f.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range ids {
				p.Set(ctx, f.Key(consumer, id), "1", f.expiry)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("inboxredis: SET x%d: %w", len(ids), err)
	}
	return nil
}
