package rabbitmq_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
)

// ownTopology is a Topology with names of the test's own, deleted when
// the test ends.
func ownTopology(t *testing.T, ch *amqp.Channel, queue bool) rabbitmq.Topology {
	t.Helper()
	id := unique()
	top := rabbitmq.Topology{Exchange: "outboxtest.topo." + id}
	if queue {
		top.Queue = "outboxtest.topo.q." + id
	}
	t.Cleanup(func() {
		if top.Queue != "" {
			_, _ = ch.QueueDelete(top.Queue, false, false, false)
		}
		_ = ch.ExchangeDelete(top.Exchange, false, false)
	})
	return top
}

// TestDeclareIdempotent: CheckTopology names what is missing and the
// command that declares it; Declare creates the exchange and the queue,
// then creates nothing the second time; a message published through the
// relay's publisher is then routed (not returned); an exchange or queue
// with other settings is refused, naming the setting, and left as it was.
func TestDeclareIdempotent(t *testing.T) {
	t.Parallel()
	conn, ch := admin(t)
	ctx := testCtx(t, time.Minute)
	top := ownTopology(t, ch, true)
	err := rabbitmq.CheckTopology(ctx, conn, top)
	if !errors.Is(err, rabbitmq.ErrTopologyMissing) || !strings.Contains(err.Error(), "outbox rabbitmq declare --broker amqp://<user>@<host>:5672/<vhost> --exchange "+top.Exchange+" --queue "+top.Queue) {
		t.Fatalf("CheckTopology before: %v, want ErrTopologyMissing with the command", err)
	}
	created, err := rabbitmq.Declare(ctx, conn, top)
	if err != nil || !slices.Equal(created, []string{"exchange " + top.Exchange, "queue " + top.Queue}) {
		t.Fatalf("Declare = %v, %v", created, err)
	}
	if created, err := rabbitmq.Declare(ctx, conn, top); err != nil || len(created) != 0 {
		t.Fatalf("Declare again = %v, %v; want nothing created", created, err)
	}
	if err := rabbitmq.CheckTopology(ctx, conn, top); err != nil {
		t.Fatalf("CheckTopology: %v", err)
	}
	p := newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: top.Exchange})
	if err := p.Publish(ctx, msgs(3, 2)); err != nil {
		t.Fatalf("Publish into the declared topology: %v", err)
	}
	if q, err := ch.QueueDeclarePassive(top.Queue, true, false, false, false, nil); err != nil || q.Messages != 3 {
		t.Errorf("queue after the publish: %+v, %v; want 3 messages", q, err)
	}

	quorum := top
	quorum.QueueType = rabbitmq.QueueQuorum
	for _, f := range []func() error{
		func() error { _, err := rabbitmq.Declare(ctx, conn, quorum); return err },
		func() error { return rabbitmq.CheckTopology(ctx, conn, quorum) },
	} {
		if err := f(); !errors.Is(err, rabbitmq.ErrTopologyMismatch) || !strings.Contains(err.Error(), "x-queue-type") {
			t.Errorf("a quorum queue over the classic one: %v, want ErrTopologyMismatch naming x-queue-type", err)
		}
	}
	// An exchange of another type under the name.
	direct := ownTopology(t, ch, false)
	if err := ch.ExchangeDeclare(direct.Exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rabbitmq.Declare(ctx, conn, direct); !errors.Is(err, rabbitmq.ErrTopologyMismatch) || !strings.Contains(err.Error(), "'type'") {
		t.Errorf("Declare over a direct exchange: %v, want ErrTopologyMismatch naming the type", err)
	}
	if err := ch.ExchangeDeclarePassive(direct.Exchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Errorf("the direct exchange changed or vanished: %v", err)
	}
}

func TestTopologyRefused(t *testing.T) {
	t.Parallel()
	conn, _ := admin(t)
	for _, top := range []rabbitmq.Topology{{Queue: "q", QueueType: "stream"}, {QueueType: rabbitmq.QueueQuorum}, {BindingKey: "a.#"}, {Exchange: "amq.topic"}} {
		if _, err := rabbitmq.Declare(context.Background(), conn, top); !errors.Is(err, rabbitmq.ErrConfig) {
			t.Errorf("Declare(%+v) = %v, want ErrConfig", top, err)
		}
	}
}

// TestMissingExchangeNamesTheCommand: the publisher's health check (and
// so the relay's readiness) names the command that declares a missing
// exchange; an unroutable message says to bind a queue.
func TestMissingExchangeNamesTheCommand(t *testing.T) {
	t.Parallel()
	_, ch := admin(t)
	ctx := testCtx(t, time.Minute)
	top := ownTopology(t, ch, false)
	p := newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: top.Exchange})
	err := p.Healthy(ctx)
	if !errors.Is(err, relay.ErrUnavailable) || !strings.Contains(err.Error(), "declare it with `outbox rabbitmq declare --broker amqp://<user>@<host>:5672/<vhost> --exchange "+top.Exchange+"`") {
		t.Fatalf("Healthy without the exchange: %v", err)
	}
	if err := ch.ExchangeDeclare(top.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	err = p.Publish(ctx, msgs(1, 1))
	want := "no queue is bound to exchange \"" + top.Exchange + "\" for routing key \"order.a-0\": bind your consumers' queues to it, or declare one: " +
		"`outbox rabbitmq declare --broker amqp://<user>@<host>:5672/<vhost> --exchange " + top.Exchange + " --queue NAME --binding-key 'order.#'`"
	if !errors.Is(err, rabbitmq.ErrReturned) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Publish with no queue bound: %v, want ErrReturned saying how to bind one", err)
	}
}
