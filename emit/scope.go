package emit

import (
	"context"
	"fmt"
	"sync"
)

// Default limits. DefaultMaxRecordBytes is the Kafka broker's default
// message.max.bytes (1,048,588 bytes, Kafka's KafkaConfig MessageMaxBytes
// default): a record batch holding one record of at most this RecordSize is
// never refused for its size by a broker on defaults, nor by sarama's
// Producer.MaxMessageBytes default of 1 MiB.
const (
	DefaultMaxRecordBytes = 1048588
	DefaultMaxEvents      = 10000
	DefaultMaxBytes       = 32 << 20
)

// Limits bound what one transaction may emit. A zero field takes its default.
type Limits struct {
	// MaxRecordBytes caps RecordSize of one event. Default
	// DefaultMaxRecordBytes; set it to your broker's or topic's
	// message.max.bytes (the Kafka publisher's MaxRecordBytes reports the
	// producer side).
	MaxRecordBytes int
	// MaxEvents caps the events buffered by one transaction. Default
	// DefaultMaxEvents (10,000).
	MaxEvents int
	// MaxBytes caps the sum of RecordSize over one transaction's events.
	// Default DefaultMaxBytes (32 MiB).
	MaxBytes int
}

// WithDefaults returns l with zero fields replaced by their defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxRecordBytes == 0 {
		l.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if l.MaxEvents == 0 {
		l.MaxEvents = DefaultMaxEvents
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	return l
}

// Validate reports a negative limit, or a MaxBytes below MaxRecordBytes
// (which would make the largest record unemittable), as an error wrapping
// ErrInvalidField.
func (l Limits) Validate() error {
	l = l.WithDefaults()
	if l.MaxRecordBytes < 0 || l.MaxEvents < 0 || l.MaxBytes < 0 {
		return fmt.Errorf("outbox: limits: %w: negative limit %+v", ErrInvalidField, l)
	}
	if l.MaxBytes < l.MaxRecordBytes {
		return fmt.Errorf("outbox: limits: %w: MaxBytes %d below MaxRecordBytes %d", ErrInvalidField, l.MaxBytes, l.MaxRecordBytes)
	}
	return nil
}

// Scope ties Emit calls to the transaction begun with the same context.
// Create one per unit of work with NewContext; it is safe for concurrent use.
type Scope struct {
	mu    sync.Mutex
	open  []*Batch
	begun int // batches ever bound, for ErrNoTransaction's message
}

type scopeKey struct{}

// NewContext returns a copy of ctx carrying a new, empty emit scope. A
// transaction begun (BeginTx) on an outbox-wrapped database with this
// context, or one derived from it, becomes the scope's open transaction,
// and Emit with such a context buffers into it. A scope may serve any number
// of transactions one after another.
func NewContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, scopeKey{}, &Scope{})
}

// FromContext returns the scope NewContext installed in ctx, or nil.
func FromContext(ctx context.Context) *Scope {
	s, _ := ctx.Value(scopeKey{}).(*Scope)
	return s
}

// Batch holds the events one transaction has emitted so far. The driver
// creates it at BeginTx (Scope.Begin) and ends it at Commit (Take) or
// Rollback (Discard).
type Batch struct {
	scope   *Scope
	limits  Limits
	capture Capture // nil: none (the default)
	events  []Event
	ids     map[string]struct{} // built lazily, once a caller supplies an ID
	bytes   int
}

// Begin binds a new batch with the given limits (defaults applied) to s as
// an open transaction. It is BeginWith(limits, nil).
func (s *Scope) Begin(limits Limits) *Batch { return s.BeginWith(limits, nil) }

// BeginWith binds a new batch with the given limits (defaults applied) and
// capture hook to s as an open transaction. Every Emit into the batch calls
// capture (if not nil) before validating the event; see Capture.
func (s *Scope) BeginWith(limits Limits, capture Capture) *Batch {
	b := &Batch{scope: s, limits: limits.WithDefaults(), capture: capture}
	s.mu.Lock()
	s.open = append(s.open, b)
	s.begun++
	s.mu.Unlock()
	return b
}

