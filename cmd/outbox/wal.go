package main

import (
	"context"
	"database/sql"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/relay"
)

// walCmd is `outbox wal`: the WAL source's replication slot (relay
// --source wal).
func (a *app) walCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "wal",
		Short: "Create, show or drop the replication slot of the relay's WAL source (--source wal, PostgreSQL)",
		Long: `The relay's WAL source (outbox relay --source wal) reads the table's
inserts from a logical replication slot and creates the slot and its
publication at its first start ('outbox wal create' makes them ahead, as a
role that owns the table). A slot keeps the server's WAL until a reader
confirms it: one that no relay reads any more fills the disk, unless
max_slot_wal_keep_size invalidates it first. See docs/wal.md.`,
		Args:                  cobra.NoArgs,
		RunE:                  groupRunE,
		DisableFlagsInUseLine: true,
	}
	var slot, pub string
	var asJSON bool
	flags := func(fs *pflag.FlagSet) {
		fs.StringVar(&slot, "wal-slot", "", "the replication slot's name (default outbox_<database>_<table>, as the relay's)")
		envFlag(fs, "wal-slot", "OUTBOX_WAL_SLOT")
		fs.StringVar(&pub, "wal-publication", "", "the publication's name (default <table>_outbox_pub, as the relay's)")
		envFlag(fs, "wal-publication", "OUTBOX_WAL_PUBLICATION")
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the slot: whether it exists, who reads it, how much WAL it keeps",
		Long: `Show the WAL source's slot and publication: whether they exist, whether a
reader holds the slot and which relay ("outbox-relay <instance>"), its
wal_status (lost: invalidated by the server; the relay recreates it and
claims from the table meanwhile), and the WAL it keeps (retained_bytes, from
its restart position) and has not confirmed (unconfirmed_bytes). With
--json, prints one object with those fields.`,
		Example: `  outbox wal status --dsn postgres://relay@db/app
  outbox wal status --json --wal-slot billing_outbox`,
		Args: cobra.NoArgs,
		RunE: a.walRun(&slot, &pub, func(ctx context.Context, cmd *cobra.Command, ob *driver.Outbox, db *sql.DB, cfg relay.WALConfig) error {
			st, err := relay.ReadWALStatus(ctx, ob, db, cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), map[string]any{
					"slot": st.Slot, "publication": st.Publication, "slot_exists": st.SlotExists,
					"publication_exists": st.PublicationExists, "active": st.Active, "reader": st.Reader,
					"wal_status": st.WALStatus, "retained_bytes": st.RetainedBytes, "unconfirmed_bytes": st.UnconfirmedBytes,
					"loss": lossJSON(st.Loss),
				})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "slot\t%s\t%s\n", st.Slot, map[bool]string{true: "exists", false: "missing (a relay with --source wal creates it)"}[st.SlotExists])
			fmt.Fprintf(w, "publication\t%s\t%s\n", st.Publication, map[bool]string{true: "exists", false: "missing (a relay with --source wal creates it)"}[st.PublicationExists])
			if st.SlotExists {
				reader := "none (no relay reads it: it keeps WAL)"
				if st.Active {
					reader = st.Reader
					if reader == "" {
						reader = "a reader this role cannot see"
					}
				}
				fmt.Fprintf(w, "reader\t%s\n", reader)
				fmt.Fprintf(w, "wal_status\t%s\n", st.WALStatus)
				fmt.Fprintf(w, "retained\t%d bytes\n", st.RetainedBytes)
				fmt.Fprintf(w, "unconfirmed\t%d bytes\n", st.UnconfirmedBytes)
			}
			if st.Loss != nil {
				fmt.Fprintf(w, "LOSS\tevents committed between %s and %s may be lost (slot %s, %s); acknowledge with 'outbox wal ack-loss'\n",
					st.Loss.From, st.Loss.To, st.Loss.Reason, st.Loss.At.UTC().Format(time.RFC3339))
			}
			return w.Flush()
		}),
	}
	flags(status.Flags())
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	drop := &cobra.Command{
		Use:   "drop",
		Short: "Drop the slot and its publication (stop the relays first)",
		Long: `Drop the WAL source's replication slot and publication, for a relay retired
for good or switched back to --source table: the server then frees the WAL
the slot kept. It fails while a relay reads the slot. Nothing is lost: the
table holds every event, and a relay started again with --source wal
creates a new slot and claims what it finds pending first.`,
		Example: `  outbox wal drop --dsn postgres://relay@db/app`,
		Args:    cobra.NoArgs,
		RunE: a.walRun(&slot, &pub, func(ctx context.Context, cmd *cobra.Command, ob *driver.Outbox, db *sql.DB, cfg relay.WALConfig) error {
			st, err := relay.ReadWALStatus(ctx, ob, db, cfg)
			if err != nil {
				return err
			}
			if err := relay.DropWAL(ctx, ob, db, cfg); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dropped slot %s (%s) and publication %s (%s)\n",
				st.Slot, map[bool]string{true: "existed", false: "did not exist"}[st.SlotExists],
				st.Publication, map[bool]string{true: "existed", false: "did not exist"}[st.PublicationExists])
			return nil
		}),
	}
	flags(drop.Flags())
	create := &cobra.Command{
		Use:   "create",
		Short: "Create the slot and its publication ahead of the relays",
		Long: `Create the WAL source's publication (the table's inserts) and its logical
replication slot (pgoutput), each if missing, and show them. A relay with
--source wal creates both at its first start; run this as a role that owns
the table (CREATE PUBLICATION needs it) and has REPLICATION, so that the
relays' own role needs only REPLICATION and the table's privileges. The slot
keeps WAL from now on: start a relay on it, or drop it with 'outbox wal
drop'. It fails, naming the server's error, if wal_level is not logical
(set it and restart the server), the role lacks a privilege, a slot of that
name is not a pgoutput slot of this database, or a publication of that name
does not publish the table's inserts. A slot it creates is read once, and
created again if the server's decoder cannot read it (PostgreSQL 15 can
create such a slot while other sessions drop tables); that prints a LOSS
line, since log-only writers could have emitted into the first slot.`,
		Example: `  outbox wal create --dsn postgres://owner@db/app
  outbox wal create --wal-slot billing_outbox --wal-publication billing_outbox_pub`,
		Args: cobra.NoArgs,
		RunE: a.walRun(&slot, &pub, func(ctx context.Context, cmd *cobra.Command, ob *driver.Outbox, db *sql.DB, cfg relay.WALConfig) error {
			before, err := relay.ReadWALStatus(ctx, ob, db, cfg)
			if err != nil {
				return err
			}
			after, err := relay.CreateWAL(ctx, ob, db, cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "publication %s %s; slot %s %s\n",
				before.Publication, map[bool]string{true: "existed", false: "created"}[before.PublicationExists],
				before.Slot, map[bool]string{true: "existed", false: "created"}[before.SlotExists])
			if after.Loss != nil {
				hint := "acknowledge with 'outbox wal ack-loss' once its events are accounted for"
				if after.Loss.Reason == relay.WALLossUnreadableAtCreation {
					hint = "the server could not read the slot first created, so it was created again; if no log-only writer ran since this command started, nothing was lost: acknowledge with 'outbox wal ack-loss'"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "LOSS: events committed between %s and %s may be lost (%s): %s\n", after.Loss.From, after.Loss.To, after.Loss.Reason, hint)
			}
			return nil
		}),
	}
	flags(create.Flags())
	ack := &cobra.Command{
		Use:   "ack-loss",
		Short: "Acknowledge a loss window of the log-only mode, so that relays are ready again",
		Long: `In the log-only mode (driver.Config.LogOnly, relay --log-only) an event is
only in the WAL until the relay publishes it, so a slot dropped or
invalidated (max_slot_wal_keep_size) while it held events loses them. The
relay then records the window (from the last position it confirmed to the
new slot's start), logs it at ERROR, and every relay of the table reports
itself not ready until an operator, having accounted for the events
committed in that window, acknowledges it here. 'outbox wal status' shows
the window. Prints the window acknowledged, or that there was none.`,
		Example: `  outbox wal ack-loss --dsn postgres://relay@db/app`,
		Args:    cobra.NoArgs,
		RunE: a.walRun(&slot, &pub, func(ctx context.Context, cmd *cobra.Command, ob *driver.Outbox, db *sql.DB, cfg relay.WALConfig) error {
			loss, err := relay.AckWALLoss(ctx, ob, db, cfg)
			if err != nil {
				return err
			}
			if loss == nil {
				fmt.Fprintln(cmd.OutOrStdout(), "no loss window recorded")
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "acknowledged: slot %s, events committed between %s and %s (%s, %s)\n",
				loss.Slot, loss.From, loss.To, loss.Reason, loss.At.UTC().Format(time.RFC3339))
			return nil
		}),
	}
	flags(ack.Flags())
	cmd.AddCommand(status, drop, create, ack)
	return cmd
}

