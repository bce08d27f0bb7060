package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// TestNATSStreamCommands: `outbox nats stream check` names the missing
// stream and the command that creates it (exit 1); `create` creates it,
// then finds it unchanged; `check` passes, and fails naming each setting
// that differs, leaving the stream as it was.
func TestNATSStreamCommands(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		unavailable(t, "NATS at "+natsURL(), err)
	}
	defer nc.Close()
	id := uniqueID()
	stream, prefix := "OUTBOXPROV_"+id, "outboxprov-"+id+"."
	t.Cleanup(func() {
		js, err := jetstream.New(nc)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = js.DeleteStream(ctx, stream)
		}
	})
	base := []string{"nats", "stream", "--broker", natsURL(), "--nats-stream", stream, "--subject-prefix", prefix, "--storage", "memory"}
	sub := func(name string, extra ...string) []string {
		return append(append([]string{base[0], base[1], name}, base[2:]...), extra...)
	}
	r := expect(t, cli(t, sub("check")...), exitRuntime)
	if !strings.Contains(r.stderr, "no stream "+stream) || !strings.Contains(r.stderr, "outbox nats stream create --broker "+natsURL()+" --nats-stream "+stream+" --subject-prefix "+prefix) {
		t.Errorf("check before create: %v", r)
	}
	r = expect(t, cli(t, sub("create")...), exitOK)
	if !strings.Contains(r.stdout, "stream "+stream+" created: subjects "+prefix+">, memory storage, 1 replica(s), duplicate window 2m0s") {
		t.Errorf("create: %v", r)
	}
	r = expect(t, cli(t, append([]string{"--json"}, sub("create")...)...), exitOK)
	var out struct{ State, Stream string }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.State != "exists" || out.Stream != stream {
		t.Errorf("create again --json: %+v, %v; %v", out, err, r)
	}
	expect(t, cli(t, sub("check")...), exitOK)
	r = expect(t, cli(t, sub("check", "--duplicate-window", "5m", "--replicas", "1")...), exitRuntime)
	if !strings.Contains(r.stderr, "stream settings differ") || !strings.Contains(r.stderr, "duplicate window 2m0s, want 5m0s") || strings.Contains(r.stderr, "replicas") {
		t.Errorf("check with another window: %v", r)
	}
	r = expect(t, cli(t, sub("create", "--storage", "file")...), exitRuntime)
	if !strings.Contains(r.stderr, "storage Memory, want File") {
		t.Errorf("create with another storage: %v", r)
	}
	expect(t, cli(t, sub("check")...), exitOK) // unchanged
}

func TestNATSStreamUsageAndConnectionErrors(t *testing.T) {
	t.Parallel()
	free := freeAddr(t)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"storage", []string{"nats", "stream", "create", "--broker", natsURL(), "--storage", "disk"}, exitUsage, `--storage "disk": want file or memory`},
		{"not NATS", []string{"nats", "stream", "create", "--broker", "redis://127.0.0.1:6379/0"}, exitUsage, "needs a NATS --broker"},
		{"no broker", []string{"nats", "stream", "check"}, exitUsage, "no broker given"},
		{"wildcard prefix", []string{"nats", "stream", "create", "--broker", natsURL(), "--subject-prefix", "a.*."}, exitUsage, "invalid --topic-prefix"},
		{"replicas", []string{"nats", "stream", "create", "--broker", natsURL(), "--replicas", "9"}, exitUsage, "replicas 9 outside 1..5"},
		{"wrong port", []string{"nats", "stream", "check", "--broker", "nats://" + free}, exitRuntime, "connection refused: is NATS running, and is that its port (default 4222)?"},
		{"group alone", []string{"nats", "stream"}, exitUsage, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := expect(t, cli(t, c.args...), c.code)
			if !strings.Contains(r.stderr, c.want) {
				t.Errorf("stderr lacks %q: %v", c.want, r)
			}
		})
	}
}

// TestRelayNATSStreamMissing: `outbox relay --nats-stream` refuses to
// start when the stream does not exist, naming the command that creates
// it.
func TestRelayNATSStreamMissing(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	table := randomTable()
	tg.migrate(t, table)
	r := expect(t, cli(t, "--dsn", tg.dsn, "--table", table, "relay", "--broker", natsURL(), "--http", "", "--nats-stream", "NOSUCH_"+uniqueID()), exitRuntime)
	if !strings.Contains(r.stderr, "stream missing") || !strings.Contains(r.stderr, "outbox nats stream create --broker "+natsURL()+" --nats-stream NOSUCH_") {
		t.Errorf("relay without its stream: %v", r)
	}
}

