// Package inboxrabbitmq consumes the RabbitMQ queue the outbox relay's
// messages are routed to (relay/rabbitmq publishes them) and applies every
// message through an inbox ([inbox.Inbox.Handle]): the dedupe row and the
// handler's changes commit in one transaction of the consumer's database,
// so at-least-once delivery becomes exactly-once effects. It is its own
// module (github.com/sqloutbox/outbox/inbox/rabbitmq): only its users
// download the AMQP client (github.com/rabbitmq/amqp091-go).
//
//	in, _ := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing"})
//	r, _ := inboxrabbitmq.NewRunner(inboxrabbitmq.Config{
//		URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "billing",
//		Bindings: []inboxrabbitmq.Binding{{Exchange: "outbox.event", Key: "order.*"}},
//		Inbox: in, DB: db,
//		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET ...", m.AggregateID)
//			return err
//		},
//	})
//	err := r.Run(ctx) // until ctx is cancelled
//
// # One active consumer: x-single-active-consumer
//
// A RabbitMQ queue is FIFO, and the relay enqueues an aggregate's messages
// in outbox order (relay/rabbitmq's package documentation). Competing
// consumers of one queue would each take some of an aggregate's messages
// and apply them concurrently, out of order. So Run declares its queue
// with x-single-active-consumer (RabbitMQ 3.8 and later): the broker
// delivers to one registered consumer at a time and, when that one's
// channel closes (Run returned, the process died, the connection broke),
// activates the next. Every runner of a consumer gives the same Queue: one
// consumes, the others wait registered, with no lease of our own to keep
// (the broker keeps it). The declaration is idempotent for a queue with
// the same arguments; an existing queue declared without the argument
// makes the broker answer 406 PRECONDITION_FAILED and Run returns ErrQueue
// instead of consuming it out of order. QueueArgs adds arguments (a quorum
// queue: "x-queue-type": "quorum"); Bindings are declared at every
// connection.
//
// To spread one stream of events over several active consumers, bind
// several queues to an x-consistent-hash exchange (the
// rabbitmq_consistent_hash_exchange plugin): the relay's routing key is
// per aggregate, so each aggregate lands in one queue, and each queue has
// its own runner group.
//
// # Order inside the runner, and the ack
//
// The active runner hands each delivery to the worker of its aggregate
// (Config.Workers, a hash of aggregate type and ID), which applies its
// deliveries one after another: an aggregate in order, different
// aggregates in parallel. A delivery is acknowledged (basic.ack, one tag)
// only after its outcome is stored in the consumer's database: applied,
// recognised as a duplicate, held behind a parked message, or parked.
// Prefetch (basic.qos, default 256) bounds the unacknowledged deliveries.
// When the channel is lost, every unacknowledged delivery goes back to the
// queue, at its position, and comes first to the next active consumer
// (Delivery.Redelivered set; quorum queues also count x-delivery-count):
// a message whose transaction committed just before the loss is
// recognised by the inbox and only acknowledged.
//
// Before this runner (or another) consumes again after a lost channel,
// its workers stop: a handler in progress finishes, its ack is attempted
// (the channel may be gone: the broker then redelivers it, and the inbox
// dedupes), and no delivery of the old channel is started. Then it
// reconnects, with backoff up to Config.ReconnectMax (DefaultReconnectMax,
// 1 s).
//
// # Retries, parking, batches
//
// As inboxkafka: a failed handler is retried with Config.Backoff up to
// MaxAttempts, then the message is parked and its aggregate held
// (ParkAndHold) or skipped (SkipAfterPark); inbox.ErrPermanent parks at
// once; a panic is recovered into an error (inbox.ErrHandlerPanic). The
// retries happen in the runner while the delivery stays unacknowledged
// (no requeue, which would reorder): keep MaxAttempts × the backoff below
// the broker's consumer_timeout (30 minutes by default), after which the
// broker closes the channel. With Config.BatchSize a worker applies up to
// that many of its deliveries in one transaction (inbox.Inbox.HandleBatch)
// and acknowledges them after the commit. Retry requests recorded by
// `outbox inbox parked skip` and `retry` are served every RequestInterval.
//
// # Start and shutdown
//
// Run checks the inbox schema first and returns inbox.ErrSchemaMissing
// (or ErrSchemaOutdated, ErrSchemaTooNew) without connecting. A broker
// that cannot be reached is retried. At cancellation Run stops the
// workers (the handler in progress finishes and is acknowledged), closes
// the connection (the broker requeues what was delivered and not yet
// handled) and returns nil. It does not cancel its consumer first: a
// cancelled consumer keeps its unacknowledged deliveries until its
// channel closes, while the queue's next consumer, active at once, would
// receive the aggregate's later messages before them. Closing the
// channel hands over and requeues in one step, so a rolling deploy keeps
// the order.
//
// The URL's password is never logged.
package inboxrabbitmq
