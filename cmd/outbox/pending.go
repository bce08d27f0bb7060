package main

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sqloutbox/outbox/relay"
)

// stdinKey holds, in the command's context, the reader a confirmation
// prompt reads (tests give their own); absent, the command's stdin.
type stdinKey struct{}

// pendingSelector is the selector of the pending commands: exactly one
// of --id or --aggregate (never all: dead-lettering every pending event
// would stop the whole outbox); list alone takes neither, for all.
type pendingSelector struct {
	id, aggregate string
	listing       bool // pending list: no selector lists every pending event
}

func (s *pendingSelector) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.id, "id", "", "select the pending event with this message ID")
	cmd.Flags().StringVar(&s.aggregate, "aggregate", "", "select the pending events of one aggregate, as TYPE/ID (e.g. order/42)")
}

func (s *pendingSelector) selector() (relay.Selector, error) {
	switch {
	case s.listing && s.id == "" && s.aggregate == "":
		return relay.Selector{All: true}, nil // listing changes nothing
	case (s.id != "") == (s.aggregate != ""):
		return relay.Selector{}, usageErrorf("choose exactly one of --id MESSAGE_ID or --aggregate TYPE/ID")
	case s.id != "":
		return relay.Selector{MessageID: s.id}, nil
	}
	typ, id, ok := strings.Cut(s.aggregate, "/")
	if !ok || typ == "" || id == "" {
		return relay.Selector{}, usageErrorf("--aggregate %q: want TYPE/ID, e.g. order/42", s.aggregate)
	}
	return relay.Selector{AggregateType: typ, AggregateID: id}, nil
}

func (s *pendingSelector) String() string {
	if s.id != "" {
		return "--id " + s.id
	}
	return "--aggregate " + s.aggregate
}

func (a *app) pendingCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pending",
		Short: "List pending events, or dead-letter ones the relay cannot publish",
		Long: `List the events still waiting to be published, or dead-letter some of them:
an event whose route does not exist (a topic, stream, subject or exchange
nobody created, or one the relay may not use) counts no attempt and stays
pending for ever, holding its aggregate and keeping the relay's /readyz at
503. Dead-lettering it lets the relay go on; 'outbox dead retry' puts it
back once the route exists.

Select with exactly one of --id MESSAGE_ID or --aggregate TYPE/ID.`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}

	listSel := pendingSelector{listing: true}
	var listLimit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List pending events, oldest first",
		Long: `List the pending events matching the selector (none: every pending
event), oldest first, at most --limit. With --json, prints
{"count": N, "pending": [...]}.`,
		Example: "  outbox pending list\n  outbox pending list --aggregate order/42\n  outbox pending list --id 0190f5c2-... --json",
		Args:    cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
			return a.pendingList(cmd, &listSel, listLimit)
		}),
	}
	listSel.register(list)
	list.Flags().IntVar(&listLimit, "limit", 100, "show at most this many")
	cmd.AddCommand(list)

	for _, action := range []struct{ name, short, long string }{
		{"dead", "Dead-letter pending events; they hold their aggregate",
			`Dead-letter the selected pending events: they become dead letters that hold
their aggregate's later events (strict order), exactly as if the relay had
given up on them, until 'outbox dead retry' or 'outbox dead skip'.`},
		{"skip", "Dead-letter pending events and release their aggregate",
			`Dead-letter the selected pending events without holding their aggregate:
the relay goes on with the aggregate's later events (consumers then see a
gap), as 'outbox dead skip' does for a dead letter. The events stay dead
letters, listed by 'outbox dead list'; nothing is marked sent that was not
published.`},
	} {
		var sel pendingSelector
		var dryRun, yes bool
		c := &cobra.Command{
			Use:   action.name,
			Short: action.short,
			Long: action.long + `

The command first lists the exact pending events it would change (at most
500) and asks for confirmation on stdin (type "yes"); --yes confirms
without asking. It then changes only the events it listed, and only those
still pending: one the relay publishes meanwhile is left alone. An event
the relay was publishing at that very moment may still reach the broker;
retrying it later delivers it again with the same message ID. The change
is written to stderr as an audit record (JSON, "component":
"outbox.audit"). With --dry-run, lists them and changes nothing. With
--json (needs --yes or --dry-run), prints {"action", "dry_run", "listed",
"count", "pending"}.`,
			Example: fmt.Sprintf("  outbox pending %[1]s --id 0190f5c2-... --dry-run\n  outbox pending %[1]s --aggregate order/42 --yes", action.name),
			Args:    cobra.NoArgs,
			RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
				return a.pendingAct(cmd, cmd.Name(), &sel, dryRun, yes)
			}),
		}
		sel.register(c)
		c.Flags().BoolVar(&dryRun, "dry-run", false, "list what would change, change nothing")
		c.Flags().BoolVar(&yes, "yes", false, "confirm without asking")
		cmd.AddCommand(c)
	}
	return cmd
}

