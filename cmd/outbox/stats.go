package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sqloutbox/outbox/relay"
)

// writeJSON writes v as indented JSON and a newline, with <, > and &
// as they are (subjects such as "outbox.event.>").
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func (a *app) statsCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show the backlog: rows by status, oldest pending age, partitions and their owners",
		Long: `Show a snapshot of the outbox table: rows pending, sent and dead; the age of
the oldest pending row; and, per relay partition, its pending rows, their
oldest age, and the relay instance holding the partition's lease with its
epoch (fencing token) and time left. Ages come from the database clock.

It also shows the relay partition count stored in the table, the lease
table's size, and any disagreement between them or pending rows in
partitions no relay can own (those are never published: see
relay.Repartition); the command still exits 0 then.

The partition table lists only partitions with pending rows; --all lists
idle ones (leased, nothing pending) too. --json always lists every
partition that is leased or has pending rows.

With --json, prints one object: table, dialect, pending, sent, dead,
oldest_pending_seconds, partition_count, lease_partitions,
out_of_range_pending, partition_mismatch ("" if none) and partitions
[{partition, pending, oldest_pending_seconds, owner, epoch,
lease_left_seconds}].`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error { return a.stats(cmd, all) }),
	}
	cmd.Flags().BoolVar(&all, "all", false, "also list idle partitions (no pending rows)")
	return cmd
}

type partitionJSON struct {
	Partition     int     `json:"partition"`
	Pending       int64   `json:"pending"`
	OldestPending float64 `json:"oldest_pending_seconds"`
	Owner         string  `json:"owner"`
	Epoch         int64   `json:"epoch"`
	LeaseLeft     float64 `json:"lease_left_seconds"`
}

type statsJSON struct {
	Table         string          `json:"table"`
	Dialect       string          `json:"dialect"`
	Pending       int64           `json:"pending"`
	Sent          int64           `json:"sent"`
	Dead          int64           `json:"dead"`
	OldestPending float64         `json:"oldest_pending_seconds"`
	Count         int             `json:"partition_count"`
	LeaseRows     int             `json:"lease_partitions"`
	OutOfRange    int64           `json:"out_of_range_pending"`
	Mismatch      string          `json:"partition_mismatch"`
	Partitions    []partitionJSON `json:"partitions"`
}

func (a *app) stats(cmd *cobra.Command, all bool) error {
	ctx, cancel := a.commandContext(cmd)
	defer cancel()
	t, db, err := a.open(ctx, true)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := checkSchema(ctx, db, t, a.table, false); err != nil {
		return err
	}
	ob, err := a.outbox(t, 0)
	if err != nil {
		return err
	}
	st, err := relay.ReadStats(ctx, ob, db)
	if err != nil {
		return err
	}
	mismatch := ""
	if err := st.Mismatch(); err != nil {
		mismatch = oneLine(err.Error())
	}
	if a.json {
		out := statsJSON{Table: a.table, Dialect: string(t.dialect), Pending: st.Pending, Sent: st.Sent, Dead: st.Dead,
			OldestPending: st.OldestPending.Seconds(), Count: st.PartitionCount, LeaseRows: st.LeaseRows,
			OutOfRange: st.OutOfRange, Mismatch: mismatch, Partitions: []partitionJSON{}}
		for _, p := range st.Partitions {
			out.Partitions = append(out.Partitions, partitionJSON{Partition: p.Partition, Pending: p.Pending,
				OldestPending: p.OldestPending.Seconds(), Owner: p.Owner, Epoch: p.Epoch, LeaseLeft: p.LeaseLeft.Seconds()})
		}
		return writeJSON(a.stdout, out)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "table:\t%s (%s)\n", a.table, t.dialect)
	fmt.Fprintf(tw, "pending:\t%d\n", st.Pending)
	fmt.Fprintf(tw, "sent:\t%d\n", st.Sent)
	fmt.Fprintf(tw, "dead:\t%d\n", st.Dead)
	fmt.Fprintf(tw, "oldest pending:\t%s\n", age(st.OldestPending))
	fmt.Fprintf(tw, "partitions:\t%d stored, %d lease rows\n", st.PartitionCount, st.LeaseRows)
	if mismatch != "" {
		fmt.Fprintf(tw, "PARTITION MISMATCH:\t%s\n", mismatch)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.Partitions) == 0 {
		fmt.Fprintln(a.stdout, "\nno partition is leased or has pending rows")
		return nil
	}
	shown := st.Partitions
	if !all {
		shown = shown[:0:0]
		for _, p := range st.Partitions {
			if p.Pending > 0 {
				shown = append(shown, p)
			}
		}
	}
	idle := len(st.Partitions) - len(shown)
	if len(shown) == 0 {
		fmt.Fprintf(a.stdout, "\nno partition has pending rows (%d idle; --all lists them)\n", idle)
		return nil
	}
	fmt.Fprintln(a.stdout)
	tw = tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tPENDING\tOLDEST PENDING\tOWNER\tEPOCH\tLEASE LEFT")
	defer func() {
		if idle > 0 {
			fmt.Fprintf(a.stdout, "(%d idle partitions not shown; --all lists them)\n", idle)
		}
	}()
	for _, p := range shown {
		owner, left := p.Owner, "-"
		if owner == "" {
			owner = "-"
		} else {
			left = age(p.LeaseLeft)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\n", p.Partition, p.Pending, age(p.OldestPending), owner, p.Epoch, left)
	}
	return tw.Flush()
}

// age formats a duration for humans: "-" for none, else rounded.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return "<1ms"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
