package natspub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/relay"
)

// Stream defaults (StreamConfig).
const (
	// DefaultStreamName is the stream `outbox nats stream create` makes
	// when no name is given.
	DefaultStreamName = "OUTBOX"
	// DefaultDuplicateWindow is JetStream's own default duplicate window
	// (2 minutes), which StreamConfig keeps unless told otherwise. See
	// StreamConfig.Duplicates for sizing it.
	DefaultDuplicateWindow = 2 * time.Minute
)

var (
	// ErrStreamMissing is returned by CheckStream, and wrapped (with
	// relay.ErrUnavailable) by Publisher.Healthy, when the stream the
	// relay publishes into does not exist. The error text names the
	// command that creates it.
	ErrStreamMissing = errors.New("outbox/nats: stream missing")
	// ErrStreamMismatch is returned by CreateStream and CheckStream when
	// the stream exists with other settings than asked; the text names
	// each setting that differs, with both values. Neither function
	// changes an existing stream.
	ErrStreamMismatch = errors.New("outbox/nats: stream settings differ")
)

// StreamConfig is the JetStream stream the relay's messages are stored in:
// what CreateStream makes and CheckStream verifies. Settings it does not
// name (retention, limits, placement) are left to the stream's creator
// and not compared.
type StreamConfig struct {
	// Name of the stream. Default DefaultStreamName.
	Name string
	// SubjectPrefix is the prefix of every subject the relay publishes
	// to; the stream binds SubjectPrefix + ">". It must end with '.'.
	// Default DefaultSubjectPrefix ("outbox.event."), the prefix of
	// DefaultSubject.
	SubjectPrefix string
	// Storage is jetstream.FileStorage (the default: messages survive a
	// server restart) or jetstream.MemoryStorage. A PubAck means stored
	// as the stream stores (package doc, "What acknowledged means").
	Storage jetstream.StorageType
	// Replicas is the number of servers that store each message (1 to 5;
	// a PubAck then waits for a quorum). Default 1.
	Replicas int
	// Duplicates is the stream's duplicate window: a message whose
	// Nats-Msg-Id (the outbox message ID) the stream stored within this
	// window is dropped and acknowledged as a duplicate. The relay's
	// promise that a re-sent batch is not stored twice rests on it, so
	// size it to cover the longest time between a publish and its
	// re-send: a batch that timed out is re-sent after the relay's
	// backoff (at most 30 s) plus PublishTimeout (10 s); a crashed
	// relay's batch by the next owner of its partitions after LeaseTTL
	// (10 s) plus that owner's claim. JetStream's default of 2 minutes
	// covers the defaults with room; add your LeaseTTL and PublishTimeout
	// if you raised them, and remember that a re-send after a database
	// outage longer than the window is stored again (consumers that dedupe
	// by the outbox-message-id header, as the inbox does, still apply it
	// once). The server keeps the IDs of the window in memory. Default
	// DefaultDuplicateWindow.
	Duplicates time.Duration
}

