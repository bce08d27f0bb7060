package inboxrabbitmq

import (
	"testing"
	"time"
)

// TestReconnectAfterAnOutage: the runner's reconnection schedule, from
// the moment the connection is lost, has an attempt within
// 1.2 s (DefaultReconnectMax and its jitter) of any moment (here: the end of an outage of
// 0.5 to 10 s). With the former 5 s cap, a 4 s cut was followed by an
// attempt only 2.3 s (±50 %) after the broker came back.
func TestReconnectAfterAnOutage(t *testing.T) {
	t.Parallel()
	const bound = 1200 * time.Millisecond // 1 s and its jitter
	for _, outage := range []time.Duration{500 * time.Millisecond, 2 * time.Second, 4 * time.Second, 10 * time.Second} {
		for range 50 { // the jitter
			b := reconnectBackoff(DefaultReconnectMax)
			var at time.Duration
			for at < outage {
				at += b.NextBackOff()
			}
			if late := at - outage; late > bound {
				t.Fatalf("after a %s outage the first attempt came %s after the broker's return, want at most %s", outage, late, bound)
			}
		}
	}
}
