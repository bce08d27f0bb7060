package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/relay"
)

// Queue types Topology.QueueType names.
const (
	// QueueClassic is a durable classic queue: a confirmed message is
	// on the node's disk.
	QueueClassic = "classic"
	// QueueQuorum is a quorum queue: a confirmed message is on a majority
	// of its replicas (RabbitMQ 3.8+).
	QueueQuorum = "quorum"
)

var (
	// ErrTopologyMissing is returned by CheckTopology when the exchange or
	// the queue does not exist; the text names the command that declares
	// it.
	ErrTopologyMissing = errors.New("outbox/rabbitmq: exchange or queue missing")
	// ErrTopologyMismatch is returned by Declare and CheckTopology when the
	// exchange or the queue exists with other settings; the text is the
	// broker's, which names the setting and both values ("inequivalent
	// arg 'type' for exchange ...: received 'topic' but current is
	// 'direct'"). Nothing is changed.
	ErrTopologyMismatch = errors.New("outbox/rabbitmq: exchange or queue settings differ")
)

// Topology is what the relay's messages need on the broker: a durable
// topic exchange (the publisher declares nothing), and optionally a
// durable queue bound to it, so that a message is not returned as
// unroutable (mandatory publishing: ErrReturned) before any consumer
// declared its own. Declare makes it and CheckTopology verifies it.
type Topology struct {
	// Exchange is a durable topic exchange. Default DefaultExchange.
	Exchange string
	// Queue, if set, is a durable queue bound to Exchange.
	Queue string
	// QueueType is QueueClassic (default) or QueueQuorum.
	QueueType string
	// BindingKey binds Queue to Exchange. Default "#" (every message;
	// routing keys are "<aggregate type>.<aggregate id word>", so
	// "order.#" takes one aggregate type's).
	BindingKey string
}

func (t Topology) withDefaults() (Topology, error) {
	if t.Exchange == "" {
		t.Exchange = DefaultExchange
	}
	if t.QueueType == "" {
		t.QueueType = QueueClassic
	}
	if t.BindingKey == "" {
		t.BindingKey = "#"
	}
	switch {
	case t.QueueType != QueueClassic && t.QueueType != QueueQuorum:
		return t, fmt.Errorf("%w: queue type %q: want %s or %s", ErrConfig, t.QueueType, QueueClassic, QueueQuorum)
	case t.Queue == "" && (t.QueueType != QueueClassic || t.BindingKey != "#"):
		return t, fmt.Errorf("%w: a queue type or binding key without a queue", ErrConfig)
	case len(t.Exchange) > 255 || len(t.Queue) > 255 || len(t.BindingKey) > MaxRoutingKeyBytes:
		return t, fmt.Errorf("%w: names and binding keys are at most 255 bytes", ErrConfig)
	case strings.HasPrefix(t.Exchange, "amq.") || strings.HasPrefix(t.Queue, "amq."):
		return t, fmt.Errorf("%w: names starting with amq. are the broker's", ErrConfig)
	}
	return t, nil
}

// declareCommand is the `outbox` command line that declares t.
func (t Topology) declareCommand() string {
	cmd := "outbox rabbitmq declare --broker amqp://<user>@<host>:5672/<vhost>"
	if t.Exchange != DefaultExchange {
		cmd += " --exchange " + t.Exchange
	}
	if t.Queue != "" {
		cmd += " --queue " + t.Queue
	}
	return cmd
}

func (t Topology) queueArgs() amqp.Table {
	if t.QueueType == QueueQuorum {
		return amqp.Table{"x-queue-type": QueueQuorum}
	}
	return nil // a classic queue: what the broker makes by default
}

