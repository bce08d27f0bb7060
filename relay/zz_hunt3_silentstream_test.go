package relay_test

import (
	"context"
	"net"
	"net/url"
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

// TestHunt3SilentStreamIsNeverNoticed: the replication connection goes
// silent (a NAT or firewall drops the flow; the server's side times out
// after wal_sender_timeout, here 1 s, and the slot is free again) while
// new connections work. The reader has no receive deadline beyond its
// own status ticks (pgconn.Timeout: continue) and treats no silence as a
// dead stream, so the relay goes on "streaming" a connection the server
// closed long ago: in log-only mode an event committed then is in no
// table, and is not published until the kernel gives up on the socket
// (tcp_retries2: about 15 minutes with unacknowledged status updates;
// never here, where the path acknowledges and drops).
func TestHunt3SilentStreamIsNeverNoticed(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	u, err := url.Parse(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startBlackholeProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	q := u.Query()
	q.Set("wal_sender_timeout", "1s") // the server's side gives up after 1 s of silence
	u.RawQuery = q.Encode()
	wal.DSN = u.String()
	b := walSetup(t, e, wal, nil)
	waitStreaming(t, b, wal.Slot)
	b.emit(t, event("A", 1))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
		t.Fatal(err)
	}
	proxy.blackhole()
	eventually(t, b.ctx, "the server timed the walsender out (the slot is free)", func() bool {
		var active bool
		if err := e.RelayDB.QueryRow("SELECT active FROM pg_replication_slots WHERE slot_name = $1", wal.Slot).Scan(&active); err != nil {
			t.Fatal(err)
		}
		return !active
	})
	b.emit(t, event("A", 2))
	// Ten times wal_sender_timeout: a reader that watched for the server's
	// keepalives would have reconnected (new connections pass) by then.
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if _, err := b.pub.Wait(ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 2 }); err != nil {
		t.Fatalf("A-2 not published 10 s after the server closed the silent stream (relay on the stream: %v, ready: %v): %v", b.r.OnStream(), b.r.Ready(), err)
	}
}