type pendingJSON struct {
	ID            int64     `json:"id"`
	MessageID     string    `json:"message_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventType     string    `json:"event_type"`
	Topic         string    `json:"topic"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
}

func pendingToJSON(ps []relay.PendingEvent) []pendingJSON {
	out := make([]pendingJSON, 0, len(ps))
	for _, p := range ps {
		out = append(out, pendingJSON{ID: p.ID, MessageID: p.MessageID, AggregateType: p.AggregateType,
			AggregateID: p.AggregateID, EventType: p.EventType, Topic: p.Topic, Attempts: p.Attempts,
			LastError: p.LastError, CreatedAt: p.CreatedAt})
	}
	return out
}

// openPending validates the selector, connects and checks the schema.
func (a *app) openPending(cmd *cobra.Command, ps *pendingSelector) (*relay.DeadLetters, relay.Selector, func(), error) {
	sel, err := ps.selector()
	if err != nil {
		return nil, sel, nil, err
	}
	// openDeadLetters's own selector is unused here: --all stands in.
	dl, _, done, err := a.openDeadLetters(cmd, &selectorFlags{all: true}, 1)
	return dl, sel, done, err
}

func (a *app) pendingList(cmd *cobra.Command, ps *pendingSelector, limit int) error {
	if limit < 1 {
		return usageErrorf("--limit must be at least 1, got %d", limit)
	}
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	cmd.SetContext(ctx)
	dl, sel, done, err := a.openPending(cmd, ps)
	if err != nil {
		return err
	}
	defer done()
	ps2, err := dl.ListPending(ctx, sel, limit)
	if err != nil {
		return err
	}
	if a.json {
		return writeJSON(a.stdout, map[string]any{"count": len(ps2), "pending": pendingToJSON(ps2)})
	}
	if len(ps2) == 0 {
		fmt.Fprintln(a.stdout, "no pending events match")
		return nil
	}
	return a.printPending(ps2)
}

