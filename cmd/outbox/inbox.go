package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sqloutbox/outbox/inbox"
)

// inboxFlags are the flags every `outbox inbox parked` command takes.
type inboxFlags struct {
	table     string
	consumer  string
	id        string
	aggregate string
	all       bool
	limit     int
}

func (f *inboxFlags) register(cmd *cobra.Command, selector bool) {
	cmd.Flags().StringVar(&f.table, "inbox-table", inbox.DefaultTable, "inbox table, name or schema.name")
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "the consumer (inbox.Config.Consumer) whose messages to act on; required")
	cmd.Flags().StringVar(&f.id, "id", "", "select the message with this message ID")
	cmd.Flags().StringVar(&f.aggregate, "aggregate", "", "select one aggregate's messages, as TYPE/ID (e.g. order/42)")
	if selector {
		cmd.Flags().BoolVar(&f.all, "all", false, "select every parked message of the consumer")
	}
	cmd.Flags().IntVar(&f.limit, "limit", inbox.DefaultListLimit, fmt.Sprintf("show at most this many (1 to %d)", inbox.MaxListLimit))
}

// filter validates the flags into a ParkedFilter; action "skip" requires a
// selector (--id, --aggregate or --all).
func (f *inboxFlags) filter(action string) (inbox.ParkedFilter, error) {
	var pf inbox.ParkedFilter
	if f.consumer == "" {
		return pf, usageErrorf("--consumer is required: the inbox consumer name (inbox.Config.Consumer)")
	}
	if f.limit < 1 || f.limit > inbox.MaxListLimit {
		return pf, usageErrorf("--limit must be 1 to %d, got %d", inbox.MaxListLimit, f.limit)
	}
	pf.ID, pf.All, pf.Limit = f.id, f.all, f.limit
	if f.aggregate != "" {
		typ, id, ok := strings.Cut(f.aggregate, "/")
		if !ok || typ == "" || id == "" {
			return pf, usageErrorf("--aggregate %q: want TYPE/ID, e.g. order/42", f.aggregate)
		}
		pf.AggregateType, pf.AggregateID = typ, id
	}
	if action == "skip" || action == "retry" {
		n := 0
		for _, set := range []bool{f.id != "", f.aggregate != "", f.all} {
			if set {
				n++
			}
		}
		if n != 1 {
			return pf, usageErrorf("choose exactly one of --id MESSAGE_ID, --aggregate TYPE/ID or --all")
		}
	}
	return pf, nil
}

