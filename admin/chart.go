package admin

import (
	"fmt"
	"strings"
	"time"
)

// sample is one reading for the throughput chart: the highest id (every
// event written takes one), and the pending and dead counts.
type sample struct {
	At                   time.Time
	MaxID, Pending, Dead int64
}

// chartWindow is how far back the chart reaches.
const chartWindow = time.Hour

// addSample keeps readings at least a second apart over the last
// chartWindow (at most 3,600). Callers hold h.mu.
func (h *Handler) addSample(s sample) {
	if n := len(h.samples); n > 0 && s.At.Sub(h.samples[n-1].At) < time.Second {
		return
	}
	h.samples = append(h.samples, s)
	cut := 0
	for cut < len(h.samples) && s.At.Sub(h.samples[cut].At) > chartWindow {
		cut++
	}
	h.samples = h.samples[cut:]
}

// chart is the throughput chart as the template draws it (an inline SVG
// of two polylines; numbers only, computed here).
type chart struct {
	Written, Published string // SVG points
	Peak               float64
	LastWritten        float64
	LastPublished      float64
	Since              time.Duration
	Points             int
}

const chartW, chartH = 600.0, 120.0

// throughput turns the samples into rates between consecutive readings:
// events written per second (growth of the highest id) and published per
// second (written, less the growth of pending and dead rows). Ids a
// rolled-back transaction took count as written: an estimate, labelled
// as such on the page.
func (h *Handler) throughput() chart {
	h.mu.Lock()
	ss := append([]sample(nil), h.samples...)
	h.mu.Unlock()
	var c chart
	if len(ss) < 2 {
		return c
	}
	type rate struct {
		at     time.Time
		w, pub float64
	}
	var rs []rate
	for i := 1; i < len(ss); i++ {
		a, b := ss[i-1], ss[i]
		dt := b.At.Sub(a.At).Seconds()
		if dt <= 0 {
			continue
		}
		w := float64(b.MaxID-a.MaxID) / dt
		p := float64((b.MaxID-a.MaxID)-(b.Pending-a.Pending)-(b.Dead-a.Dead)) / dt
		rs = append(rs, rate{b.At, max(w, 0), max(p, 0)})
		c.Peak = max(c.Peak, w, p)
	}
	if len(rs) < 2 {
		return chart{} // a line needs two rates
	}
	first, last := ss[0].At, ss[len(ss)-1].At
	span := last.Sub(first).Seconds()
	peak := max(c.Peak, 1)
	var wp, pp strings.Builder
	for _, r := range rs {
		x := chartW
		if span > 0 {
			x = r.at.Sub(first).Seconds() / span * chartW
		}
		fmt.Fprintf(&wp, "%.1f,%.1f ", x, chartH-r.w/peak*chartH)
		fmt.Fprintf(&pp, "%.1f,%.1f ", x, chartH-r.pub/peak*chartH)
	}
	c.Written, c.Published = strings.TrimSpace(wp.String()), strings.TrimSpace(pp.String())
	c.LastWritten, c.LastPublished = rs[len(rs)-1].w, rs[len(rs)-1].pub
	c.Since, c.Points = last.Sub(first).Round(time.Second), len(rs)
	return c
}
