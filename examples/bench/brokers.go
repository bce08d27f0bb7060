package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

// Default server addresses of part "brokers" (-nats, -amqp, -redis).
const (
	defaultNATS  = "nats://127.0.0.1:4222"
	defaultAMQP  = "amqp://guest:guest@127.0.0.1:5672/"
	defaultRedis = "127.0.0.1:6379"
)

// natsEndpoint is NATS JetStream: per route a memory stream binding the
// route's subjects; relay/nats's publisher on one connection, natstest's
// ordered consumer on another.
type natsEndpoint struct{ url string }

func (n natsEndpoint) name() string { return "nats" }

func (n natsEndpoint) describe() string {
	return "NATS JetStream at " + n.url + "; a memory stream per run (natstest.CreateStream), subject <prefix>.outbox.event.order.<aggregate>; consumer: natstest.Consumer (ordered push consumer) on its own connection"
}

func (n natsEndpoint) probe(ctx context.Context) error {
	nc, err := nats.Connect(n.url, nats.Timeout(3*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.AccountInfo(ctx)
	return err
}

func (n natsEndpoint) open(ctx context.Context, name string, consume bool) (*route, error) {
	var undo []func()
	fail := func(err error) (*route, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, err
	}
	nc, err := nats.Connect(n.url, nats.Timeout(5*time.Second))
	if err != nil {
		return fail(err)
	}
	undo = append(undo, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	prefix := natstest.UniqueName("outbox-bench-" + name + "-")
	st, err := natstest.CreateStream(ctx, js, []string{prefix + ".>"})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.Delete(dctx)
	})
	pub, err := natspub.NewPublisher(natspub.Config{Conn: nc, Subject: func(m relay.Message) string { return prefix + "." + natspub.DefaultSubject(m) }})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = pub.Close() })
	r := &route{pub: pub}
	if consume {
		cn, err := nats.Connect(n.url, nats.Timeout(5*time.Second))
		if err != nil {
			return fail(err)
		}
		undo = append(undo, cn.Close)
		cjs, err := jetstream.New(cn)
		if err != nil {
			return fail(err)
		}
		c, err := natstest.NewConsumer(ctx, cjs, st.Name)
		if err != nil {
			return fail(err)
		}
		undo = append(undo, c.Close)
		r.cons = kitReceiver[natstest.Record]{wait: c.Wait, close: func() {}, idAt: func(rc natstest.Record) (string, time.Time) {
			id, _ := rc.MessageID()
			return id, rc.Received
		}}
	}
	r.close = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	return r, nil
}

// rabbitEndpoint is RabbitMQ: per route a topic exchange and a queue bound
// "#" (rabbitmqtest), relay/rabbitmq's publisher (publisher confirms),
// rabbitmqtest's consumer (automatic acknowledgement) on its own
// connection. Without a consumer the queue is declared and bound all the
// same (a message no queue takes is returned: the publisher fails it).
type rabbitEndpoint struct{ url string }

func (r rabbitEndpoint) name() string { return "rabbitmq" }

func (r rabbitEndpoint) describe() string {
	return "RabbitMQ at " + redactURL(r.url) + "; a topic exchange and a classic queue bound \"#\" per run, publisher confirms; consumer: rabbitmqtest.Consumer (basic.consume, auto-ack) on its own connection"
}

func (r rabbitEndpoint) probe(context.Context) error {
	conn, err := amqp.DialConfig(r.url, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	if err != nil {
		return err
	}
	return conn.Close()
}

func (r rabbitEndpoint) open(_ context.Context, name string, consume bool) (*route, error) {
	var undo []func()
	fail := func(err error) (*route, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, err
	}
	conn, err := amqp.Dial(r.url)
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		return fail(err)
	}
	ex, err := rabbitmqtest.DeclareExchange(ch)
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = ch.ExchangeDelete(ex, false, false) })
	rt := &route{}
	if consume {
		c, err := rabbitmqtest.NewConsumer(conn, ex, "#")
		if err != nil {
			return fail(err)
		}
		undo = append(undo, func() { _ = c.Close() })
		rt.cons = kitReceiver[rabbitmqtest.Record]{wait: c.Wait, close: func() {}, idAt: func(rc rabbitmqtest.Record) (string, time.Time) {
			id, _ := rc.MessageID()
			return id, rc.Received
		}}
	} else {
		q := rabbitmqtest.UniqueName("outbox-bench." + name + ".")
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			return fail(err)
		}
		undo = append(undo, func() { _, _ = ch.QueueDelete(q, false, false, false) })
		if err := ch.QueueBind(q, "#", ex, false, nil); err != nil {
			return fail(err)
		}
	}
	pub, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: r.url, Exchange: ex})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = pub.Close() })
	rt.pub = pub
	rt.close = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	return rt, nil
}