// Mark is a position in a batch's events, taken at a savepoint: RollbackTo
// returns the batch to it.
type Mark struct {
	events, bytes int
}

// Mark returns the batch's current position (the number of events and
// their bytes buffered so far).
func (b *Batch) Mark() Mark {
	b.scope.mu.Lock()
	defer b.scope.mu.Unlock()
	return Mark{events: len(b.events), bytes: b.bytes}
}

// RollbackTo drops the events buffered since m was taken and frees their
// IDs and bytes, as ROLLBACK TO SAVEPOINT drops the rows written since the
// savepoint. A mark past the buffered events (taken before an earlier
// RollbackTo to an older mark) drops nothing.
func (b *Batch) RollbackTo(m Mark) {
	b.scope.mu.Lock()
	defer b.scope.mu.Unlock()
	if m.events >= len(b.events) {
		return
	}
	for i := m.events; i < len(b.events); i++ {
		if b.ids != nil {
			delete(b.ids, b.events[i].ID)
		}
		b.events[i] = Event{} // let the payloads go
	}
	b.events = b.events[:m.events]
	b.bytes = m.bytes
}

func (s *Scope) unbind(b *Batch) {
	for i, o := range s.open {
		if o == b {
			s.open = append(s.open[:i], s.open[i+1:]...)
			return
		}
	}
}

// Take unbinds b from its scope and returns the buffered events in Emit
// order. Emit calls after Take return ErrNoTransaction.
func (b *Batch) Take() []Event {
	b.scope.mu.Lock()
	defer b.scope.mu.Unlock()
	b.scope.unbind(b)
	ev := b.events
	b.events = nil
	return ev
}

// Discard unbinds b and drops its events (the transaction rolled back).
func (b *Batch) Discard() { b.Take() }

// Len returns the number of events buffered so far.
func (b *Batch) Len() int {
	b.scope.mu.Lock()
	defer b.scope.mu.Unlock()
	return len(b.events)
}

// Capture is a hook that adds headers to every event Emit buffers, for
// example the trace context of Emit's ctx (package
// github.com/sqloutbox/outbox/otel provides one for OpenTelemetry). It is
// off unless configured (driver.Config.Capture); a nil Capture costs Emit
// one nil check.
//
// Emit calls it with its own ctx and the event's headers as the
// application gave them (nil if none; read-only: the hook must not modify
// or keep the map), before validating the event. It returns the headers to
// add, or nil for none; Emit copies them and does not keep the returned
// map. One rule decides conflicts: the application's header wins.
// A returned name the event already has (compared byte for byte, as Kafka
// compares header names) is dropped, never overwriting the application's
// value.
//
// Captured headers are validated and counted like the application's: a
// name starting with ReservedHeaderPrefix, a name or value the brokers
// cannot carry (see Event.Headers) makes Emit return a *ValidationError (ErrReservedHeader,
// ErrInvalidHeader), and their bytes count toward RecordSize, so an event
// that the captured headers push past Limits.MaxRecordBytes is refused
// with ErrRecordTooLarge at Emit, never written. A Capture has no error
// to return: a hook that cannot capture returns nil. It is called from
// the goroutines that call Emit, concurrently: it must be safe for
// concurrent use, quick, and must not block.
type Capture func(ctx context.Context, headers map[string]string) map[string]string

// mergeHeaders returns a new map holding app and the entries of add whose
// names app does not have (the application's header wins).
func mergeHeaders(app, add map[string]string) map[string]string {
	h := make(map[string]string, len(app)+len(add))
	for k, v := range add {
		h[k] = v
	}
	for k, v := range app {
		h[k] = v
	}
	return h
}

