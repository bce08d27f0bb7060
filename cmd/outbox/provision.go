package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sqloutbox/outbox/relay/kafka"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
)

// natsStreamFlags are the flags of `outbox nats stream create|check`.
type natsStreamFlags struct {
	conn       relayFlags // --broker, its credentials and TLS
	prefix     string
	storage    string
	replicas   int
	duplicates time.Duration
}

func (a *app) natsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:                   "nats",
		Short:                 "Provision NATS JetStream for the relay",
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	var f natsStreamFlags
	stream := &cobra.Command{
		Use:   "stream",
		Short: "Create or check the JetStream stream the relay publishes into",
		Long: `Create or check the JetStream stream that stores the relay's messages:
subjects <--subject-prefix>> (the relay publishes to
<prefix><aggregate type>.<aggregate id token>), --storage, --replicas and
--duplicate-window.

The duplicate window is what the relay's "no message stored twice" rests
on: JetStream drops a message whose Nats-Msg-Id (the outbox message ID) it
stored within the window. Size it to cover the longest time between a
publish and its re-send: the relay's backoff (up to 30 s) plus its publish
timeout (10 s), or, after a crash, --lease-ttl (10 s) plus the next
owner's claim. The default, JetStream's 2 minutes, covers the relay's
defaults with room; add your --lease-ttl if you raised it. Re-sends after a
longer outage are stored again, and consumers deduping by the
outbox-message-id header (the inbox) still apply them once.

Both subcommands are idempotent and never change an existing stream: one
whose settings differ is reported, setting by setting, and the command
exits 1.`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	// Each subcommand declares the flags as its own (under "Flags:" in
	// its help, not "Global Flags:"); both write into f.
	flags := func(fs *pflag.FlagSet) {
		f.conn.broker.register(fs)
		hideFlags(fs, "exchange") // RabbitMQ's
		f.conn.tls.register(fs)
		// --nats-stream, the relay's name for the stream; --stream is the
		// old, deprecated spelling of it, hidden (not MarkDeprecated, whose
		// notice would go to stdout, into --json output).
		fs.StringVar(&f.conn.broker.natsStream, "stream", natspub.DefaultStreamName, "deprecated: use --nats-stream")
		_ = fs.MarkHidden("stream")
		ns := fs.Lookup("nats-stream")
		ns.DefValue = natspub.DefaultStreamName
		ns.Usage = "NATS: the stream to create or check, the relay's --nats-stream (env OUTBOX_NATS_STREAM)"
		fs.StringVar(&f.prefix, "subject-prefix", kafka.DefaultTopicPrefix, "the relay's --topic-prefix: the stream binds this prefix followed by >")
		fs.StringVar(&f.storage, "storage", "file", "file (survives a server restart) or memory")
		fs.IntVar(&f.replicas, "replicas", 1, "servers storing each message (1-5; a PubAck waits for a quorum)")
		fs.DurationVar(&f.duplicates, "duplicate-window", natspub.DefaultDuplicateWindow, "JetStream's duplicate window (see above for sizing it)")
	}
	create := &cobra.Command{
		Use:   "create",
		Short: "Create the stream, or find it there with the same settings",
		Example: `  outbox nats stream create --broker nats://127.0.0.1:4222
  outbox nats stream create --broker nats://nats:4222 --nats-creds-file relay.creds --replicas 3 --duplicate-window 5m`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error { return a.natsStream(cmd, &f, true) }),
	}
	check := &cobra.Command{
		Use:     "check",
		Short:   "Check that the stream exists with these settings (exit 1 if not, saying why)",
		Example: `  outbox nats stream check --broker nats://127.0.0.1:4222`,
		Args:    cobra.NoArgs,
		RunE:    a.wrap(func(cmd *cobra.Command, _ []string) error { return a.natsStream(cmd, &f, false) }),
	}
	flags(create.Flags())
	flags(check.Flags())
	stream.AddCommand(create, check)
	cmd.AddCommand(stream)
	return cmd
}

