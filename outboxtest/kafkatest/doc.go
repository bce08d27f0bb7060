// Package kafkatest is the outbox's public test kit for Kafka: an
// in-process Kafka-protocol broker (franz-go's kfake) with the topics
// created, a consumer (franz-go's kgo) that records every record it
// receives and finds them by outbox message ID, and a ledger check that
// joins what the outbox table says was committed with what the consumer
// received: lost events, ghosts, duplicates and per-aggregate order.
//
// It lives in its own module,
// github.com/sqloutbox/outbox/outboxtest/kafkatest, so that the library's
// module does not make its users download kfake; add it to a test-only
// requirement of your own module:
//
//	go get github.com/sqloutbox/outbox/outboxtest/kafkatest
//
// A test of code that emits events, end to end:
//
//	b, err := kafkatest.Start(kafkatest.Topics(8, "outbox.event.order"))
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(b.Close)
//	pub, err := kafka.NewPublisher(kafka.Config{Brokers: b.Addrs()}) // relay/kafka
//	// ... run a relay with pub, commit transactions that emit ...
//	c, err := kafkatest.NewConsumer(b.Addrs(), []string{"outbox.event.order"})
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(c.Close)
//	recs, err := c.WaitForMessageIDs(ctx, ids...)
//	if err := kafkatest.Check(rows, recs).Err(); err != nil { t.Fatal(err) }
//
// The ledger's types and errors are outboxtest's ([Row] is outboxtest.Row
// and so on): [Check] puts the records in (topic, partition, offset)
// order and calls outboxtest.Check, the broker-neutral ledger the other
// kits (relay/nats/natstest, relay/rabbitmq/rabbitmqtest,
// relay/redis/redistest) share.
//
// Nothing here sleeps to synchronise: [Consumer.Wait] (an
// outboxtest.Recorder's) blocks on a channel that is closed on every
// change, until its condition holds or its context ends.
//
// The package has no dependency on the outbox's internal packages; it
// imports only the public emit package, for the header names the relay
// sets ([emit.HeaderMessageID] and the others), and outboxtest.
package kafkatest
