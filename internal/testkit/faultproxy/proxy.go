// Package faultproxy is a TCP proxy for fault tests: it sits between a
// client and a database or broker on loopback and can cut every
// connection, cut one when the client sends a given byte pattern (either
// before or after forwarding it) or hold that connection there until
// released, stall every connection (dropping what passes) and pause every
// connection (holding what passes until it resumes: Pause).
package faultproxy

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
)

// Action says what to do when a watched pattern passes client to server.
type Action int

const (
	// CutBefore closes both sides without forwarding the chunk holding the
	// pattern (its end, if the pattern came split across reads): the
	// server never sees all of it.
	CutBefore Action = iota + 1
	// CutAfter forwards the chunk, then closes both sides before any reply
	// reaches the client: the server acts, the client never learns.
	CutAfter
	// HoldBefore keeps the chunk holding the pattern, and everything the
	// client sends after it on that connection, from the server until
	// Release, then forwards it all in order: a client paused (or a
	// network stalled) just before a statement, with its connection and
	// its transaction open. Other connections flow on.
	HoldBefore
)

// Proxy forwards connections from its own loopback port to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	pattern []byte
	action  Action
	conns   map[net.Conn]struct{}
	refuse  bool
	stalled atomic.Bool
	gate    gate          // Pause
	held    chan struct{} // closed by Release
	// Tripped counts connections cut or held by a pattern.
	Tripped atomic.Int64
	// Refused counts connections closed at once while refusing.
	Refused atomic.Int64

	dialed func() // tests, under mu: runs after a connection's upstream dial, before it is tracked
}

// Start listens on 127.0.0.1 (a free port) and forwards to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, held: make(chan struct{})}
	p.ln = gatedListener{Listener: ln, gate: &p.gate}
	go p.accept()
	return p, nil
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Arm makes the next client chunk containing pattern trigger action, once.
// A pattern split across reads counts: the chunk completing it triggers.
func (p *Proxy) Arm(pattern []byte, action Action) {
	p.mu.Lock()
	p.pattern, p.action = append([]byte(nil), pattern...), action
	p.mu.Unlock()
}

// Release forwards what HoldBefore held and lets held connections flow
// again. Close releases too.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.held:
	default:
		close(p.held)
	}
}

// Refuse makes the proxy cut every open connection and close new ones at
// once (on: the server looks down) or forward again (off).
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
	if on {
		p.CutAll()
	}
}

// Stall makes the proxy drop every byte in both directions while on,
// keeping connections open: a peer that went silent without a reset
// (failover, a NAT or firewall dropping the flow).
func (p *Proxy) Stall(on bool) { p.stalled.Store(on) }

// CutAll closes every open connection (new ones are still accepted).
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops listening and cuts every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.CutAll()
	p.Release()
	return err
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			p.Refused.Add(1)
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		dialed := p.dialed
		p.mu.Unlock()
		if dialed != nil {
			dialed()
		}
		// Refuse may have cut every tracked connection while this one
		// dialed: look again under the lock that tracks it, or it would
		// outlive the "outage" (an inbox test saw records applied
		// through one).
		p.mu.Lock()
		if p.refuse {
			p.mu.Unlock()
			p.Refused.Add(1)
			client.Close()
			server.Close()
			continue
		}
		p.conns[client] = struct{}{}
		p.conns[server] = struct{}{}
		p.mu.Unlock()
		cut := func() {
			client.Close()
			server.Close()
			p.track(client, false)
			p.track(server, false)
		}
		var once sync.Once
		go func() { // server -> client
			buf := make([]byte, 64<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && !p.stalled.Load() {
					if _, werr := client.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			once.Do(cut)
		}()
		go func() { // client -> server, watching for the pattern
			buf := make([]byte, 64<<10)
			var tail []byte // the stream's last len(pattern)-1 bytes before chunk
			for {
				n, err := client.Read(buf)
				if n > 0 {
					chunk := buf[:n]
					p.mu.Lock()
					act := Action(0)
					if p.pattern != nil {
						if containsAcross(tail, chunk, p.pattern) {
							act = p.action
							p.pattern = nil
						} else {
							tail = keepTail(tail, chunk, len(p.pattern)-1)
						}
					}
					p.mu.Unlock()
					switch act {
					case HoldBefore:
						p.Tripped.Add(1)
						<-p.held // the client's later bytes wait in the socket
					case CutBefore:
						p.Tripped.Add(1)
						once.Do(cut)
						return
					case CutAfter:
						// Counted before anything is closed: a client that
						// sees its connection end must find the trip
						// counted (a test read Tripped right after its
						// COMMIT failed and, under load, saw 0). Then close
						// the client side before the server gets the chunk,
						// so that no reply can reach the client (a fast
						// server answered in between before); let the
						// server finish the command.
						p.Tripped.Add(1)
						client.Close()
						_, _ = server.Write(chunk)
						once.Do(cut)
						return
					}
					if !p.stalled.Load() { // while stalled, dropped
						if _, werr := server.Write(chunk); werr != nil {
							once.Do(cut)
							return
						}
					}
				}
				if err != nil {
					once.Do(cut)
					return
				}
			}
		}()
	}
}

// containsAcross reports whether pattern is in chunk or straddles tail
// (the bytes read just before chunk, fewer than len(pattern)) and chunk:
// TCP may deliver a pattern the client wrote at once in two reads.
func containsAcross(tail, chunk, pattern []byte) bool {
	if bytes.Contains(chunk, pattern) {
		return true
	}
	if len(tail) == 0 {
		return false
	}
	head := chunk[:min(len(chunk), len(pattern)-1)]
	return bytes.Contains(append(append(make([]byte, 0, len(tail)+len(head)), tail...), head...), pattern)
}

// keepTail returns the last k bytes of tail followed by chunk, reusing
// tail's array.
func keepTail(tail, chunk []byte, k int) []byte {
	if len(chunk) >= k {
		return append(tail[:0], chunk[len(chunk)-k:]...)
	}
	tail = append(tail, chunk...)
	if len(tail) > k {
		tail = append(tail[:0], tail[len(tail)-k:]...)
	}
	return tail
}
