package faultproxy

import (
	"net"
	"sync"
)

// Pause makes the proxy stop forwarding in both directions while on,
// keeping connections open and holding what either side sends instead of
// dropping it; off forwards everything held, each connection's bytes in
// the order sent. It is a network path that stalls and recovers, as TCP
// sees it (retransmission delivers what was sent, late), where Stall is a
// path that loses what it carries. Connections opened while paused are
// accepted and dialled, but nothing passes on them until Pause(false). A
// connection cut while paused (CutAll, Refuse, Close) loses what it held.
func (p *Proxy) Pause(on bool) {
	p.gate.set(on)
}

// gate holds paused traffic: resume is non-nil while paused and closed
// when the pause ends. The zero value is open.
type gate struct {
	mu     sync.Mutex
	resume chan struct{}
}

func (g *gate) set(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case on && g.resume == nil:
		g.resume = make(chan struct{})
	case !on && g.resume != nil:
		close(g.resume)
		g.resume = nil
	}
}

// wait returns true once the gate is open, or false if cut is closed
// first.
func (g *gate) wait(cut <-chan struct{}) bool {
	g.mu.Lock()
	resume := g.resume
	g.mu.Unlock()
	if resume == nil {
		return true
	}
	select {
	case <-resume:
		return true
	case <-cut:
		return false
	}
}

// gatedListener accepts client connections whose reads and writes pass
// the proxy's gate: a client's bytes are held after the proxy read them
// (and the rest in the client's socket), the server's before they are
// written to the client (and the rest in the server's socket).
type gatedListener struct {
	net.Listener
	gate *gate
}

func (l gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, gate: l.gate, cut: make(chan struct{})}, nil
}

// gatedConn is a client connection behind the gate.
type gatedConn struct {
	net.Conn
	gate *gate
	once sync.Once
	cut  chan struct{} // closed by Close
}

func (c *gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.gate.wait(c.cut) {
		return 0, net.ErrClosed // cut while paused: what it held is lost
	}
	return n, err
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if !c.gate.wait(c.cut) {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) Close() error {
	c.once.Do(func() { close(c.cut) })
	return c.Conn.Close()
}
