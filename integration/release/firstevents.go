package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// firstEventsMain is the program FirstEvents builds and runs in the
// scratch module: what a newcomer writes following docs/ (setup.md,
// kafka.md, nats.md, rabbitmq.md, redis.md, inbox.md), with the release's
// modules only. For each broker it emits 100 events in 100 transactions
// through the wrapped SQLite driver, prepares the broker as the guide says
// (NATS: natspub.CreateStream; RabbitMQ: rabbitmq.Declare with a queue;
// Kafka: the in-process broker of outboxtest/kafkatest with the topic),
// relays them, and consumes them through the inbox (Kafka: inboxkafka.Runner;
// the others: the broker's client, inbox.MessageFromHeaders and
// inbox.Handle, as docs/inbox.md shows). It prints "<broker> <effects>" per broker and exits 1 unless
// each has 100 effects, one per message ID. Names carry a run ID, so that
// runs on shared servers never meet.
const firstEventsMain = `package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/inbox"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	redispub "github.com/sqloutbox/outbox/relay/redis"
)

const events = 100

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	failed := false
	for _, b := range []struct {
		name string
		run  func(ctx context.Context, id string, db *sql.DB) (relay.Publisher, func(context.Context, *sql.DB) (int, error), error)
	}{{"kafka", viaKafka}, {"nats", viaNATS}, {"rabbitmq", viaRabbitMQ}, {"redis", viaRedis}} {
		n, err := oneBroker(ctx, b.name, id, b.run)
		fmt.Println(b.name, n, err)
		if err != nil || n != events {
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// oneBroker: a SQLite file of its own, the schema, 100 events, a relay to
// the broker, and the consumer through the inbox until 100 effects.
func oneBroker(ctx context.Context, name, id string, via func(context.Context, string, *sql.DB) (relay.Publisher, func(context.Context, *sql.DB) (int, error), error)) (int, error) {
	ob, err := driver.Register("outbox-sqlite-"+name, &sqlite.Driver{}, driver.Config{Dialect: driver.SQLite})
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "first-events-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("outbox-sqlite-"+name, dsn.SQLite(filepath.Join(dir, "app.db"), nil))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if err := ob.Migrate(ctx, db); err != nil {
		return 0, err
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE effects (message_id TEXT PRIMARY KEY, payload TEXT NOT NULL)"); err != nil {
		return 0, err
	}
	for i := 0; i < events; i++ {
		ectx := outbox.NewContext(ctx)
		tx, err := db.BeginTx(ectx, nil)
		if err != nil {
			return 0, err
		}
		ev := outbox.Event{AggregateType: "order", AggregateID: "o-" + strconv.Itoa(i%10), Type: "order.placed", Payload: []byte(strconv.Itoa(i))}
		if err := outbox.Emit(ectx, ev); err != nil {
			tx.Rollback()
			return 0, err
		}
		if err := tx.Commit(); err != nil {
			return 0, err
		}
	}
	pub, consumeAll, err := via(ctx, id, db)
	if err != nil {
		return 0, err
	}
	r, err := relay.New(ob, db, relay.Config{Publisher: pub})
	if err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	n, err := consumeAll(ctx, db)
	if serr := r.Stop(ctx); err == nil {
		err = serr
	}
	if rerr := <-done; err == nil {
		err = rerr
	}
	return n, err
}

// effects counts the consumer's effects that carry their event's
// payload (never empty here: the event's number).
func effects(ctx context.Context, db *sql.DB) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM effects WHERE payload <> ''").Scan(&n)
	return n, err
}

// applyThroughInbox is the handler every consumer runs: the effect, in the
// inbox's transaction.
func applyThroughInbox(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO effects (message_id, payload) VALUES (?, ?)", msg.ID, string(msg.Payload))
	return err
}

func newInbox(ctx context.Context, db *sql.DB, consumer string) (*inbox.Inbox, error) {
	in, err := inbox.New(inbox.Config{Dialect: driver.SQLite, Consumer: consumer})
	if err != nil {
		return nil, err
	}
	return in, in.Migrate(ctx, db)
}

// untilAll polls the effects until events or ctx ends.
func untilAll(ctx context.Context, db *sql.DB) (int, error) {
	for {
		n, err := effects(ctx, db)
		if err != nil || n >= events {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// consume applies one received message through the inbox: its Message
// from the relay's headers (docs/inbox.md), then the effect in Handle's
// transaction.
func consume(ctx context.Context, db *sql.DB, in *inbox.Inbox, headers map[string]string, payload []byte) error {
	msg, err := inbox.MessageFromHeaders(headers, payload)
	if err != nil {
		return err
	}
	_, err = in.Handle(ctx, db, msg, func(ctx context.Context, tx *sql.Tx) error { return applyThroughInbox(ctx, tx, msg) })
	return err
}

func viaKafka(ctx context.Context, id string, db *sql.DB) (relay.Publisher, func(context.Context, *sql.DB) (int, error), error) {
	kb, err := kafkatest.Start(kafkatest.Topics(4, "outbox.event.order"))
	if err != nil {
		return nil, nil, err
	}
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: kb.Addrs()})
	if err != nil {
		return nil, nil, err
	}
	in, err := newInbox(ctx, db, "billing")
	if err != nil {
		return nil, nil, err
	}
	runner, err := inboxkafka.NewRunner(inboxkafka.Config{Brokers: kb.Addrs(), Group: "billing-" + id, Topics: []string{"outbox.event.order"}, Inbox: in, DB: db, Handler: applyThroughInbox})
	if err != nil {
		return nil, nil, err
	}
	return pub, func(ctx context.Context, db *sql.DB) (int, error) {
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- runner.Run(rctx) }()
		n, err := untilAll(ctx, db)
		stop()
		<-done
		pub.Close()
		kb.Close()
		return n, err
	}, nil
}

func viaNATS(ctx context.Context, id string, db *sql.DB) (relay.Publisher, func(context.Context, *sql.DB) (int, error), error) {
	nc, err := nats.Connect(envOr("FIRST_NATS", "nats://127.0.0.1:4222"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, err
	}
	stream := natspub.StreamConfig{Name: "FIRST_" + id, SubjectPrefix: "first" + id + ".", Storage: jetstream.MemoryStorage}
	if _, err := natspub.CreateStream(ctx, nc, stream); err != nil {
		return nil, nil, err
	}
	pub, err := natspub.NewPublisher(natspub.Config{Conn: nc, Stream: stream.Name, Subject: func(m relay.Message) string {
		return stream.SubjectPrefix + m.AggregateType + "." + natspub.SubjectToken(m.AggregateID)
	}})
	if err != nil {
		return nil, nil, err
	}
	in, err := newInbox(ctx, db, "billing")
	if err != nil {
		return nil, nil, err
	}
	return pub, func(ctx context.Context, db *sql.DB) (int, error) {
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return 0, err
		}
		defer js.DeleteStream(context.Background(), stream.Name)
		cons, err := js.OrderedConsumer(ctx, stream.Name, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return 0, err
		}
		for {
			if n, err := effects(ctx, db); err != nil || n >= events {
				return n, err
			}
			batch, err := cons.Fetch(50, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return 0, err
			}
			for m := range batch.Messages() {
				h := map[string]string{}
				for k := range m.Headers() {
					h[k] = m.Headers().Get(k)
				}
				if err := consume(ctx, db, in, h, m.Data()); err != nil {
					return 0, err
				}
			}
			if err := batch.Error(); err != nil && ctx.Err() != nil {
				return 0, err
			}
		}
	}, nil
}

func viaRabbitMQ(ctx context.Context, id string, db *sql.DB) (relay.Publisher, func(context.Context, *sql.DB) (int, error), error) {
	url := envOr("FIRST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, err
	}
	top := rabbitmq.Topology{Exchange: "first." + id, Queue: "first.billing." + id}
	if _, err := rabbitmq.Declare(ctx, conn, top); err != nil {
		return nil, nil, err
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: url, Exchange: top.Exchange})
	if err != nil {
		return nil, nil, err
	}
	in, err := newInbox(ctx, db, "billing")
	if err != nil {
		return nil, nil, err
	}
	return pub, func(ctx context.Context, db *sql.DB) (int, error) {
		defer conn.Close()
		defer pub.Close()
		ch, err := conn.Channel()
		if err != nil {
			return 0, err
		}
		defer func() {
			ch.QueueDelete(top.Queue, false, false, false)
			ch.ExchangeDelete(top.Exchange, false, false)
		}()
		deliveries, err := ch.Consume(top.Queue, "", false, true, false, false, nil)
		if err != nil {
			return 0, err
		}
		for {
			if n, err := effects(ctx, db); err != nil || n >= events {
				return n, err
			}
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case d := <-deliveries:
				h := map[string]string{}
				for k, v := range d.Headers {
					if s, ok := v.(string); ok {
						h[k] = s
					}
				}
				if err := consume(ctx, db, in, h, d.Body); err != nil {
					return 0, err
				}
				if err := d.Ack(false); err != nil {
					return 0, err
				}
			}
		}
	}, nil
}

func viaRedis(ctx context.Context, id string, db *sql.DB) (relay.Publisher, func(context.Context, *sql.DB) (int, error), error) {
	client := redis.NewClient(&redis.Options{Addr: envOr("FIRST_REDIS", "127.0.0.1:6379"), ContextTimeoutEnabled: true, MaxRetries: -1})
	key := "first:" + id + ":order"
	pub, err := redispub.NewPublisher(redispub.Config{Client: client, Stream: func(m relay.Message) string { return "first:" + id + ":" + m.AggregateType }})
	if err != nil {
		return nil, nil, err
	}
	in, err := newInbox(ctx, db, "billing")
	if err != nil {
		return nil, nil, err
	}
	return pub, func(ctx context.Context, db *sql.DB) (int, error) {
		defer client.Close()
		defer client.Del(context.Background(), key)
		last := "0"
		for {
			if n, err := effects(ctx, db); err != nil || n >= events {
				return n, err
			}
			res, err := client.XRead(ctx, &redis.XReadArgs{Streams: []string{key, last}, Count: 50, Block: time.Second}).Result()
			if err == redis.Nil {
				continue
			}
			if err != nil {
				return 0, err
			}
			for _, m := range res[0].Messages {
				last = m.ID
				h := map[string]string{}
				for k, v := range m.Values {
					if s, ok := v.(string); ok && k != redispub.PayloadField {
						h[k] = s
					}
				}
				payload, _ := m.Values[redispub.PayloadField].(string)
				if err := consume(ctx, db, in, h, []byte(payload)); err != nil {
					return 0, err
				}
			}
		}
	}, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
`

// FirstEvents builds firstEventsMain in the scratch module Check made
// (after go getting the other modules it imports at the release version)
// and runs it against the local servers (FIRST_NATS, FIRST_RABBITMQ,
// FIRST_REDIS override their addresses) and the in-process Kafka broker.
// Call it after Check.
func (r *Release) FirstEvents(ctx context.Context) (string, error) {
	dir := filepath.Join(r.tmp, "scratch")
	get := []string{"get"}
	for _, p := range []string{"/inbox", "/relay/rabbitmq", "/relay/redis", "/outboxtest/kafkatest"} {
		get = append(get, r.root+p+"@"+r.opts.Version)
	}
	if out, err := r.goCmd(ctx, dir, get...); err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(get, " "), err, out)
	}
	if err := os.MkdirAll(filepath.Join(dir, "first"), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "first", "main.go"), []byte(firstEventsMain), 0o644); err != nil {
		return "", err
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"build", "-o", filepath.Join(r.tmp, "bin", "first"), "./first"}} {
		if out, err := r.goCmd(ctx, dir, args...); err != nil {
			return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	out, err := exec.CommandContext(ctx, filepath.Join(r.tmp, "bin", "first")).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("the first-events program: %w\n%s", err, out)
	}
	return string(out), nil
}
