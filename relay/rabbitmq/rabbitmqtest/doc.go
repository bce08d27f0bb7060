// Package rabbitmqtest is the outbox's test kit for RabbitMQ, beside
// outboxtest/kafkatest: a uniquely named topic exchange
// ([DeclareExchange]) and a [Consumer] that owns a uniquely named queue
// bound to an exchange with a routing pattern ([NewConsumer]; or a queue
// the test declared itself, [ConsumeQueue]), consumes it, records every
// delivery with the time it was received, to wait on and to find by
// outbox message ID, and deletes the queue on Close; and [Check], the
// ledger that joins what the outbox table says was committed with what
// the queue delivered: lost events, ghosts, duplicates and per-aggregate
// order in delivery order (outboxtest.Check, the broker-neutral ledger,
// does the joining). It runs against a real broker; it starts none.
//
// It lives in the publisher's module,
// github.com/sqloutbox/outbox/relay/rabbitmq, so a user of the publisher
// has it already:
//
//	conn, _ := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
//	ch, _ := conn.Channel()
//	ex, err := rabbitmqtest.DeclareExchange(ch)
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(func() { _ = ch.ExchangeDelete(ex, false, false) })
//	c, err := rabbitmqtest.NewConsumer(conn, ex, "order.#")
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(func() { _ = c.Close() })
//	// ... a relay with rabbitmq.NewPublisher(rabbitmq.Config{URL: ..., Exchange: ex}) ...
//	recs, err := c.WaitForMessageIDs(ctx, ids...)
//	if err := rabbitmqtest.Check(rows, recs).Err(); err != nil { t.Fatal(err) } // rows: []outboxtest.Row from the outbox table
//
// Create the consumer before publishing: a message routed while no queue
// is bound is dropped (or returned), never stored. [Record.PublisherRecord]
// gives what the conformance suite (outboxtest/publishertest) checks.
// Nothing here sleeps to synchronise: [Consumer.Wait] (an
// outboxtest.Recorder's) blocks on a channel that is closed on every
// change, until its condition holds or its context ends.
package rabbitmqtest
