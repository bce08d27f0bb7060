package driver_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestSetLimits: limits set after the Outbox was built (once a broker
// says what it accepts) apply to transactions begun afterwards; an open
// transaction keeps its own; invalid limits are refused and change
// nothing.
func TestSetLimits(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[0], driver.Config{}) // two transactions open at once: not SQLite's one connection
	ob, db := e.OpenWriter(t, driver.Config{})
	if got := ob.Limits(); got != (emit.Limits{}).WithDefaults() {
		t.Fatalf("Limits before SetLimits: %+v, want the defaults", got)
	}
	big := outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`"` + strings.Repeat("x", 4000) + `"`)}
	emitIn := func(ctx context.Context) error { return outbox.Emit(ctx, big) }

	// A transaction open before SetLimits keeps the defaults.
	octx := outbox.NewContext(t.Context())
	open, err := db.BeginTx(octx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback()

	l := ob.Limits()
	l.MaxRecordBytes = 1024
	if err := ob.SetLimits(l); err != nil {
		t.Fatal(err)
	}
	if got := ob.Limits().MaxRecordBytes; got != 1024 {
		t.Errorf("Limits().MaxRecordBytes = %d, want 1024", got)
	}
	if got := ob.Config().Limits.MaxRecordBytes; got != 1024 {
		t.Errorf("Config().Limits.MaxRecordBytes = %d, want 1024", got)
	}
	if err := emitIn(octx); err != nil {
		t.Errorf("Emit in the transaction begun before SetLimits: %v, want nil (it keeps its limits)", err)
	}
	ctx := outbox.NewContext(t.Context())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := emitIn(ctx); !errors.Is(err, outbox.ErrRecordTooLarge) {
		t.Errorf("Emit after SetLimits(MaxRecordBytes 1024): %v, want ErrRecordTooLarge", err)
	}

	for _, bad := range []emit.Limits{{MaxRecordBytes: -1}, {MaxRecordBytes: 2 << 20, MaxBytes: 1 << 20}} {
		if err := ob.SetLimits(bad); !errors.Is(err, driver.ErrInvalidConfig) || !errors.Is(err, emit.ErrInvalidField) {
			t.Errorf("SetLimits(%+v): %v, want ErrInvalidConfig and emit.ErrInvalidField", bad, err)
		}
	}
	if got := ob.Limits().MaxRecordBytes; got != 1024 {
		t.Errorf("after refused SetLimits: MaxRecordBytes %d, want 1024 kept", got)
	}
}
