package faultproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Kafka is a TCP proxy for the Kafka protocol. It forwards each request
// whole (a Kafka request is an int32 size, then an int16 API key, an int16
// version and the rest: kmsg.Produce is key 0) and can reset the
// connection of chosen requests, by API key, counting them across every
// connection: a connection reset mid-request, whatever the TCP segments
// the client wrote. Responses flow back unchanged.
type Kafka struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	key    int16
	left   int // requests with key still to reset
	action Action
	conns  map[net.Conn]struct{}
	closed bool

	// Tripped counts the requests that reset their connection.
	Tripped atomic.Int64

	// Tests only: afterChunk runs after each chunk of a response was
	// forwarded or dropped, beforeCut between forwarding a CutAfter
	// request and the reset.
	afterChunk, beforeCut func()
}

// StartKafka listens on 127.0.0.1 (a free port) and forwards to target.
func StartKafka(target string) (*Kafka, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	k := &Kafka{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	k.wg.Add(1)
	go k.accept()
	return k, nil
}

// Addr is the proxy's "host:port".
func (k *Kafka) Addr() string { return k.ln.Addr().String() }

// ResetOn makes the next n requests with API key apiKey (on any
// connection) reset their connection (an RST, not a FIN): with CutBefore
// the request is not forwarded, so the broker never sees it; with
// CutAfter it is forwarded whole and the client's side is reset at once,
// so the broker acts on it and the client never gets the response.
// ResetOn replaces what an earlier call left armed; n 0 disarms.
// HoldBefore is not supported (ResetOn panics: a test's mistake).
func (k *Kafka) ResetOn(apiKey int16, n int, action Action) {
	if action != CutBefore && action != CutAfter {
		panic(fmt.Sprintf("faultproxy: Kafka.ResetOn supports CutBefore and CutAfter, not %d", action))
	}
	k.mu.Lock()
	k.key, k.left, k.action = apiKey, n, action
	k.mu.Unlock()
}

// Armed is the number of resets ResetOn armed that have not happened yet.
func (k *Kafka) Armed() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.left
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines.
func (k *Kafka) Close() error {
	err := k.ln.Close()
	k.mu.Lock()
	k.closed = true
	for c := range k.conns {
		reset(c)
	}
	k.mu.Unlock()
	k.wg.Wait()
	return err
}

// keep tracks c until forget, or resets it at once after Close.
func (k *Kafka) keep(c net.Conn) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		reset(c)
		return false
	}
	k.conns[c] = struct{}{}
	return true
}

func (k *Kafka) forget(c net.Conn) {
	k.mu.Lock()
	delete(k.conns, c)
	k.mu.Unlock()
}

func (k *Kafka) accept() {
	defer k.wg.Done()
	for {
		client, err := k.ln.Accept()
		if err != nil {
			return
		}
		k.wg.Add(1)
		go k.serve(client)
	}
}

// serve forwards one client connection, request by request.
func (k *Kafka) serve(client net.Conn) {
	defer k.wg.Done()
	if !k.keep(client) {
		return
	}
	defer k.forget(client)
	defer reset(client)
	server, err := net.Dial("tcp", k.target)
	if err != nil {
		return
	}
	if !k.keep(server) {
		return
	}
	defer k.forget(server)
	done := make(chan struct{})
	// cut is set before a CutAfter request is forwarded: from then on no
	// byte from the server reaches the client, however fast the server
	// answers (a copy racing the reset let the response through under
	// load: TestKafkaResetOn/CutAfter).
	var cut atomic.Bool
	go func() { // responses, unchanged, until either side closes
		defer close(done)
		defer reset(client)
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && !cut.Load() {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if n > 0 && k.afterChunk != nil {
				k.afterChunk()
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() { <-done }()
	defer server.Close() // before waiting for the copy above
	for {
		req, key, err := readRequest(client)
		if err != nil {
			return
		}
		switch k.trip(key) {
		case CutBefore:
			return // reset(client) and server.Close above
		case CutAfter:
			cut.Store(true)
			if _, err := server.Write(req); err != nil {
				return
			}
			if k.beforeCut != nil {
				k.beforeCut()
			}
			reset(client)
			<-done // the response is dropped; then the server side closes
			return
		}
		if _, err := server.Write(req); err != nil {
			return
		}
	}
}

// trip takes one armed reset for a request with key, returning its action
// (0: forward the request).
func (k *Kafka) trip(key int16) Action {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.left == 0 || key != k.key {
		return 0
	}
	k.left--
	k.Tripped.Add(1)
	return k.action
}

// maxRequest bounds a request's size (Kafka's default socket.request.max.bytes, 100 MiB).
const maxRequest = 100 << 20

// readRequest reads one whole request: its size prefix and body.
func readRequest(r io.Reader) (req []byte, key int16, err error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, 0, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n < 2 || n > maxRequest {
		return nil, 0, errors.New("faultproxy: not a Kafka request")
	}
	req = make([]byte, 4+n)
	copy(req, size[:])
	if _, err := io.ReadFull(r, req[4:]); err != nil {
		return nil, 0, err
	}
	return req, int16(binary.BigEndian.Uint16(req[4:6])), nil
}

// reset closes c with an RST (SO_LINGER 0) where it is a TCP connection.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// advertised is a listener that reports another address.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

// Advertise returns a listen function of net.Listen's shape (what
// kfake.ListenFn takes) that listens on a free loopback port, starts a
// proxy in front of it with start, hands that proxy to got, and returns
// a listener whose Addr is the proxy's. A server that advertises its
// listener's address (kfake in its metadata) then sends every client,
// and every reconnect, through the proxy. The proxy's Close is the
// caller's.
func Advertise[P interface{ Addr() string }](start func(target string) (P, error), got func(P)) func(network, address string) (net.Listener, error) {
	return func(network, _ string) (net.Listener, error) {
		ln, err := net.Listen(network, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		p, err := start(ln.Addr().String())
		if err != nil {
			ln.Close()
			return nil, err
		}
		got(p)
		pa, err := net.ResolveTCPAddr("tcp", p.Addr())
		if err != nil {
			ln.Close()
			return nil, err
		}
		return advertised{Listener: ln, addr: pa}, nil
	}
}
