package main

import (
	"fmt"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sqloutbox/outbox/relay"
)

// selectorFlags are the dead-letter selectors: exactly one is required.
type selectorFlags struct {
	id        string
	aggregate string
	all       bool
}

func (s *selectorFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.id, "id", "", "select the dead letter with this message ID")
	cmd.Flags().StringVar(&s.aggregate, "aggregate", "", "select the dead letters of one aggregate, as TYPE/ID (e.g. order/42)")
	cmd.Flags().BoolVar(&s.all, "all", false, "select every dead letter")
}

// nothingMatched returns the error (exit 1) of an action on --id or
// --aggregate that changed, or would change, no dead letter: a typo in
// the selector must not look like success. --all with nothing to do is
// no error.
func (s *selectorFlags) nothingMatched(action string, n int) error {
	if n > 0 || s.all {
		return nil
	}
	what := "dead letter"
	if action == "skip" {
		what = "dead letter still holding its aggregate"
	}
	sel := "--id " + s.id
	if s.aggregate != "" {
		sel = "--aggregate " + s.aggregate
	}
	return &exitError{code: exitRuntime, msg: fmt.Sprintf("%s: no %s matched %s; nothing was changed (see 'outbox dead list --all')", action, what, sel)}
}

func (s *selectorFlags) selector() (relay.Selector, error) {
	n := 0
	for _, set := range []bool{s.id != "", s.aggregate != "", s.all} {
		if set {
			n++
		}
	}
	if n != 1 {
		return relay.Selector{}, usageErrorf("choose exactly one of --id MESSAGE_ID, --aggregate TYPE/ID or --all")
	}
	switch {
	case s.id != "":
		return relay.Selector{MessageID: s.id}, nil
	case s.aggregate != "":
		typ, id, ok := strings.Cut(s.aggregate, "/")
		if !ok || typ == "" || id == "" {
			return relay.Selector{}, usageErrorf("--aggregate %q: want TYPE/ID, e.g. order/42", s.aggregate)
		}
		return relay.Selector{AggregateType: typ, AggregateID: id}, nil
	default:
		return relay.Selector{All: true}, nil
	}
}

func (a *app) deadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List, retry or skip dead letters (events the relay gave up on)",
		Long: `List, retry or skip dead letters: events the relay marked failed after its
attempts ran out or on a permanent publish error. Under the default
HoldAggregate policy a dead letter holds back its aggregate's later events
until it is retried or skipped.

Select with exactly one of --id MESSAGE_ID, --aggregate TYPE/ID or --all.
retry and skip accept --dry-run to show what they would change, and change
nothing. Both are single UPDATE statements, safe beside running relays.`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}

	var listSel selectorFlags
	var listLimit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Long: `List dead letters matching the selector (none: all of them, as --all),
oldest first, at most --limit.
With --json, prints {"count": N, "dead_letters": [...]}.`,
		Example: "  outbox dead list --all\n  outbox dead list --aggregate order/42 --json",
		Args:    cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
			return a.deadList(cmd, &listSel, listLimit)
		}),
	}
	listSel.register(list)
	list.Flags().IntVar(&listLimit, "limit", 100, "show at most this many")
	cmd.AddCommand(list)

	for _, action := range []struct{ name, short, long string }{
		{"retry", "Put dead letters back to pending with a fresh attempt budget",
			`Put the selected dead letters back to pending with a fresh attempt budget.
A retried event has a lower id than the events it held, so the relay
publishes it before them: order per aggregate is kept.`},
		{"skip", "Release the aggregates held by dead letters; the events stay dead",
			`Leave the selected dead letters failed but release their aggregates, so the
relay goes on with their later events (consumers then see a gap). Dead
letters already released are not counted.`},
	} {
		var sel selectorFlags
		var dryRun bool
		var limit int
		c := &cobra.Command{
			Use:   action.name,
			Short: action.short,
			Long: action.long + `

With --dry-run, lists the dead letters it would change (at most --limit)
and how many, and changes nothing. With --json, prints {"action", "dry_run",
"count"} and, for a dry run, "dead_letters".`,
			Example: fmt.Sprintf("  outbox dead %[1]s --id 0190f5c2-... --dry-run\n  outbox dead %[1]s --aggregate order/42", action.name),
			Args:    cobra.NoArgs,
			RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
				return a.deadAct(cmd, cmd.Name(), &sel, dryRun, limit)
			}),
		}
		sel.register(c)
		c.Flags().BoolVar(&dryRun, "dry-run", false, "show what would change, change nothing")
		c.Flags().IntVar(&limit, "limit", 100, "with --dry-run, show at most this many")
		cmd.AddCommand(c)
	}
	return cmd
}

type deadLetterJSON struct {
	ID            int64     `json:"id"`
	MessageID     string    `json:"message_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventType     string    `json:"event_type"`
	Topic         string    `json:"topic"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error"`
	Held          bool      `json:"held"`
	DeadAt        time.Time `json:"dead_at"`
}