func (a *app) pendingAct(cmd *cobra.Command, action string, ps *pendingSelector, dryRun, yes bool) error {
	if a.json && !dryRun && !yes {
		return usageErrorf("--json needs --yes or --dry-run: the confirmation prompt cannot share stdout with JSON")
	}
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	cmd.SetContext(ctx)
	dl, sel, done, err := a.openPending(cmd, ps)
	if err != nil {
		return err
	}
	defer done()
	listed, err := dl.ListPending(ctx, sel, relay.MaxSelectorIDs+1)
	if err != nil {
		return err
	}
	more := len(listed) > relay.MaxSelectorIDs
	if more {
		listed = listed[:relay.MaxSelectorIDs]
	}
	if len(listed) == 0 {
		return &exitError{code: exitRuntime, msg: fmt.Sprintf("%s: no pending event matched %s; nothing was changed (see 'outbox dead list' for dead letters)", action, ps)}
	}
	if dryRun {
		if a.json {
			return writeJSON(a.stdout, map[string]any{"action": action, "dry_run": true, "listed": len(listed), "count": 0, "pending": pendingToJSON(listed)})
		}
		fmt.Fprintf(a.stdout, "dry run: %s would dead-letter these %d pending event(s); nothing was changed\n", action, len(listed))
		if err := a.printPending(listed); err != nil {
			return err
		}
		a.printMore(more)
		return nil
	}
	if !a.json {
		fmt.Fprintf(a.stdout, "%s would dead-letter these %d pending event(s):\n", action, len(listed))
		if err := a.printPending(listed); err != nil {
			return err
		}
		a.printMore(more)
	}
	if !yes {
		what := "Dead-letter them (holding their aggregates)"
		if action == "skip" {
			what = "Dead-letter them and release their aggregates"
		}
		fmt.Fprintf(a.stdout, "%s? Type yes to confirm: ", what)
		in := cmd.InOrStdin()
		if r, ok := ctx.Value(stdinKey{}).(io.Reader); ok {
			in = r
		}
		line, _ := bufio.NewReader(in).ReadString('\n')
		if ans := strings.ToLower(strings.TrimSpace(line)); ans != "yes" && ans != "y" {
			fmt.Fprintln(a.stdout)
			return &exitError{code: exitRuntime, msg: fmt.Sprintf("%s: not confirmed; nothing was changed (--yes confirms without asking)", action)}
		}
	}
	ids := make([]int64, len(listed))
	mids := make([]string, len(listed))
	for i, p := range listed {
		ids[i], mids[i] = p.ID, p.MessageID
	}
	policy, reason := relay.HoldAggregate, "dead-lettered while pending by an operator (outbox pending dead)"
	if action == "skip" {
		policy, reason = relay.SkipDead, "dead-lettered while pending by an operator, aggregate released (outbox pending skip)"
	}
	n, err := dl.DeadLetterPending(ctx, ids, policy, reason)
	audit := newJSONLog(a.stderr, a.redact).With("component", "outbox.audit")
	attrs := []any{"action", "pending " + action, "table", a.table, "selector", ps.String(), "user", a.getenv("USER"),
		"ids", ids, "message_ids", mids, "confirmed", len(ids), "changed", n}
	if err != nil {
		audit.Error("outbox mutation failed", append(attrs, "err", err)...)
		return err
	}
	audit.Info("outbox mutation", attrs...)
	if a.json {
		return writeJSON(a.stdout, map[string]any{"action": action, "dry_run": false, "listed": len(listed), "count": n, "pending": pendingToJSON(listed)})
	}
	fmt.Fprintf(a.stdout, "dead-lettered %d of the %d pending event(s) listed", n, len(listed))
	if action == "skip" {
		fmt.Fprint(a.stdout, "; their aggregates are released")
	}
	fmt.Fprintln(a.stdout)
	if int(n) < len(listed) {
		fmt.Fprintln(a.stdout, "the others were published or changed meanwhile and were left alone")
	}
	fmt.Fprintf(a.stdout, "once the route exists: outbox dead retry %s\n", ps)
	return nil
}

func (a *app) printMore(more bool) {
	if more {
		fmt.Fprintf(a.stdout, "... more match: only these first %d are acted on; run the command again for the rest\n", relay.MaxSelectorIDs)
	}
}

func (a *app) printPending(ps []relay.PendingEvent) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMESSAGE ID\tAGGREGATE\tEVENT TYPE\tTOPIC\tATTEMPTS\tCREATED\tLAST ERROR")
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%s\t%d\t%s\t%s\n", p.ID, p.MessageID, p.AggregateType, p.AggregateID,
			p.EventType, p.Topic, p.Attempts, p.CreatedAt.Format(time.RFC3339), truncate(oneLine(p.LastError), 80))
	}
	return tw.Flush()
}