func (a *app) natsStream(cmd *cobra.Command, f *natsStreamFlags, create bool) error {
	f.conn.topicPrefix = f.prefix
	plan, err := a.provisionPlan(cmd, &f.conn, brokerNATS, "`outbox nats` needs a NATS --broker (nats://host:4222 or tls://...)")
	if err != nil {
		return err
	}
	sc := natspub.StreamConfig{Name: f.conn.broker.natsStream, SubjectPrefix: f.prefix, Replicas: f.replicas, Duplicates: f.duplicates}
	switch strings.ToLower(f.storage) {
	case "file":
		sc.Storage = jetstream.FileStorage
	case "memory":
		sc.Storage = jetstream.MemoryStorage
	default:
		return usageErrorf("--storage %q: want file or memory", f.storage)
	}
	if f.duplicates <= 0 {
		return usageErrorf("--duplicate-window %s: want a positive duration", f.duplicates)
	}
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	log := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nc, _, err := a.dialNATS(plan, a.timeout, log, nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	state := "ok"
	if create {
		created, err := natspub.CreateStream(ctx, nc, sc)
		if err != nil {
			return configUsage(withGivenBroker(err, plan.shown), natspub.ErrConfig)
		}
		state = "exists"
		if created {
			state = "created"
		}
	} else if err := natspub.CheckStream(ctx, nc, sc); err != nil {
		return configUsage(withGivenBroker(err, plan.shown), natspub.ErrConfig)
	}
	subjects := sc.Subjects()[0]
	if a.json {
		return writeJSON(a.stdout, map[string]any{
			"stream": f.conn.broker.natsStream, "state": state, "subjects": []string{subjects}, "storage": strings.ToLower(f.storage),
			"replicas": f.replicas, "duplicate_window": f.duplicates.String()})
	}
	what := map[string]string{"created": "created", "exists": "already exists with these settings; nothing changed", "ok": "exists with these settings"}[state]
	_, err = fmt.Fprintf(a.stdout, "stream %s %s: subjects %s, %s storage, %d replica(s), duplicate window %s\n",
		f.conn.broker.natsStream, what, subjects, strings.ToLower(f.storage), f.replicas, f.duplicates)
	return err
}

// provisionPlan checks a provisioning command's broker flags as the relay
// does (brokerPlan: credentials, TLS, another broker's flags refused) and
// that --broker names a broker of kind; otherwise a usage error saying
// need.
func (a *app) provisionPlan(cmd *cobra.Command, f *relayFlags, kind brokerKind, need string) (*brokerPlan, error) {
	plan, err := a.brokerPlan(f, cmd.Flags().Changed)
	if err != nil {
		return nil, err
	}
	if plan.kind != kind {
		return nil, usageErrorf("%s, not %s", need, plan.shown)
	}
	return plan, nil
}

// configUsage turns a provisioning error into the command's: one
// wrapping configErr (an invalid setting) is a usage error (exit 2), the
// rest runtime errors (exit 1).
func configUsage(err, configErr error) error {
	if errors.Is(err, configErr) {
		return &exitError{code: exitUsage, msg: err.Error()}
	}
	return err
}

// rabbitFlags are the flags of `outbox rabbitmq declare|check`.
type rabbitFlags struct {
	conn       relayFlags // --broker, --exchange, the password and TLS
	queue      string
	queueType  string
	bindingKey string
}

func (a *app) rabbitmqCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:                   "rabbitmq",
		Short:                 "Provision RabbitMQ for the relay",
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	var f rabbitFlags
	// Each subcommand declares the flags as its own (under "Flags:" in
	// its help, not "Global Flags:"); both write into f.
	flags := func(fs *pflag.FlagSet) {
		f.conn.broker.register(fs)
		hideFlags(fs, "nats-creds-file", "nats-nkey-file", "nats-stream") // NATS's
		f.conn.tls.register(fs)
		fs.StringVar(&f.queue, "queue", "", "also a durable queue bound to the exchange, so that messages are not returned as unroutable before a consumer binds its own")
		fs.StringVar(&f.queueType, "queue-type", rabbitmq.QueueClassic, "the queue's type: classic or quorum")
		fs.StringVar(&f.bindingKey, "binding-key", "#", "the queue's binding key (routing keys are <aggregate type>.<aggregate id word>: order.# takes the order events)")
	}
	defer func() {
		for _, sub := range cmd.Commands() {
			flags(sub.Flags())
		}
	}()
	cmd.AddCommand(&cobra.Command{
		Use:   "declare",
		Short: "Declare the durable topic exchange (and --queue), or find them there with the same settings",
		Long: `Declare the durable topic exchange the relay publishes to (--exchange,
default outbox.event) and, with --queue, a durable queue bound to it. The
relay itself declares nothing. Idempotent: what exists with the same
settings is left alone; an exchange or queue with other settings is left
unchanged and reported with the broker's reason, which names the setting
(exit 1).`,
		Example: `  outbox rabbitmq declare --broker amqp://guest@127.0.0.1:5672/   # password: OUTBOX_BROKER_PASSWORD or --broker-password-file
  outbox rabbitmq declare --broker amqp://relay@rabbit:5672/prod --exchange orders --queue billing --queue-type quorum --binding-key 'order.#'`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error { return a.rabbitTopology(cmd, &f, true) }),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "check",
		Short: "Check that the exchange (and --queue) exist with these settings (exit 1 if not, saying why)",
		Long: `Check that the exchange (and --queue) exist with the settings declare
makes. AMQP 0-9-1 cannot list bindings: the binding is not checked.`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error { return a.rabbitTopology(cmd, &f, false) }),
	})
	return cmd
}

func (a *app) rabbitTopology(cmd *cobra.Command, f *rabbitFlags, declare bool) error {
	plan, err := a.provisionPlan(cmd, &f.conn, brokerRabbitMQ, "`outbox rabbitmq` needs a RabbitMQ --broker (amqp://user@host:5672/vhost or amqps://...)")
	if err != nil {
		return err
	}
	top := rabbitmq.Topology{Exchange: plan.exchange, Queue: f.queue, QueueType: f.queueType, BindingKey: f.bindingKey}
	if top.Exchange == "" {
		top.Exchange = rabbitmq.DefaultExchange
	}
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	conn, err := dialRabbitMQ(plan, a.timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	var created []string
	if declare {
		created, err = rabbitmq.Declare(ctx, conn, top)
	} else {
		err = rabbitmq.CheckTopology(ctx, conn, top)
	}
	if err != nil {
		return configUsage(err, rabbitmq.ErrConfig)
	}
	if a.json {
		out := map[string]any{"exchange": top.Exchange, "created": append([]string{}, created...)}
		if top.Queue != "" {
			out["queue"], out["queue_type"], out["binding_key"] = top.Queue, top.QueueType, top.BindingKey
		}
		return writeJSON(a.stdout, out)
	}
	what := "exchange " + top.Exchange + " (durable, topic)"
	if top.Queue != "" {
		what += fmt.Sprintf(", queue %s (durable, %s) bound with %q", top.Queue, top.QueueType, top.BindingKey)
	}
	switch {
	case !declare:
		_, err = fmt.Fprintf(a.stdout, "%s: present with these settings\n", what)
	case len(created) == 0:
		_, err = fmt.Fprintf(a.stdout, "%s: already present with these settings; nothing changed\n", what)
	default:
		_, err = fmt.Fprintf(a.stdout, "%s: created %s\n", what, strings.Join(created, " and "))
	}
	return err
}