func toJSON(dls []relay.DeadLetter) []deadLetterJSON {
	out := make([]deadLetterJSON, 0, len(dls))
	for _, d := range dls {
		out = append(out, deadLetterJSON{ID: d.ID, MessageID: d.MessageID, AggregateType: d.AggregateType,
			AggregateID: d.AggregateID, EventType: d.EventType, Topic: d.Topic, Attempts: d.Attempts,
			LastError: d.LastError, Held: d.Held, DeadAt: d.DeadAt})
	}
	return out
}

// openDeadLetters validates the selector, connects and checks the schema.
func (a *app) openDeadLetters(cmd *cobra.Command, sf *selectorFlags, limit int) (*relay.DeadLetters, relay.Selector, func(), error) {
	sel, err := sf.selector()
	if err != nil {
		return nil, sel, nil, err
	}
	if limit < 1 {
		return nil, sel, nil, usageErrorf("--limit must be at least 1, got %d", limit)
	}
	ctx := cmd.Context()
	t, db, err := a.open(ctx, true)
	if err != nil {
		return nil, sel, nil, err
	}
	if err := checkSchema(ctx, db, t, a.table, false); err != nil {
		_ = db.Close()
		return nil, sel, nil, err
	}
	ob, err := a.outbox(t, 0)
	if err != nil {
		_ = db.Close()
		return nil, sel, nil, err
	}
	dl, err := relay.NewDeadLetters(ob, db)
	if err != nil {
		_ = db.Close()
		return nil, sel, nil, err
	}
	return dl, sel, func() { _ = db.Close() }, nil
}

func (a *app) deadList(cmd *cobra.Command, sf *selectorFlags, limit int) error {
	if sf.id == "" && sf.aggregate == "" {
		sf.all = true // listing changes nothing: no selector lists them all
	}
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	cmd.SetContext(ctx)
	dl, sel, done, err := a.openDeadLetters(cmd, sf, limit)
	if err != nil {
		return err
	}
	defer done()
	dls, err := dl.List(ctx, sel, limit)
	if err != nil {
		return err
	}
	if a.json {
		return writeJSON(a.stdout, map[string]any{"count": len(dls), "dead_letters": toJSON(dls)})
	}
	if len(dls) == 0 {
		fmt.Fprintln(a.stdout, "no dead letters match")
		return nil
	}
	return a.printDeadLetters(dls, len(dls))
}

func (a *app) deadAct(cmd *cobra.Command, action string, sf *selectorFlags, dryRun bool, limit int) error {
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	cmd.SetContext(ctx)
	dl, sel, done, err := a.openDeadLetters(cmd, sf, limit)
	if err != nil {
		return err
	}
	defer done()
	if dryRun {
		all, err := dl.List(ctx, sel, math.MaxInt32)
		if err != nil {
			return err
		}
		affected := all
		if action == "skip" { // skip changes only those still holding their aggregate
			affected = affected[:0:0]
			for _, d := range all {
				if d.Held {
					affected = append(affected, d)
				}
			}
		}
		shown := affected[:min(limit, len(affected))]
		if a.json {
			if err := writeJSON(a.stdout, map[string]any{"action": action, "dry_run": true, "count": len(affected), "dead_letters": toJSON(shown)}); err != nil {
				return err
			}
			return sf.nothingMatched(action, len(affected))
		}
		if len(affected) == 0 {
			if err := sf.nothingMatched(action, 0); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "dry run: %s would change no dead letter\n", action)
			return nil
		}
		fmt.Fprintf(a.stdout, "dry run: %s would change %d dead letter(s); nothing was changed\n", action, len(affected))
		return a.printDeadLetters(shown, len(affected))
	}
	var n int64
	if action == "retry" {
		n, err = dl.Retry(ctx, sel)
	} else {
		n, err = dl.Skip(ctx, sel)
	}
	if err != nil {
		return err
	}
	if a.json {
		if err := writeJSON(a.stdout, map[string]any{"action": action, "dry_run": false, "count": n}); err != nil {
			return err
		}
		return sf.nothingMatched(action, int(n))
	}
	if err := sf.nothingMatched(action, int(n)); err != nil {
		return err
	}
	if action == "retry" {
		fmt.Fprintf(a.stdout, "retried %d dead letter(s): back to pending\n", n)
	} else {
		fmt.Fprintf(a.stdout, "skipped %d dead letter(s): their aggregates are released\n", n)
	}
	return nil
}

func (a *app) printDeadLetters(dls []relay.DeadLetter, total int) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMESSAGE ID\tAGGREGATE\tEVENT TYPE\tATTEMPTS\tHOLDS\tDEAD SINCE\tLAST ERROR")
	for _, d := range dls {
		held := "no"
		if d.Held {
			held = "yes"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.MessageID, d.AggregateType, d.AggregateID,
			d.EventType, d.Attempts, held, d.DeadAt.Format(time.RFC3339), truncate(oneLine(d.LastError), 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if total > len(dls) {
		fmt.Fprintf(a.stdout, "... and %d more (raise --limit)\n", total-len(dls))
	}
	return nil
}

// truncate shortens s to at most n runes.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