func (c StreamConfig) withDefaults() (StreamConfig, error) {
	if c.Name == "" {
		c.Name = DefaultStreamName
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Duplicates == 0 {
		c.Duplicates = DefaultDuplicateWindow
	}
	switch {
	case strings.ContainsAny(c.Name, " \t.*>"):
		return c, fmt.Errorf("%w: stream name %q may not contain spaces, '.', '*' or '>'", ErrConfig, c.Name)
	case !strings.HasSuffix(c.SubjectPrefix, ".") || !validSubject(strings.TrimSuffix(c.SubjectPrefix, ".")):
		return c, fmt.Errorf("%w: subject prefix %q must be literal tokens ending with '.'", ErrConfig, c.SubjectPrefix)
	case c.Storage != jetstream.FileStorage && c.Storage != jetstream.MemoryStorage:
		return c, fmt.Errorf("%w: storage %v is neither file nor memory", ErrConfig, c.Storage)
	case c.Replicas < 1 || c.Replicas > 5:
		return c, fmt.Errorf("%w: replicas %d outside 1..5", ErrConfig, c.Replicas)
	case c.Duplicates < 0:
		return c, fmt.Errorf("%w: duplicate window %s is negative", ErrConfig, c.Duplicates)
	}
	return c, nil
}

// Subjects returns the subjects the stream binds: SubjectPrefix + ">".
func (c StreamConfig) Subjects() []string {
	c, _ = c.withDefaults()
	return []string{c.SubjectPrefix + ">"}
}

// BrokerPlaceholder stands for the server's address in CreateCommand's
// command line (the library does not know the URL the connection was made
// with); the outbox command prints the address it was given instead.
const BrokerPlaceholder = "nats://<host>:4222"

// CreateCommand returns the `outbox` command line that creates this
// stream, as error texts quote it, with BrokerPlaceholder for the address.
func (c StreamConfig) CreateCommand() string {
	c, _ = c.withDefaults()
	cmd := "outbox nats stream create --broker " + BrokerPlaceholder
	if c.Name != DefaultStreamName {
		cmd += " --nats-stream " + c.Name
	}
	if c.SubjectPrefix != DefaultSubjectPrefix {
		cmd += " --subject-prefix " + c.SubjectPrefix
	}
	return cmd
}

// CreateStream makes the stream c describes, or finds it there with the
// same settings; it reports whether it created it. It never changes an
// existing stream: one with other settings gives ErrStreamMismatch naming
// them. Errors also wrap ErrConfig for an invalid c, and the server's
// (another stream already binding the subjects, no permission for the
// JetStream API, JetStream disabled) with what to do.
func CreateStream(ctx context.Context, nc *nats.Conn, c StreamConfig) (created bool, err error) {
	c, err = c.withDefaults()
	if err != nil {
		return false, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return false, fmt.Errorf("outbox/nats: %w", err)
	}
	s, err := js.Stream(ctx, c.Name)
	switch {
	case err == nil:
		return false, compare(c, s.CachedInfo().Config)
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return false, streamAPIError("looking up stream "+c.Name, nc, err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: c.Name, Subjects: c.Subjects(), Storage: c.Storage, Replicas: c.Replicas, Duplicates: c.Duplicates,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Created meanwhile by someone else: the same check as above.
		if s, err := js.Stream(ctx, c.Name); err == nil {
			return false, compare(c, s.CachedInfo().Config)
		}
	}
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeSubjectOverlap {
			return false, fmt.Errorf("outbox/nats: creating stream %s for %s: another stream already binds some of these subjects (list them: nats stream ls, or jetstream's StreamNames with a subject filter); bind the relay's subjects in one stream: %w",
				c.Name, c.Subjects()[0], err)
		}
		return false, streamAPIError("creating stream "+c.Name, nc, err)
	}
	return true, nil
}

// CheckStream verifies that the stream c describes exists with c's
// settings. It returns nil, an error wrapping ErrStreamMissing (with the
// command that creates it), ErrStreamMismatch (naming each setting that
// differs), ErrConfig, or the server's error.
func CheckStream(ctx context.Context, nc *nats.Conn, c StreamConfig) error {
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("outbox/nats: %w", err)
	}
	s, err := js.Stream(ctx, c.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: no stream %s: create it with `%s` (or natspub.CreateStream)", ErrStreamMissing, c.Name, c.CreateCommand())
	}
	if err != nil {
		return streamAPIError("looking up stream "+c.Name, nc, err)
	}
	return compare(c, s.CachedInfo().Config)
}

// errCodeSubjectOverlap is the server's JSStreamSubjectOverlapErr
// ("subjects overlap with an existing stream", nats-server
// server/errors.json), which nats.go does not name.
const errCodeSubjectOverlap jetstream.ErrorCode = 10065

// compare names every setting of got that differs from want.
func compare(want StreamConfig, got jetstream.StreamConfig) error {
	var diffs []string
	if !slices.Equal(sortedCopy(got.Subjects), want.Subjects()) {
		diffs = append(diffs, fmt.Sprintf("subjects %q, want %q", got.Subjects, want.Subjects()))
	}
	if got.Storage != want.Storage {
		diffs = append(diffs, fmt.Sprintf("storage %s, want %s", got.Storage, want.Storage))
	}
	if max(got.Replicas, 1) != want.Replicas {
		diffs = append(diffs, fmt.Sprintf("replicas %d, want %d", max(got.Replicas, 1), want.Replicas))
	}
	if got.Duplicates != want.Duplicates {
		diffs = append(diffs, fmt.Sprintf("duplicate window %s, want %s", got.Duplicates, want.Duplicates))
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: stream %s has %s (left unchanged: change it with the nats CLI or jetstream's UpdateStream if you mean to, or name another stream)",
		ErrStreamMismatch, want.Name, strings.Join(diffs, "; "))
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// streamAPIError explains a failed JetStream API call.
func streamAPIError(what string, nc *nats.Conn, err error) error {
	switch {
	case nc.Status() != nats.CONNECTED:
		return fmt.Errorf("outbox/nats: %s: the connection to the NATS server is %s (server down or unreachable?): %w", what, nc.Status(), err)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("outbox/nats: %s: JetStream is not enabled on the server or for this account (start nats-server with -js): %w", what, err)
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("outbox/nats: %s: nobody answers the JetStream API (JetStream disabled, or another API prefix or domain): %w", what, err)
	case errors.Is(err, nats.ErrPermissionViolation):
		return fmt.Errorf("outbox/nats: %s: %w: this user may not use the JetStream API ($JS.API.>)", what, relay.ErrUnavailable)
	}
	return fmt.Errorf("outbox/nats: %s: %w", what, err)
}
