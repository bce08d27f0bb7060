package faultproxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// sink accepts connections on loopback and records the bytes of the
// first one, and whether it ended (EOF or error).
type sink struct {
	ln    net.Listener
	mu    sync.Mutex
	got   []byte
	ended bool
}

func startSink(t *testing.T) *sink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			s.mu.Lock()
			s.got = append(s.got, buf[:n]...)
			if err != nil {
				s.ended = true
			}
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

// state returns a copy of the bytes received and whether the connection
// ended.
func (s *sink) state() ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.got), s.ended
}

// waitUntil polls cond every millisecond until it holds, failing t after
// a generous deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// TestPatternSplitAcrossReads sends a client stream whose last bytes are
// the armed pattern, in parts: each part is written only once the server
// received the previous ones, so the proxy reads each part by itself.
// Whatever the split (at every position of the pattern, and a read per
// byte), the proxy must act once, on the read that completes the pattern.
// A pattern resembling the armed one split the same way never trips.
func TestPatternSplitAcrossReads(t *testing.T) {
	t.Parallel()
	pattern := []byte("\x03COMMIT") // MySQL's COM_QUERY "COMMIT", as integration/tests arms it
	before := []byte("\x07\x00\x00\x00")
	stream := append(bytes.Clone(before), pattern...)
	type split struct {
		name string
		cuts []int // offsets into stream where a new read starts
	}
	splits := []split{{name: "Whole"}}
	for i := 1; i < len(pattern); i++ {
		splits = append(splits, split{fmt.Sprintf("At%d", i), []int{len(before) + i}})
	}
	var perByte []int
	for i := len(before) + 1; i < len(stream); i++ {
		perByte = append(perByte, i)
	}
	splits = append(splits, split{"EveryByte", perByte})

	for _, action := range []Action{CutBefore, CutAfter, HoldBefore} {
		name := map[Action]string{CutBefore: "CutBefore", CutAfter: "CutAfter", HoldBefore: "HoldBefore"}[action]
		for _, sp := range splits {
			t.Run(name+"/"+sp.name, func(t *testing.T) {
				t.Parallel()
				s := startSink(t)
				p, err := Start(s.ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				p.Arm(pattern, action)
				c, err := net.Dial("tcp", p.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()

				last := 0 // where the part completing the pattern starts
				for i, start := range append([]int{0}, sp.cuts...) {
					end := len(stream)
					if i < len(sp.cuts) {
						end = sp.cuts[i]
					}
					waitUntil(t, "the earlier parts at the server", func() bool { got, _ := s.state(); return len(got) == start })
					if _, err := c.Write(stream[start:end]); err != nil {
						t.Fatal(err)
					}
					last = start
				}
				if err := c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				// Unarmed, the proxy forwards everything and the client's
				// EOF ends the server's connection.
				waitUntil(t, "the proxy to trip or the stream to end", func() bool {
					_, ended := s.state()
					return p.Tripped.Load() > 0 || ended
				})
				if n := p.Tripped.Load(); n != 1 {
					got, _ := s.state()
					t.Fatalf("tripped %d times, want 1 (the server got %q)", n, got)
				}

				switch action {
				case CutBefore:
					waitUntil(t, "the cut", func() bool { _, ended := s.state(); return ended })
					if got, _ := s.state(); !bytes.Equal(got, stream[:last]) {
						t.Errorf("server got %q, want %q: the read completing the pattern is not forwarded", got, stream[:last])
					}
				case CutAfter:
					waitUntil(t, "the cut", func() bool { _, ended := s.state(); return ended })
					if got, _ := s.state(); !bytes.Equal(got, stream) {
						t.Errorf("server got %q, want all of %q", got, stream)
					}
					if n, err := c.Read(make([]byte, 1)); err == nil {
						t.Errorf("the client read %d bytes after the cut", n)
					}
				case HoldBefore:
					if got, ended := s.state(); !bytes.Equal(got, stream[:last]) || ended {
						t.Errorf("held: server got %q (ended %v), want %q and the connection open", got, ended, stream[:last])
					}
					p.Release()
					waitUntil(t, "the held bytes and the client's EOF", func() bool { _, ended := s.state(); return ended })
					if got, _ := s.state(); !bytes.Equal(got, stream) {
						t.Errorf("released: server got %q, want %q", got, stream)
					}
				}
			})
		}
	}

	// Near misses, split where the pattern would be: nothing trips and
	// every byte reaches the server.
	for _, tc := range []struct {
		name  string
		parts []string
	}{
		{"PrefixThenOther", []string{"\x07\x00\x00\x00\x03COM", "MIX"}},
		{"PrefixTwice", []string{"\x03COMMI", "\x03COMM", "IX"}},
		{"PrefixThenOtherThenRest", []string{"\x03COM", "x", "MIT"}},
	} {
		t.Run("NoTrip/"+tc.name, func(t *testing.T) {
			t.Parallel()
			s := startSink(t)
			p, err := Start(s.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			p.Arm(pattern, CutBefore)
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var want []byte
			for _, part := range tc.parts {
				sent := len(want)
				waitUntil(t, "the earlier parts at the server", func() bool { got, _ := s.state(); return len(got) == sent })
				if _, err := io.WriteString(c, part); err != nil {
					t.Fatal(err)
				}
				want = append(want, part...)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the stream to end", func() bool { _, ended := s.state(); return ended || p.Tripped.Load() > 0 })
			if got, _ := s.state(); p.Tripped.Load() != 0 || !bytes.Equal(got, want) {
				t.Errorf("tripped %d, server got %q; want no trip and %q", p.Tripped.Load(), got, want)
			}
		})
	}
}

// TestTripCountedBeforeTheClientSeesTheCut: once a client's read fails
// after a cut, Tripped already counts it, for every action that cuts (the
// CutAfter case counted it only after closing the client, and a test that
// read Tripped right after its COMMIT failed saw 0 under load).
func TestTripCountedBeforeTheClientSeesTheCut(t *testing.T) {
	t.Parallel()
	for _, action := range []Action{CutBefore, CutAfter} {
		for i := 0; i < 50; i++ {
			s := startSink(t)
			p, err := Start(s.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			p.Arm([]byte("COMMIT"), action)
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write([]byte("COMMIT")); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatalf("action %d: the client read after the cut", action)
			}
			if n := p.Tripped.Load(); n != 1 {
				t.Fatalf("action %d, round %d: the client saw the cut with Tripped %d, want 1", action, i, n)
			}
			c.Close()
			p.Close()
		}
	}
}
