// Package failpoint lets fault tests crash a process at a named point in
// the relay, deterministically. It is off unless the environment variable
// OUTBOX_FAILPOINTS is set when the process starts, and then costs one map
// lookup per point; in production it is a nil-map check.
//
// OUTBOX_FAILPOINTS is a comma-separated list of name=action, where action
// is "kill" (SIGKILL this process at the first hit) or "kill@N" (at the
// N-th hit). Names are the constants below.
package failpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The failpoints the relay and the Kafka publisher define.
const (
	// AfterClaim: a batch was claimed, nothing published yet.
	AfterClaim = "relay/after-claim"
	// AfterPublish: the broker acknowledged the batch, mark-sent not yet run.
	AfterPublish = "relay/after-publish"
	// MidBatch: the broker answered the Produce requests carrying half of
	// a batch's records, before the Kafka publisher took the answers in.
	MidBatch = "kafka/mid-batch"
	// BeforeCommit: in the Kafka publisher's exactly-once mode, a
	// transaction's records and manifest were written, EndTxn not yet
	// sent (the transaction is open at the broker).
	BeforeCommit = "kafka/before-commit"
)

type point struct {
	at   int
	hits int
}

var (
	mu     sync.Mutex
	active = parse(os.Getenv("OUTBOX_FAILPOINTS"))
)

func parse(spec string) map[string]*point {
	if spec == "" {
		return nil
	}
	m := map[string]*point{}
	for _, item := range strings.Split(spec, ",") {
		name, action, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			continue
		}
		at := 1
		if n, ok := strings.CutPrefix(action, "kill@"); ok {
			if v, err := strconv.Atoi(n); err == nil && v > 0 {
				at = v
			}
		} else if action != "kill" {
			continue
		}
		m[name] = &point{at: at}
	}
	return m
}

// Inject kills the process with SIGKILL if the failpoint name is armed and
// this is its N-th hit; otherwise it does nothing.
func Inject(name string) {
	if active == nil {
		return
	}
	mu.Lock()
	p := active[name]
	if p == nil {
		mu.Unlock()
		return
	}
	p.hits++
	hit := p.hits == p.at
	mu.Unlock()
	if hit {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way; never return into the relay
	}
}
