package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// publishLog collects what relays did, for a failing ledger to explain:
// the relays' own log lines (all levels) and one entry per Publish call
// (its outbox ids in order and each one's outcome). It is safe for
// concurrent use.
type publishLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (d *publishLog) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.buf.Write(p)
}

func (d *publishLog) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.buf.String()
}

// note writes a line of the test's own.
func (d *publishLog) note(format string, args ...any) {
	fmt.Fprintf(d, "%s %s\n", time.Now().Format("15:04:05.000000"), fmt.Sprintf(format, args...))
}

// logger is a relay Logger writing to d.
func (d *publishLog) logger(name string) *slog.Logger {
	return slog.New(slog.NewTextHandler(d, &slog.HandlerOptions{Level: slog.LevelDebug})).With("relay", name)
}

// observer is a relay Observer (a PublishObserver) writing to d.
func (d *publishLog) observer(name string) relay.Observer {
	return &publishLogObserver{name: name, d: d}
}

type publishLogObserver struct {
	relay.NopObserver
	name string
	d    *publishLog
}

func (o *publishLogObserver) StartPublish(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	start := time.Now()
	return ctx, func(err error) {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s publish of %d messages took %v", start.Format("15:04:05.000000"), o.name, len(msgs), time.Since(start))
		var pe relay.PublishErrors
		if err != nil && (!errors.As(err, &pe) || len(pe) != len(msgs)) {
			fmt.Fprintf(&b, ", failed as a whole: %v", err)
			pe = nil
		}
		b.WriteString(":")
		for i, m := range msgs {
			fmt.Fprintf(&b, " %d/%s", m.ID, m.AggregateID)
			if pe != nil && pe[i] != nil {
				fmt.Fprintf(&b, "(%v)", pe[i])
			}
		}
		b.WriteString("\n")
		_, _ = o.d.Write([]byte(b.String()))
	}
}
