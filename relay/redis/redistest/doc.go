// Package redistest is the outbox's test kit for Redis Streams, beside
// outboxtest/kafkatest: a [Consumer] that reads one or more streams from
// their first entry (XREAD from "0", blocking) and records every entry,
// its fields mapped back as the publisher wrote them (the payload field,
// every other field a header), with the time it was read, to wait on and
// to find by outbox message ID; [UniqueName] for a test's own key prefix
// and [DeleteKeys] to remove its keys; and [Check], the ledger that
// joins what the outbox table says was committed with what the streams
// hold: lost events, ghosts, duplicates and per-aggregate order in entry
// ID order (outboxtest.Check, the broker-neutral ledger, does the
// joining). It runs against a real server; it starts none.
//
// It lives in the publisher's module,
// github.com/sqloutbox/outbox/relay/redis, so a user of the publisher has
// it already:
//
//	prefix := redistest.UniqueName("outboxtest:") + ":"
//	t.Cleanup(func() { _, _ = redistest.DeleteKeys(context.Background(), client, prefix+"*") })
//	// ... a relay with redispub.NewPublisher(redispub.Config{Client: client,
//	//     Stream: func(m relay.Message) string { return prefix + redispub.DefaultStream(m) }}) ...
//	c, err := redistest.NewConsumer(&redis.Options{Addr: "127.0.0.1:6379"}, prefix+"outbox.event.order")
//	if err != nil { t.Fatal(err) }
//	t.Cleanup(c.Close)
//	recs, err := c.WaitForMessageIDs(ctx, ids...)
//	if err := redistest.Check(rows, recs).Err(); err != nil { t.Fatal(err) } // rows: []outboxtest.Row from the outbox table
//
// [Record.PublisherRecord] gives what the conformance suite
// (outboxtest/publishertest) checks. Nothing here sleeps to synchronise:
// [Consumer.Wait] (an outboxtest.Recorder's) blocks on a channel that is
// closed on every change, until its condition holds or its context ends.
package redistest