// redisEndpoint is Redis Streams: per route a key prefix, one stream per
// aggregate type (the bench's: order); relay/redis's publisher (XADD,
// pipelined across aggregates), redistest's consumer (XREAD BLOCK from
// "0") on its own client.
type redisEndpoint struct{ addr string }

func (r redisEndpoint) name() string { return "redis" }

func (r redisEndpoint) describe() string {
	return "Redis at " + r.addr + "; stream <prefix>outbox.event.order per run (XADD, no trimming); consumer: redistest.Consumer (XREAD BLOCK from 0, no group) on its own client"
}

func (r redisEndpoint) probe(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1, DialTimeout: 3 * time.Second})
	defer c.Close()
	return c.Ping(ctx).Err()
}

func (r redisEndpoint) open(_ context.Context, name string, consume bool) (*route, error) {
	cl := redis.NewClient(&redis.Options{Addr: r.addr})
	prefix := redistest.UniqueName("outbox-bench:"+name+":") + ":"
	cleanup := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = redistest.DeleteKeys(dctx, cl, prefix+"*")
		_ = cl.Close()
	}
	stream := func(m relay.Message) string { return prefix + redispub.DefaultStream(m) }
	pub, err := redispub.NewPublisher(redispub.Config{Client: cl, Stream: stream})
	if err != nil {
		cleanup()
		return nil, err
	}
	rt := &route{pub: pub, close: func() { _ = pub.Close(); cleanup() }}
	if consume {
		c, err := redistest.NewConsumer(&redis.Options{Addr: r.addr}, stream(relay.Message{AggregateType: "order"}))
		if err != nil {
			rt.close()
			return nil, err
		}
		rt.cons = kitReceiver[redistest.Record]{wait: c.Wait, close: func() {}, idAt: func(rc redistest.Record) (string, time.Time) {
			id, _ := rc.MessageID()
			return id, rc.Received
		}}
		rt.close = func() { c.Close(); _ = pub.Close(); cleanup() }
	}
	return rt, nil
}

// brokersRate is part "brokers"' offered load, events/s.
const brokersRate = 1000

// printBrokers prints part "brokers": one row per broker (medians), then
// every broker's setup, and loudly those not measured.
func printBrokers(w *tabwriter.Writer, out io.Writer, b *BrokersResult) {
	fmt.Fprintf(w, "brokers (%d rows over %d aggregates; %d/s for %.1f s, %d writers)\tdrain events/s\trecv p50 ms\tp99\tp99.9\tmax\tack p50\tp99\tPublish p50\tmsgs/Publish\truns\t\n",
		b.Rows, b.Aggregates, b.OfferedPerSec, b.Seconds, b.Writers)
	for _, br := range b.Brokers {
		if !br.Measured {
			fmt.Fprintf(w, "%s\tNOT MEASURED\t\t\t\t\t\t\t\t\t\t\n", br.Broker)
			continue
		}
		var p LatencyPoint
		if len(br.Latency.Points) > 0 {
			p = br.Latency.Points[0]
		}
		fmt.Fprintf(w, "%s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%d\t\n", br.Broker, br.Drain.EventsPerSec,
			p.RecvP50Ms, p.RecvP99Ms, p.RecvP999Ms, p.RecvMaxMs, p.AckP50Ms, p.AckP99Ms, p.PublishP50Ms, p.PublishBatchAvg, len(br.DrainRuns))
	}
	w.Flush()
	for _, br := range b.Brokers {
		fmt.Fprintf(out, "  %s: %s\n", br.Broker, br.Setup)
		if !br.Measured {
			fmt.Fprintf(out, "  %s: NOT MEASURED: %s\n", br.Broker, br.NotMeasured)
		}
		for _, d := range br.DrainRuns {
			fmt.Fprintf(out, "  %s drain run %d: %.0f events/s (%.2f s)\n", br.Broker, d.Run, d.EventsPerSec, d.Seconds)
		}
	}
	fmt.Fprintln(out)
}

// redactURL drops the password of an AMQP URL for the output.
func redactURL(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		if j := strings.Index(u[i+3:], "@"); j >= 0 {
			cred := u[i+3 : i+3+j]
			if k := strings.Index(cred, ":"); k >= 0 {
				return u[:i+3] + cred[:k] + ":***" + u[i+3+j:]
			}
		}
	}
	return u
}