func (a *app) inboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Inspect a consumer's inbox (the dedupe table of package inbox)",
		Long: `Inspect the inbox table of a consumer that applies events with
github.com/sqloutbox/outbox/inbox (directly or through the Kafka runner
inbox/kafka). The inbox lives in the consumer's database: give its DSN.`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	parked := &cobra.Command{
		Use:   "parked",
		Short: "List, skip or request a retry of parked messages (the inbox's dead letters) and the held ones behind them",
		Long: `List, skip or retry parked messages: messages whose handler failed every
attempt and that the consumer parked. While a message is parked, the same
consumer's later messages of its aggregate are stored as held (not
applied), so the aggregate's order is kept.

Retrying runs the consumer's own handler, which this command does not
have: 'retry' (and 'skip', for the held messages behind what it skips)
records a retry request in the inbox's <table>_requests table, and the
running consumer's runner serves it with its handler within its
RequestInterval (5 s by default; inbox.Inbox.ServeRequests for a consumer
without a runner).`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	cmd.AddCommand(parked)

	var lf inboxFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List parked and held messages, in the order they were stored",
		Long: `List the consumer's parked and held messages matching --id or --aggregate
(all of them without either), in the order they were stored, at most
--limit. With --json, prints {"count": N, "parked": [...]}.`,
		Example: "  outbox --dsn \"$DSN\" inbox parked list --consumer billing\n  outbox --dsn \"$DSN\" inbox parked list --consumer billing --aggregate order/42 --json",
		Args:    cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
			return a.inboxList(cmd, &lf)
		}),
	}
	lf.register(list, false)
	parked.AddCommand(list)

	var sf inboxFlags
	var dryRun bool
	skip := &cobra.Command{
		Use:   "skip",
		Short: "Mark parked messages skipped: never applied; a redelivery is a duplicate",
		Long: `Mark the selected parked messages skipped: their handler never runs, a
redelivery is a duplicate, and retention deletes them like processed rows.
The held messages behind them are released: the same transaction records
a retry request for their aggregates, which the running consumer serves
with its handler within its RequestInterval, in order. Select with exactly
one of --id, --aggregate or --all.

With --dry-run, lists the parked messages it would skip (at most --limit)
and changes nothing. With --json, prints {"action", "dry_run", "count"}
and, for a dry run, "parked".`,
		Example: "  outbox --dsn \"$DSN\" inbox parked skip --consumer billing --id 0190f5c2-... --dry-run",
		Args:    cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
			return a.inboxSkip(cmd, &sf, dryRun)
		}),
	}
	sf.register(skip, true)
	skip.Flags().BoolVar(&dryRun, "dry-run", false, "show what would change, change nothing")
	parked.AddCommand(skip)

	var rf inboxFlags
	retry := &cobra.Command{
		Use:   "retry",
		Short: "Request a retry of parked and held messages; the running consumer runs them with its handler",
		Long: `Record a retry request for the aggregates (or messages without one) of
the selected parked and held messages. The consumer's runner (inboxkafka
and the other inbox runners) serves it within its RequestInterval: it runs
the aggregate's parked and held messages through its handler, in order,
and stops at a failure, which stays parked. Select with exactly one of
--id, --aggregate or --all. With --json, prints {"action", "count"}.`,
		Example: "  outbox --dsn \"$DSN\" inbox parked retry --consumer billing --aggregate order/42",
		Args:    cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
			return a.inboxRetry(cmd, &rf)
		}),
	}
	rf.register(retry, true)
	parked.AddCommand(retry)
	return cmd
}

func (a *app) inboxRetry(cmd *cobra.Command, f *inboxFlags) error {
	return a.withInbox(cmd, f, "retry", func(ctx context.Context, in *inbox.Inbox, db *sql.DB, pf inbox.ParkedFilter) error {
		n, err := in.RequestRetry(ctx, db, pf)
		if errors.Is(err, inbox.ErrNothingMatched) {
			return &exitError{code: exitRuntime, msg: "retry: no parked or held message matched; nothing was requested (see 'outbox inbox parked list')"}
		}
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, map[string]any{"action": "retry", "count": n})
		}
		fmt.Fprintf(a.stdout, "requested a retry of %d aggregate(s) or message(s); the running consumer runs them with its handler within its request interval\n", n)
		return nil
	})
}

// withInbox validates the flags into a filter for action, connects, checks
// the inbox schema and runs do under the command's context.
func (a *app) withInbox(cmd *cobra.Command, f *inboxFlags, action string, do func(ctx context.Context, in *inbox.Inbox, db *sql.DB, pf inbox.ParkedFilter) error) error {
	pf, err := f.filter(action)
	if err != nil {
		return err
	}
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	cmd.SetContext(ctx)
	in, db, err := a.openInbox(cmd, f)
	if err != nil {
		return err
	}
	defer db.Close()
	return do(ctx, in, db, pf)
}

// openInbox validates the inbox configuration, connects and checks the
// inbox schema.
func (a *app) openInbox(cmd *cobra.Command, f *inboxFlags) (*inbox.Inbox, *sql.DB, error) {
	ctx := cmd.Context()
	t, err := parseDSN(a.dsn)
	if err != nil {
		return nil, nil, err
	}
	in, err := inbox.New(inbox.Config{Dialect: t.dialect, Table: f.table, Consumer: f.consumer})
	if err != nil {
		return nil, nil, &exitError{code: exitUsage, msg: err.Error()}
	}
	_, db, err := a.open(ctx, true)
	if err != nil {
		return nil, nil, err
	}
	if err := in.Check(ctx, db); err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("inbox table %s: %w (the consumer's inbox.Migrate creates it)", f.table, err)
	}
	return in, db, nil
}