// TestRabbitMQDeclareCommands: `outbox rabbitmq check` names the missing
// exchange and the command; `declare` creates the exchange and the queue,
// then nothing; `check` passes, and fails with the broker's reason for a
// queue of another type. Refused credentials and a wrong port say what to
// check.
func TestRabbitMQDeclareCommands(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		unavailable(t, "RabbitMQ at "+rabbitURL(), err)
	}
	defer conn.Close()
	id := uniqueID()
	exchange, queue := "outboxprov.x."+id, "outboxprov.q."+id
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
			_ = ch.Close()
		}
	})
	u, err := amqp.ParseURI(rabbitURL())
	if err != nil {
		t.Fatal(err)
	}
	password := u.Password
	broker := fmt.Sprintf("amqp://%s@%s:%d/", u.Username, u.Host, u.Port) // the default vhost; the password through the environment
	run := func(pw string, args ...string) result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var out, errb testdb.SyncBuffer
		code := runEnv(ctx, append([]string{"rabbitmq"}, args...), &out, &errb, func(k string) string {
			if k == envBrokerPassword {
				return pw
			}
			return ""
		})
		return result{code: code, stdout: out.String(), stderr: errb.String()}
	}
	base := []string{"--broker", broker, "--exchange", exchange, "--queue", queue}
	r := expect(t, run(password, append([]string{"check"}, base...)...), exitRuntime)
	if !strings.Contains(r.stderr, `no exchange "`+exchange+`": declare it with `+"`outbox rabbitmq declare --broker amqp://<user>@<host>:5672/<vhost> --exchange "+exchange+" --queue "+queue+"`") {
		t.Errorf("check before declare: %v", r)
	}
	r = expect(t, run(password, append([]string{"declare"}, base...)...), exitOK)
	if !strings.Contains(r.stdout, "created exchange "+exchange+" and queue "+queue) {
		t.Errorf("declare: %v", r)
	}
	r = expect(t, run(password, append([]string{"declare"}, base...)...), exitOK)
	if !strings.Contains(r.stdout, "already present with these settings; nothing changed") {
		t.Errorf("declare again: %v", r)
	}
	expect(t, run(password, append([]string{"check"}, base...)...), exitOK)
	r = expect(t, run(password, append([]string{"check", "--queue-type", "quorum"}, base...)...), exitRuntime)
	if !strings.Contains(r.stderr, "settings differ") || !strings.Contains(r.stderr, "inequivalent arg 'x-queue-type'") {
		t.Errorf("check of a quorum queue over a classic one: %v", r)
	}
	r = expect(t, run("not-the-password", append([]string{"check"}, base...)...), exitRuntime)
	if !strings.Contains(r.stderr, "check the user in --broker and the password in OUTBOX_BROKER_PASSWORD or --broker-password-file") ||
		strings.Contains(r.stderr, "not-the-password") {
		t.Errorf("refused credentials: %v", r)
	}
	r = expect(t, run(password, "check", "--broker", "amqp://"+u.Username+"@"+freeAddr(t)+"/"), exitRuntime)
	if !strings.Contains(r.stderr, "connection refused (is RabbitMQ running, and is that its port (default 5672)?)") {
		t.Errorf("wrong port: %v", r)
	}
	expect(t, run(password, "declare", "--broker", "nats://127.0.0.1:4222"), exitUsage)
}

// TestKafkaStateTopicCommands: `outbox kafka state-topic check` names the
// missing state topic and the command that creates it (exit 1); `create`
// creates it, then finds it there; `check` passes; without
// --kafka-transactional-id-prefix both refuse with a usage error.
func TestKafkaStateTopicCommands(t *testing.T) {
	t.Parallel()
	broker, err := kafkatest.Start(kafkatest.Topics(1, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	brokers := strings.Join(broker.Addrs(), ",")
	topic := "prov." + "orders_outbox" + ".outbox-txn"
	sub := func(name string, extra ...string) []string {
		return append([]string{"kafka", "state-topic", name, "--brokers", brokers, "--kafka-transactional-id-prefix", "prov.", "--table", "orders_outbox"}, extra...)
	}
	r := expect(t, cli(t, sub("check")...), exitRuntime)
	if !strings.Contains(r.stderr, "state topic "+topic+": missing") || !strings.Contains(r.stderr, "outbox kafka state-topic create") {
		t.Errorf("check before create: %v", r)
	}
	r = expect(t, cli(t, sub("create")...), exitOK)
	if !strings.Contains(r.stdout, "state topic "+topic+": created (1 partition)") {
		t.Errorf("create: %v", r)
	}
	r = expect(t, cli(t, append([]string{"--json"}, sub("create")...)...), exitOK)
	var out struct {
		Topic   string
		Created bool
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Topic != topic || out.Created {
		t.Errorf("create again --json: %+v, %v; %v", out, err, r)
	}
	r = expect(t, cli(t, sub("check")...), exitOK)
	if !strings.Contains(r.stdout, "state topic "+topic+": present") {
		t.Errorf("check after create: %v", r)
	}
	r = expect(t, cli(t, "kafka", "state-topic", "create", "--brokers", brokers), exitUsage)
	if !strings.Contains(r.stderr, "--kafka-transactional-id-prefix") {
		t.Errorf("create without a prefix: %v", r)
	}
}
