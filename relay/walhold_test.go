package relay

import (
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestWALReaderHoldsTheSlotBehindLogEvents: the reader confirms nothing
// past events of logical decoding messages the loop took until the loop
// settles them (published or written to the table); putBack and rewind
// give them up without confirming; a stream of an earlier generation
// (running on after a rewind) can neither buffer rows nor move the
// position.
func TestWALReaderHoldsTheSlotBehindLogEvents(t *testing.T) {
	t.Parallel()
	newReader := func() *walReader {
		w := newWALReader(WALConfig{Buffer: 100}, "t", `"t"`, "i", slog.New(slog.NewTextHandler(io.Discard, nil)))
		w.logPrefix = "outbox:t"
		w.streaming = true
		return w
	}
	row := func(id int64, log bool) walRow { return walRow{msg: Message{ID: id}, log: log} }
	confirmed := func(w *walReader) pglogrepl.LSN {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.confirmed
	}

	t.Run("rows only: confirmed as taken", func(t *testing.T) {
		t.Parallel()
		w := newReader()
		w.push([]walRow{row(1, false)}, 100, 0)
		w.take(10)
		if got := confirmed(w); got != 100 {
			t.Fatalf("confirmed %v, want 100", got)
		}
	})
	t.Run("log events: held until settle", func(t *testing.T) {
		t.Parallel()
		w := newReader()
		w.push([]walRow{row(1, false)}, 100, 0)
		w.take(10)
		w.push([]walRow{row(0, true), row(0, true)}, 200, 0)
		w.push([]walRow{row(2, false)}, 300, 0)
		rows, _, _ := w.take(2)
		if len(rows) != 2 || confirmed(w) != 100 {
			t.Fatalf("took %d rows, confirmed %v; want 2 and 100 (held)", len(rows), confirmed(w))
		}
		w.push(nil, 400, 0) // an empty transaction with the buffer not empty
		w.take(10)
		if got := confirmed(w); got != 100 {
			t.Fatalf("confirmed %v while held, want 100", got)
		}
		w.settle()
		if got := confirmed(w); got != 400 {
			t.Fatalf("confirmed %v after settle, want 400 (everything taken)", got)
		}
	})
	t.Run("putBack: not confirmed, taken again", func(t *testing.T) {
		t.Parallel()
		w := newReader()
		w.push([]walRow{row(0, true)}, 200, 0)
		rows, _, _ := w.take(10)
		w.putBack(rows)
		w.settle() // the cycle's end: nothing is held any more
		if got := confirmed(w); got != 0 {
			t.Fatalf("confirmed %v after putBack, want 0", got)
		}
		if again, _, _ := w.take(10); len(again) != 1 {
			t.Fatalf("took %d rows again, want 1", len(again))
		}
	})
	t.Run("rewind: not confirmed, buffer emptied, old stream ignored", func(t *testing.T) {
		t.Parallel()
		w := newReader()
		w.push([]walRow{row(0, true)}, 200, 0)
		w.push([]walRow{row(0, true)}, 300, 0)
		w.take(1)
		w.rewind()
		if got := confirmed(w); got != 0 {
			t.Fatalf("confirmed %v after rewind, want 0", got)
		}
		w.push([]walRow{row(0, true)}, 400, 0) // the rewound stream, still running
		w.push(nil, 500, 0)
		if rows, gap, _ := w.take(10); len(rows) != 0 || !gap {
			t.Fatalf("took %d rows (gap %v) after rewind, want none and a gap", len(rows), gap)
		}
		if got := confirmed(w); got != 0 {
			t.Fatalf("confirmed %v from a rewound stream, want 0", got)
		}
		w.push([]walRow{row(0, true)}, 250, 1) // the next stream re-reads
		if rows, _, _ := w.take(10); len(rows) != 1 {
			t.Fatalf("took %d rows from the new stream, want 1", len(rows))
		}
	})
}
