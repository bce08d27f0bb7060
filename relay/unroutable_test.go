package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// shiftClock is the wall clock moved forward by the test (Config.Clock).
type shiftClock struct{ off atomic.Int64 }

func (c *shiftClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// inOrderPublisher sends each message alone through relay.PublishInOrder,
// as relay/nats, relay/rabbitmq and relay/redis do: a batch whose every
// message's route is refused fails as a whole with ErrUnavailable.
type inOrderPublisher struct {
	inner *outboxtest.Publisher
	fail  func(relay.Message) error
}

func (p *inOrderPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	return relay.PublishInOrder(ctx, msgs, 4, func(ctx context.Context, i int) error {
		if err := p.fail(msgs[i]); err != nil {
			return err
		}
		return p.inner.Publish(ctx, msgs[i:i+1])
	})
}

// refusals counts the relay's reports of message id failing on its route
// (Observer.Failed with ClassUnavailable).
type refusals struct {
	relay.NopObserver
	id string
	n  atomic.Int64
}

func (o *refusals) Failed(m relay.Message, c relay.ErrorClass, _ error) {
	if m.MessageID == o.id && c == relay.ClassUnavailable {
		o.n.Add(1)
	}
}

// TestDeadLetterUnroutableAfter: X-1's topic is refused (ErrUnavailable,
// no attempt counted) while Y's events go out. With the policy, once X-1's
// route has failed for DeadLetterUnroutableAfter (the relay's clock moved
// past it) and the broker acknowledged another route within that time,
// X-1 is dead-lettered and holds X-2 back (HoldAggregate). Without the
// policy, or when every route is refused (nothing acknowledged within the
// time), it stays pending with no attempt. Both publisher shapes: per
// message errors (PublishErrors), and a batch failed as a whole when all
// its messages' routes are refused (PublishInOrder).
func TestDeadLetterUnroutableAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		after    time.Duration
		allRoute bool // after the clock moves, every route is refused
		wantDead bool
	}{
		{"one route refused", time.Minute, false, true},
		{"every route refused", time.Minute, true, false},
		{"policy off", 0, false, false},
	} {
		// The dead-letter write on every target; the decisions (in Go)
		// on pgx.
		targets := testdb.All[1:2]
		if tc.wantDead {
			targets = testdb.All
		}
		for _, tg := range targets {
			for _, inOrder := range []bool{false, true} {
				name := tc.name + "/PublishErrors/" + tg.Name
				if inOrder {
					name = tc.name + "/PublishInOrder/" + tg.Name
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					clock := &shiftClock{}
					var everything atomic.Bool
					var refusedX atomic.Int64
					fail := func(m relay.Message) error {
						if m.Topic == "fu.nowhere" {
							refusedX.Add(1)
							return fmt.Errorf("%w: no stream binds subject fu.nowhere", relay.ErrUnavailable)
						}
						if everything.Load() {
							return fmt.Errorf("%w: authorization violation", relay.ErrUnavailable)
						}
						return nil
					}
					seen := &refusals{id: "X-1"}
					b := setup(t, tg, func(c *relay.Config) {
						c.Clock = clock
						c.Observer = seen
						c.DeadLetterUnroutableAfter = tc.after
						if inOrder {
							c.Publisher = &inOrderPublisher{inner: c.Publisher.(*outboxtest.Publisher), fail: fail}
						}
					})
					if !inOrder {
						b.pub.FailWith(fail)
					}
					x1 := event("X", 1)
					x1.Topic = "fu.nowhere"
					b.emit(t, x1, event("X", 2), event("Y", 1))
					if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "Y")) >= 1 }); err != nil {
						t.Fatal(err)
					}
					// Moved only once the relay has recorded the refusal (the
					// Observer hears of it after): moved between the broker's
					// refusal and the relay's record of it, the route's clock
					// would start at the moved time (a loaded CI run did that).
					eventually(t, b.ctx, "X-1's refusal recorded", func() bool { return seen.n.Load() >= 1 })
					everything.Store(tc.allRoute)
					clock.off.Store(int64(2 * time.Minute))
					b.emit(t, event("Y", 2))
					if tc.wantDead {
						eventually(t, b.ctx, "X-1 dead-lettered", func() bool { s, _ := b.status(t, "X-1"); return s == 2 })
						if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(dedupe(order(m, "Y"))) == 2 }); err != nil {
							t.Fatal(err)
						}
						var lastErr string
						if err := b.e.RelayDB.QueryRow("SELECT last_error FROM " + b.e.Table + " WHERE message_id = 'X-1'").Scan(&lastErr); err != nil {
							t.Fatal(err)
						}
						if !strings.Contains(lastErr, "topic fu.nowhere unavailable for") || !strings.Contains(lastErr, "no stream binds subject fu.nowhere") {
							t.Errorf("X-1's last error %q names neither the route nor the broker's refusal", lastErr)
						}
						if s, _ := b.status(t, "X-2"); s != 0 || len(order(b.pub.Messages(), "X")) != 0 {
							t.Errorf("X-2 status %d, X published %v: a dead letter holds its aggregate", s, order(b.pub.Messages(), "X"))
						}
						return
					}
					// The relay refuses X-1 again several times after the move.
					n := refusedX.Load()
					eventually(t, b.ctx, "X-1 refused three more times", func() bool { return refusedX.Load() >= n+3 })
					if !tc.allRoute {
						if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(dedupe(order(m, "Y"))) == 2 }); err != nil {
							t.Fatal(err)
						}
					}
					if s, attempts := b.status(t, "X-1"); s != 0 || attempts != 0 {
						t.Errorf("X-1: status %d, %d attempts; want pending with none", s, attempts)
					}
				})
			}
		}
	}
}

// TestDeadLetterUnroutableAfterRefusesNegative: a negative time is a
// configuration error.
func TestDeadLetterUnroutableAfterRefusesNegative(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[3], driver.Config{})
	_, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), DeadLetterUnroutableAfter: -time.Second})
	if !errors.Is(err, relay.ErrInvalidConfig) {
		t.Errorf("New with DeadLetterUnroutableAfter -1s = %v, want ErrInvalidConfig", err)
	}
}
