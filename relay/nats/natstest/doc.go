// Package natstest is the outbox's test kit for NATS JetStream, beside
// outboxtest/kafkatest: a uniquely named stream for a test's subjects
// ([CreateStream], deleted by [Stream.Delete]) and a [Consumer] that reads
// the stream from its start with an ordered consumer and records every
// message with the time it was received, to wait on and to find by
// outbox message ID, and [Check], the ledger that joins what the outbox
// table says was committed with what the stream holds: lost events,
// ghosts, duplicates and per-aggregate order in stream sequence order
// (outboxtest.Check, the broker-neutral ledger, does the joining). It
// runs against a real server (nats-server -js); it starts none.
//
// It lives in the publisher's module, github.com/sqloutbox/outbox/relay/nats,
// so a user of the publisher has it already:
//
//	js, _ := jetstream.New(nc)
//	s, err := natstest.CreateStream(ctx, js, []string{prefix + ".>"})
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(func() { _ = s.Delete(context.Background()) })
//	// ... a relay with natspub.NewPublisher(natspub.Config{Conn: nc, Subject: ...}) ...
//	c, err := natstest.NewConsumer(ctx, js, s.Name)
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(c.Close)
//	recs, err := c.WaitForMessageIDs(ctx, ids...)
//	if err := natstest.Check(rows, recs).Err(); err != nil { t.Fatal(err) } // rows: []outboxtest.Row from the outbox table
//
// [Record.PublisherRecord] gives what the conformance suite
// (outboxtest/publishertest) checks. Nothing here sleeps to synchronise:
// [Consumer.Wait] (an outboxtest.Recorder's) blocks on a channel that is
// closed on every change, until its condition holds or its context ends.
package natstest
