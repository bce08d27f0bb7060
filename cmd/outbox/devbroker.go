package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// devBrokerFlags are the flags of `outbox dev-broker`.
type devBrokerFlags struct {
	port       int
	topics     []string
	partitions int32
	dataDir    string
}

// defaultDevBrokerPort is dev-broker's default port: Kafka's usual one,
// so that clients configured for localhost:9092 find it.
const defaultDevBrokerPort = 9092

func (a *app) devBrokerCmd() *cobra.Command {
	var f devBrokerFlags
	cmd := &cobra.Command{
		Use:   "dev-broker",
		Short: "Run an in-process Kafka-protocol broker for development (not for production)",
		Long: `Run a one-node, in-process Kafka-protocol broker (franz-go's kfake, the
broker the outbox's own tests use), so that the standalone relay, the
examples and your service run on a machine without Kafka. It is for
development and tests only: one node, no replication, no security, data in
memory unless --data-dir is given.

It creates the topics given by --topic (NAME, or NAME:PARTITIONS; the
relay's default topic for aggregate type T is outbox.event.T), prints the
bootstrap address (host:port) as the only line on stdout (with --json, an
object {"brokers": [...], "topics": {name: partitions}}), and runs until
SIGINT or SIGTERM. --dsn is not used.`,
		Example: `  outbox dev-broker --topic outbox.event.order &
  outbox --dsn sqlite:app.db relay --brokers 127.0.0.1:9092`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error { return a.devBroker(cmd, f) }),
	}
	fs := cmd.Flags()
	fs.IntVar(&f.port, "port", defaultDevBrokerPort, "port to listen on, on 127.0.0.1 (0: a random free port)")
	fs.StringSliceVar(&f.topics, "topic", nil, "topic to create, NAME or NAME:PARTITIONS; repeatable or comma-separated")
	fs.Int32Var(&f.partitions, "partitions", 8, "partitions of a --topic given without a count")
	fs.StringVar(&f.dataDir, "data-dir", "", "keep the broker's data in this directory across restarts (default: in memory)")
	return cmd
}

// parseTopics turns --topic values into a name -> partitions map; a name
// given twice keeps the last count.
func parseTopics(specs []string, partitions int32) (map[string]int32, error) {
	if partitions < 1 {
		return nil, usageErrorf("--partitions must be at least 1, got %d", partitions)
	}
	out := make(map[string]int32, len(specs))
	for _, s := range specs {
		name, count, hasCount := strings.Cut(s, ":")
		n := partitions
		if hasCount {
			v, err := strconv.ParseInt(count, 10, 32)
			if err != nil || v < 1 {
				return nil, usageErrorf("--topic %q: the partition count after ':' must be a whole number of at least 1", s)
			}
			n = int32(v)
		}
		if name == "" {
			return nil, usageErrorf("--topic %q: empty topic name", s)
		}
		out[name] = n
	}
	return out, nil
}

func (a *app) devBroker(cmd *cobra.Command, f devBrokerFlags) error {
	if f.port < 0 || f.port > 65535 {
		return usageErrorf("--port must be in 0..65535, got %d", f.port)
	}
	topics, err := parseTopics(f.topics, f.partitions)
	if err != nil {
		return err
	}
	opts := []kafkatest.Option{kafkatest.Port(f.port)}
	for name, n := range topics {
		opts = append(opts, kafkatest.Topics(n, name))
	}
	if f.dataDir != "" {
		opts = append(opts, kafkatest.DataDir(f.dataDir))
	}
	b, err := kafkatest.Start(opts...)
	if err != nil {
		return fmt.Errorf("starting the broker on --port %d: %w", f.port, err)
	}
	defer b.Close()
	if a.json {
		err = writeJSON(a.stdout, struct {
			Brokers []string         `json:"brokers"`
			Topics  map[string]int32 `json:"topics"`
		}{b.Addrs(), topics})
	} else {
		_, err = fmt.Fprintln(a.stdout, strings.Join(b.Addrs(), ","))
	}
	if err != nil {
		return err
	}
	shown, _ := json.Marshal(topics)
	fmt.Fprintf(a.stderr, "dev-broker: listening on %s, topics %s; development only; stop with Ctrl-C (SIGINT) or SIGTERM\n", strings.Join(b.Addrs(), ","), shown)
	<-cmd.Context().Done()
	// A second signal kills the process; closing the broker is quick.
	restoreSignals(cmd.Context())
	fmt.Fprintln(a.stderr, "dev-broker: stopped")
	return nil
}