// walRun is the RunE of an `outbox wal` command: fn gets the table's
// Outbox (PostgreSQL only), a pool on --dsn (closed after it) and the
// slot and publication the flags name.
func (a *app) walRun(slot, pub *string, fn func(ctx context.Context, cmd *cobra.Command, ob *driver.Outbox, db *sql.DB, cfg relay.WALConfig) error) func(*cobra.Command, []string) error {
	return a.wrap(func(cmd *cobra.Command, _ []string) error {
		ctx, cancel := a.commandContext(cmd)
		defer cancel()
		ob, err := a.walOutbox()
		if err != nil {
			return err
		}
		_, db, err := a.open(ctx, true)
		if err != nil {
			return err
		}
		defer db.Close()
		return fn(ctx, cmd, ob, db, relay.WALConfig{Slot: *slot, Publication: *pub})
	})
}

// walOutbox is the table's Outbox for `outbox wal`: PostgreSQL only,
// refused before connecting.
func (a *app) walOutbox() (*driver.Outbox, error) {
	t, err := parseDSN(a.dsn)
	if err != nil {
		return nil, err
	}
	if t.dialect != driver.Postgres {
		return nil, usageErrorf("the WAL source needs PostgreSQL; %s relays claim from the table", t.dialect)
	}
	return driver.New(driver.Config{Dialect: t.dialect, Table: a.table})
}

// lossJSON is a loss window for --json (null for none).
func lossJSON(l *relay.WALLoss) any {
	if l == nil {
		return nil
	}
	return map[string]any{"slot": l.Slot, "from_lsn": l.From, "to_lsn": l.To, "at": l.At.UTC().Format(time.RFC3339), "reason": l.Reason}
}
