package faultproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// request is a Kafka request frame: size, API key, version 0, and body.
func request(key int16, body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
	b = binary.BigEndian.AppendUint16(b, uint16(key))
	b = binary.BigEndian.AppendUint16(b, 0)
	return append(b, body...)
}

// kafkaEchoServer answers every request with its own bytes and reports the
// API keys it received on got.
func kafkaEchoServer(t *testing.T) (addr string, got <-chan int16) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	keys := make(chan int16, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					req, key, err := readRequest(c)
					if err != nil {
						return
					}
					keys <- key
					if _, err := c.Write(req); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), keys
}

// roundTrip sends req on c and reads the echo; it returns an error if
// the connection ends first.
func roundTrip(c net.Conn, req []byte) error {
	if _, err := c.Write(req); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp := make([]byte, len(req))
	if _, err := io.ReadFull(c, resp); err != nil {
		return err
	}
	if !bytes.Equal(resp, req) {
		return errors.New("response differs from the request")
	}
	return nil
}

// TestKafkaResetOn: requests of other API keys pass; the armed one
// resets its connection, unseen by the server (CutBefore) or seen but
// unanswered (CutAfter); once disarmed, a new connection passes again.
func TestKafkaResetOn(t *testing.T) {
	for _, tc := range []struct {
		action  Action
		reaches bool
		name    string
	}{{CutBefore, false, "CutBefore"}, {CutAfter, true, "CutAfter"}} {
		t.Run(tc.name, func(t *testing.T) {
			target, keys := kafkaEchoServer(t)
			k, err := StartKafka(target)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { k.Close() })
			// CutAfter: hold the reset until the server's answer to the
			// armed request has been handled by the response copy, the
			// order a loaded machine produced (CI failed with "the armed
			// produce request was answered"): it must be dropped.
			chunks := make(chan struct{}, 16)
			k.afterChunk = func() { chunks <- struct{}{} }
			k.beforeCut = func() {
				select {
				case <-chunks: // the metadata answer
				case <-time.After(10 * time.Second):
				}
				select {
				case <-chunks: // the produce answer
				case <-time.After(10 * time.Second):
					t.Error("the server's answer to the armed request never came back to the proxy")
				}
			}
			k.ResetOn(0, 1, tc.action)
			c, err := net.Dial("tcp", k.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := roundTrip(c, request(3, "metadata")); err != nil {
				t.Fatalf("a metadata request: %v", err)
			}
			if key := <-keys; key != 3 {
				t.Fatalf("server got key %d, want 3", key)
			}
			if err := roundTrip(c, request(0, "produce")); err == nil {
				t.Fatal("the armed produce request was answered")
			}
			if k.Armed() != 0 || k.Tripped.Load() != 1 {
				t.Fatalf("armed %d, tripped %d; want 0 and 1", k.Armed(), k.Tripped.Load())
			}
			c2, err := net.Dial("tcp", k.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			if err := roundTrip(c2, request(0, "produce again")); err != nil {
				t.Fatalf("a produce request after the reset: %v", err)
			}
			want := []int16{0}
			if tc.reaches {
				want = []int16{0, 0} // the reset one, then the new one
			}
			for _, w := range want {
				if key := <-keys; key != w {
					t.Fatalf("server got key %d, want %d", key, w)
				}
			}
			select {
			case key := <-keys:
				t.Fatalf("server got an extra request with key %d", key)
			default:
			}
		})
	}
}