type parkedJSON struct {
	MessageID     string    `json:"message_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Topic         string    `json:"topic"`
	Partition     int32     `json:"partition"`
	Offset        int64     `json:"offset"`
	Held          bool      `json:"held"`
	Attempts      int       `json:"attempts"`
	Cause         string    `json:"cause"`
	StoredAt      time.Time `json:"stored_at"`
	ParkedAt      time.Time `json:"parked_at"`
}

func parkedToJSON(ps []inbox.Parked) []parkedJSON {
	out := make([]parkedJSON, 0, len(ps))
	for _, p := range ps {
		out = append(out, parkedJSON{MessageID: p.ID, AggregateType: p.AggregateType, AggregateID: p.AggregateID,
			Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Held: p.Held, Attempts: p.Attempts,
			Cause: p.Cause, StoredAt: p.StoredAt, ParkedAt: p.ParkedAt})
	}
	return out
}

func (a *app) inboxList(cmd *cobra.Command, f *inboxFlags) error {
	return a.withInbox(cmd, f, "list", func(ctx context.Context, in *inbox.Inbox, db *sql.DB, pf inbox.ParkedFilter) error {
		ps, err := in.ListParked(ctx, db, pf)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, map[string]any{"count": len(ps), "parked": parkedToJSON(ps)})
		}
		if len(ps) == 0 {
			fmt.Fprintln(a.stdout, "no parked or held messages match")
			return nil
		}
		return a.printParked(ps)
	})
}

func (a *app) inboxSkip(cmd *cobra.Command, f *inboxFlags, dryRun bool) error {
	return a.withInbox(cmd, f, "skip", func(ctx context.Context, in *inbox.Inbox, db *sql.DB, pf inbox.ParkedFilter) error {
		if dryRun {
			listed := pf
			listed.All, listed.Limit = false, inbox.MaxListLimit
			ps, err := in.ListParked(ctx, db, listed)
			if err != nil {
				return err
			}
			var affected []inbox.Parked
			for _, p := range ps {
				if !p.Held {
					affected = append(affected, p)
				}
			}
			shown := affected[:min(f.limit, len(affected))]
			if a.json {
				return writeJSON(a.stdout, map[string]any{"action": "skip", "dry_run": true, "count": len(affected), "parked": parkedToJSON(shown)})
			}
			if len(affected) == 0 && !pf.All {
				return &exitError{code: exitRuntime, msg: "skip: no parked message matched; nothing was changed (see 'outbox inbox parked list')"}
			}
			fmt.Fprintf(a.stdout, "dry run: skip would change %d parked message(s); nothing was changed\n", len(affected))
			if len(shown) == 0 {
				return nil
			}
			return a.printParked(shown)
		}
		n, err := in.Skip(ctx, db, pf)
		if errors.Is(err, inbox.ErrNothingMatched) {
			if !pf.All {
				return &exitError{code: exitRuntime, msg: "skip: no parked message matched; nothing was changed (see 'outbox inbox parked list')"}
			}
			n, err = 0, nil // --all with nothing to do is no error
		}
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, map[string]any{"action": "skip", "dry_run": false, "count": n})
		}
		fmt.Fprintf(a.stdout, "skipped %d parked message(s); the running consumer runs the held messages behind them within its request interval\n", n)
		return nil
	})
}

func (a *app) printParked(ps []inbox.Parked) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MESSAGE ID\tAGGREGATE\tSTATE\tATTEMPTS\tSOURCE\tSTORED\tCAUSE")
	for _, p := range ps {
		state := "parked"
		if p.Held {
			state = "held"
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%d\t%s[%d]@%d\t%s\t%s\n", p.ID, p.AggregateType, p.AggregateID, state, p.Attempts,
			p.Topic, p.Partition, p.Offset, p.StoredAt.Format(time.RFC3339), truncate(oneLine(p.Cause), 80))
	}
	return tw.Flush()
}