// Declare makes t on conn, or finds it there with the same settings, and
// returns what it created ("exchange NAME", "queue NAME"; the binding is
// (re)made every time, which the broker treats as a no-op). It changes
// nothing that exists: an exchange or queue with other settings gives
// ErrTopologyMismatch. Errors also wrap ErrConfig, and the broker's
// (refused access: relay.ErrUnavailable).
func Declare(ctx context.Context, conn *amqp.Connection, t Topology) (created []string, err error) {
	t, err = t.withDefaults()
	if err != nil {
		return nil, err
	}
	found, err := t.inspect(ctx, conn)
	if err != nil {
		return nil, err
	}
	err = onChannel(ctx, conn, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return topologyError("exchange", t.Exchange, err)
		}
		if !found.exchange {
			created = append(created, "exchange "+t.Exchange)
		}
		if t.Queue == "" {
			return nil
		}
		if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, t.queueArgs()); err != nil {
			return topologyError("queue", t.Queue, err)
		}
		if !found.queue {
			created = append(created, "queue "+t.Queue)
		}
		if err := ch.QueueBind(t.Queue, t.BindingKey, t.Exchange, false, nil); err != nil {
			return topologyError("binding of queue", t.Queue, err)
		}
		return nil
	})
	return created, err
}

// CheckTopology verifies that t exists on conn with t's settings: nil,
// ErrTopologyMissing (naming the command that declares it),
// ErrTopologyMismatch (the broker's text naming the setting), ErrConfig,
// or the broker's error. AMQP 0-9-1 cannot list bindings: the queue's
// binding is not checked (Declare makes it, idempotently).
func CheckTopology(ctx context.Context, conn *amqp.Connection, t Topology) error {
	t, err := t.withDefaults()
	if err != nil {
		return err
	}
	found, err := t.inspect(ctx, conn)
	if err != nil {
		return err
	}
	switch {
	case !found.exchange:
		return fmt.Errorf("%w: no exchange %q: declare it with `%s` (or rabbitmq.Declare)", ErrTopologyMissing, t.Exchange, t.declareCommand())
	case t.Queue != "" && !found.queue:
		return fmt.Errorf("%w: no queue %q: declare it with `%s` (or rabbitmq.Declare)", ErrTopologyMissing, t.Queue, t.declareCommand())
	}
	// Declaring what exists with the same settings changes nothing; with
	// other settings the broker refuses and names the difference.
	return onChannel(ctx, conn, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return topologyError("exchange", t.Exchange, err)
		}
		if t.Queue != "" {
			if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, t.queueArgs()); err != nil {
				return topologyError("queue", t.Queue, err)
			}
		}
		return nil
	})
}

// inspect finds out, with passive declares, whether the exchange and the
// queue exist (a failed passive declare closes its channel: one each).
func (t Topology) inspect(ctx context.Context, conn *amqp.Connection) (found struct{ exchange, queue bool }, err error) {
	exists := func(what, name string, declare func(*amqp.Channel) error) (bool, error) {
		err := onChannel(ctx, conn, declare)
		var ae *amqp.Error
		switch {
		case err == nil:
			return true, nil
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			return false, nil
		}
		return false, topologyError(what, name, err)
	}
	found.exchange, err = exists("exchange", t.Exchange, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	})
	if err != nil || t.Queue == "" {
		return found, err
	}
	found.queue, err = exists("queue", t.Queue, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(t.Queue, true, false, false, false, nil)
		return err
	})
	return found, err
}

// onChannel runs fn on a channel of its own, closed afterwards, bounded by
// ctx (amqp091-go's calls take no context).
func onChannel(ctx context.Context, conn *amqp.Connection, fn func(*amqp.Channel) error) error {
	return inBackground(ctx, func() error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("outbox/rabbitmq: opening a channel: %w", err)
		}
		defer func() { _ = ch.Close() }()
		return fn(ch)
	})
}

// topologyError classifies a declare's error.
func topologyError(what, name string, err error) error {
	var ae *amqp.Error
	switch {
	case errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed:
		return fmt.Errorf("%w: %s %q: %s (left unchanged: delete and declare it again, or name another)", ErrTopologyMismatch, what, name, ae.Reason)
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return fmt.Errorf("%w: %s %q: this user may not configure it (RabbitMQ's configure permission for the name): %w", relay.ErrUnavailable, what, name, err)
	}
	return fmt.Errorf("outbox/rabbitmq: %s %q: %w", what, name, err)
}