// BrokersResult is part "brokers": every broker on the same database in
// one run: the drain of the same preload (part 3's, never analyzed) and
// the commit -> consumer latency at one offered load (part 2's, the
// in-process relay).
type BrokersResult struct {
	Rows       int `json:"rows"`
	Aggregates int `json:"aggregates"`
	// BatchSize is the relay's BatchSize (0: the relay's default).
	BatchSize     int     `json:"batch_size"`
	OfferedPerSec int     `json:"offered_per_sec"`
	Seconds       float64 `json:"seconds_per_load"`
	Writers       int     `json:"writers"`
	// Brokers is one entry per broker, in the order they ran within each
	// run: kafka, nats, rabbitmq, redis.
	Brokers []*BrokerResult `json:"brokers"`
}

// BrokerResult is one broker of part "brokers".
type BrokerResult struct {
	Broker string `json:"broker"`
	// Setup says where the broker is, what a run's route is and what
	// consumed it.
	Setup string `json:"setup"`
	// Measured is false if the broker did not answer; NotMeasured says
	// why, and there are no figures.
	Measured    bool   `json:"measured"`
	NotMeasured string `json:"not_measured,omitempty"`
	// Drain and Latency are the medians of the runs (DrainRuns,
	// LatencyRuns).
	Drain       *DrainResult     `json:"drain,omitempty"`
	Latency     *LatencyResult   `json:"latency,omitempty"`
	DrainRuns   []*DrainResult   `json:"drain_runs,omitempty"`
	LatencyRuns []*LatencyResult `json:"latency_runs,omitempty"`
}

// runBrokers measures part "brokers": for each run, for each broker in
// turn (interleaved, so a noisy neighbour spreads over all), the drain of
// rows preloaded rows and the latency at rate for dur. A broker that does
// not answer its probe is reported as not measured (loudly, on stderr
// too), never as a figure; the others are still measured. With cpuprofile
// set, each broker's drains are profiled into cpuprofile + "." + its name
// (the last run's profile stays).
func runBrokers(ctx context.Context, db *database, eps []endpoint, rows, aggs, batch, rate int, dur time.Duration, writers, runs int, cpuprofile string, warn func(string)) (*BrokersResult, error) {
	res := &BrokersResult{Rows: rows, Aggregates: aggs, BatchSize: batch, OfferedPerSec: rate, Seconds: dur.Seconds(), Writers: writers}
	var live []int
	for i, ep := range eps {
		br := &BrokerResult{Broker: ep.name(), Setup: ep.describe()}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := ep.probe(pctx)
		cancel()
		if err != nil {
			br.NotMeasured = fmt.Sprintf("not reachable: %v", err)
			warn(fmt.Sprintf("NOT MEASURED: %s (%s): %s", ep.name(), ep.describe(), br.NotMeasured))
		} else {
			br.Measured = true
			live = append(live, i)
		}
		res.Brokers = append(res.Brokers, br)
	}
	for run := 1; run <= runs; run++ {
		for _, i := range live {
			ep, br := eps[i], res.Brokers[i]
			warn(fmt.Sprintf("part brokers: %s, drain of %d rows over %d aggregates, run %d of %d", ep.name(), rows, aggs, run, runs))
			prof := ""
			if cpuprofile != "" {
				prof = cpuprofile + "." + ep.name()
			}
			d, err := runDrain(ctx, db, ep, rows, aggs, batch, prof, variantNeverAnalyzed, run, "_"+ep.name())
			if err != nil {
				return nil, fmt.Errorf("%s: drain (run %d): %w", ep.name(), run, err)
			}
			br.DrainRuns = append(br.DrainRuns, d)
			warn(fmt.Sprintf("part brokers: %s, latency at %d events/s for %s, %d writers, run %d of %d", ep.name(), rate, dur, writers, run, runs))
			l, err := runLatency(ctx, db, ep, []int{rate}, dur, writers, run, "_"+ep.name())
			if err != nil {
				return nil, fmt.Errorf("%s: latency (run %d): %w", ep.name(), run, err)
			}
			br.LatencyRuns = append(br.LatencyRuns, l)
		}
	}
	for _, i := range live {
		br := res.Brokers[i]
		br.Drain, br.Latency = medianDrain(br.DrainRuns), medianLatency(br.LatencyRuns)
	}
	return res, nil
}