// Emit validates ev and buffers it in the transaction open in ctx's scope;
// the outbox driver writes it in that transaction just before COMMIT. Emit
// copies Payload and Headers. It returns ErrNoTransaction,
// ErrConcurrentTransactions, a *ValidationError (matching ErrInvalidEvent),
// ErrTooManyEvents or ErrTransactionTooLarge; after any error the
// transaction is unchanged and usable. Emit is safe for concurrent use.
func Emit(ctx context.Context, ev Event) error {
	s := FromContext(ctx)
	if s == nil {
		return fmt.Errorf("%w (no scope in context: wrap it with outbox.NewContext)", ErrNoTransaction)
	}
	b, err := s.current()
	if err != nil {
		return err
	}
	if b == nil {
		return s.noTransaction()
	}
	// Validate outside the lock: a 1 MiB JSON check takes milliseconds and
	// must not queue other goroutines emitting into the same scope.
	supplied := ev.ID != ""
	owned := false
	if b.capture != nil {
		if add := b.capture(ctx, ev.Headers); len(add) > 0 {
			ev.Headers = mergeHeaders(ev.Headers, add)
			owned = true
		}
	}
	size, err := prepareOwned(&ev, b.limits, owned)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.open) != 1 || s.open[0] != b {
		// The transaction ended, or another began, while validating.
		if len(s.open) > 1 {
			return fmt.Errorf("%w (%d open)", ErrConcurrentTransactions, len(s.open))
		}
		return s.noTransactionLocked()
	}
	return b.add(ev, size, supplied)
}

// noTransaction returns ErrNoTransaction with the likely cause and fix.
func (s *Scope) noTransaction() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.noTransactionLocked()
}

func (s *Scope) noTransactionLocked() error {
	if s.begun == 0 {
		return fmt.Errorf("%w: no transaction has been begun with this scope on an outbox-wrapped database. Likely causes: "+
			"(1) the transaction was begun without the scope's context: write db.BeginTx(ctx, nil) with the ctx from outbox.NewContext "+
			"(or one derived from it), not db.Begin() or db.BeginTx(context.Background(), nil); "+
			"(2) the *sql.DB was not opened through the outbox driver: open it with sql.Open(name, dsn) using the name given to driver.Register, "+
			"or sql.OpenDB(ob.WrapConnector(connector)). Read-only transactions are never bound", ErrNoTransaction)
	}
	return fmt.Errorf("%w: the scope's last transaction has already committed or rolled back "+
		"(call Emit before tx.Commit, and begin the next transaction with the scope's context)", ErrNoTransaction)
}

// current returns the scope's single open batch, or nil if none is open.
func (s *Scope) current() (*Batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch len(s.open) {
	case 0:
		return nil, nil
	case 1:
		return s.open[0], nil
	default:
		return nil, fmt.Errorf("%w (%d open)", ErrConcurrentTransactions, len(s.open))
	}
}

// add appends a prepared ev of the given record size; s.mu is held.
// supplied says whether the caller set ev.ID.
func (b *Batch) add(ev Event, size int, supplied bool) error {
	if len(b.events)+1 > b.limits.MaxEvents {
		return fmt.Errorf("%w: limit %d (Limits.MaxEvents)", ErrTooManyEvents, b.limits.MaxEvents)
	}
	if b.bytes+size > b.limits.MaxBytes {
		return fmt.Errorf("%w: %d + %d bytes exceeds %d (Limits.MaxBytes)", ErrTransactionTooLarge, b.bytes, size, b.limits.MaxBytes)
	}
	if supplied && b.ids == nil && len(b.events) > 0 {
		b.ids = make(map[string]struct{}, len(b.events)+1)
		for i := range b.events {
			b.ids[b.events[i].ID] = struct{}{}
		}
	}
	if b.ids != nil || supplied {
		if _, dup := b.ids[ev.ID]; dup {
			return invalid("ID", ErrDuplicateID, "%q", ev.ID)
		}
		if b.ids == nil {
			b.ids = make(map[string]struct{})
		}
		b.ids[ev.ID] = struct{}{}
	}
	b.events = append(b.events, ev)
	b.bytes += size
	return nil
}
