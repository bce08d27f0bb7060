package relay_test

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// blackholeProxy forwards TCP connections to a target; blackhole makes
// every connection open at that moment silent in both directions (bytes
// read and dropped, neither side closed by the proxy, as a NAT or
// firewall that lost the flow does), while new connections pass.
type blackholeProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	holes []*atomic.Bool
}

func startBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackholeProxy{ln: ln}
	var conns []net.Conn
	var cmu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			cmu.Lock()
			conns = append(conns, client, server)
			cmu.Unlock()
			hole := &atomic.Bool{}
			p.mu.Lock()
			p.holes = append(p.holes, hole)
			p.mu.Unlock()
			pipe := func(from, to net.Conn) {
				buf := make([]byte, 64<<10)
				for {
					n, err := from.Read(buf)
					if n > 0 && !hole.Load() {
						if _, werr := to.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						if !hole.Load() {
							from.Close()
							to.Close()
						}
						return
					}
				}
			}
			go pipe(client, server)
			go pipe(server, client)
		}
	}()
	return p
}

func (p *blackholeProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range p.holes {
		h.Store(true)
	}
}

// TestWALSilentStreamReconnects: the replication connection goes silent
// (a NAT or firewall drops the flow without closing it) while new
// connections work. The reader asks the server for a reply with its status
// updates once the stream is quiet, and ends a stream that stays silent
// past WALConfig.ReceiveTimeout (3 s here); it reconnects, and when the server has not
// noticed the dead connection yet (its wal_sender_timeout, 60 s by
// default), the slot is still held by the relay's own old walsender, which
// the relay terminates. A-2, committed after the cut, is published. Before
// the fix the reader had no receive deadline beyond its status ticks and
// went on "streaming" the dead connection: in log-only mode A-2, in no
// table, was not published until the kernel gave up on the socket (about
// 15 minutes; never here, where the path takes and drops every byte). Found
// by a helper trying to break the WAL source.
func TestWALSilentStreamReconnects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		senderTimeout string // the server's wal_sender_timeout for the stream's session; "": its default
	}{{"server times the walsender out", "1s"}, {"server keeps the walsender", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, wal := logEnv(t)
			u, err := url.Parse(e.DSN)
			if err != nil {
				t.Fatal(err)
			}
			proxy := startBlackholeProxy(t, u.Host)
			u.Host = proxy.ln.Addr().String()
			if tc.senderTimeout != "" {
				q := u.Query()
				q.Set("wal_sender_timeout", tc.senderTimeout)
				u.RawQuery = q.Encode()
			}
			wal.DSN = u.String()
			wal.ReceiveTimeout = 3 * time.Second
			b := walSetup(t, e, wal, nil)
			waitStreaming(t, b, wal.Slot)
			b.emit(t, event("A", 1))
			if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
				t.Fatal(err)
			}
			proxy.blackhole()
			b.emit(t, event("A", 2))
			msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return slices.Contains(order(m, "A"), "A-2") })
			if err != nil {
				t.Fatalf("A-2 not published after the stream went silent (relay on the stream: %v, ready: %v): %v", b.r.OnStream(), b.r.Ready(), err)
			}
			// A-1 may come again: its position's report may have been lost
			// in the silence (at least once).
			if got := firstDeliveries(order(msgs, "A")); fmt.Sprint(got) != "[A-1 A-2]" {
				t.Fatalf("A first delivered as %v", got)
			}
		})
	}
}
