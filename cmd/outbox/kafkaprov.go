package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sqloutbox/outbox/relay/kafka"
)

// kafkaProvFlags are the flags of `outbox kafka state-topic create|check`.
type kafkaProvFlags struct {
	conn relayFlags // --broker/--brokers, TLS, SASL, --kafka-transactional-id-prefix
}

// kafkaCmd is `outbox kafka`: provisioning for the Kafka publisher's
// exactly-once mode (its state topic).
func (a *app) kafkaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:                   "kafka",
		Short:                 "Provision Kafka for the relay (the exactly-once mode's state topic)",
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	var f kafkaProvFlags
	st := &cobra.Command{
		Use:   "state-topic",
		Short: "Create or check the topic that carries the exactly-once mode's manifests",
		Long: `Create or check the state topic of the exactly-once mode
(--kafka-transactional-id-prefix): <prefix><table>.outbox-txn, one
partition. No record is ever written to it; each relay partition's
transactions commit their manifest (the outbox ids they published) as an
offset commit on its partition 0, and a relay taking over a partition reads
it back. A relay in that mode whose state topic is missing publishes
nothing and reports it as not ready (relay/kafka ErrStateTopicMissing).`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	// Each subcommand declares the flags as its own (under "Flags:" in its
	// help, not "Global Flags:"); both write into f.
	flags := func(fs *pflag.FlagSet) {
		f.conn.broker.register(fs)
		hideFlags(fs, "exchange", "nats-creds-file", "nats-nkey-file", "nats-stream") // other brokers'
		f.conn.tls.register(fs)
		f.conn.kafka.register(fs)
		fs.StringSliceVar(&f.conn.brokers, "brokers", nil, "Kafka bootstrap brokers, host:port, comma-separated: the same as --broker kafka://host:port,...; not with --broker")
		envFlag(fs, "brokers", "OUTBOX_BROKERS")
	}
	create := &cobra.Command{
		Use:   "create",
		Short: "Create the state topic (1 partition, the brokers' default replication), or find it there",
		Example: `  outbox kafka state-topic create --brokers 127.0.0.1:9092 --kafka-transactional-id-prefix billing. --table outbox_message
  outbox kafka state-topic create --broker kafka://kafka:9093 --tls-ca-file ca.pem --sasl-mechanism SCRAM-SHA-512 --sasl-user relay --sasl-password-file pw --kafka-transactional-id-prefix billing.`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error { return a.kafkaStateTopic(cmd, &f, true) }),
	}
	check := &cobra.Command{
		Use:   "check",
		Short: "Check that the state topic exists (exit 1 if not)",
		Args:  cobra.NoArgs,
		RunE:  a.wrap(func(cmd *cobra.Command, _ []string) error { return a.kafkaStateTopic(cmd, &f, false) }),
	}
	flags(create.Flags())
	flags(check.Flags())
	st.AddCommand(create, check)
	cmd.AddCommand(st)
	return cmd
}

func (a *app) kafkaStateTopic(cmd *cobra.Command, f *kafkaProvFlags, create bool) error {
	plan, err := a.provisionPlan(cmd, &f.conn, brokerKafka, "`outbox kafka state-topic` needs Kafka brokers (--brokers host:port or --broker kafka://host:port)")
	if err != nil {
		return err
	}
	if plan.eos == nil {
		return usageErrorf("`outbox kafka state-topic` needs --kafka-transactional-id-prefix (the relay's, with the same --table)")
	}
	cfg := kafka.Config{Brokers: plan.hosts, Sarama: plan.sarama, ExactlyOnce: plan.eos}
	name := kafka.StateTopic(plan.eos.TransactionalIDPrefix, plan.eos.Table)
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	created := false
	if create {
		created, err = kafka.CreateStateTopic(ctx, cfg)
	} else {
		err = kafka.CheckStateTopic(ctx, cfg)
	}
	switch {
	case errors.Is(err, kafka.ErrStateTopicMissing):
		return &exitError{code: exitRuntime, msg: fmt.Sprintf("state topic %s: missing (outbox kafka state-topic create, with the same flags, creates it)", name)}
	case err != nil:
		return configUsage(err, kafka.ErrConfig)
	}
	if a.json {
		return writeJSON(a.stdout, map[string]any{"topic": name, "created": created})
	}
	switch {
	case !create:
		_, err = fmt.Fprintf(a.stdout, "state topic %s: present\n", name)
	case created:
		_, err = fmt.Fprintf(a.stdout, "state topic %s: created (1 partition)\n", name)
	default:
		_, err = fmt.Fprintf(a.stdout, "state topic %s: already present; nothing changed\n", name)
	}
	return err
}
