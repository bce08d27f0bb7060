package inboxnats

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaseKey returns the key of the lease of stream's durable consumer in
// the lease bucket: "<stream>.<durable>", each byte other than an ASCII
// letter, digit, "-" or "_" written as "=" and two hex digits (KV keys
// allow fewer characters than stream and consumer names), so that distinct
// pairs get distinct keys. `nats kv get <bucket> <key>` shows the holder:
// "<host>/<pid>/<random>".
func LeaseKey(stream, durable string) string {
	return keyToken(stream) + "." + keyToken(durable)
}

func keyToken(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "=%02X", c)
	}
	return b.String()
}

// holderID is a random identity of one Runner, readable by operators.
func holderID() []byte {
	host, _ := os.Hostname()
	return []byte(fmt.Sprintf("%s/%d/%s", host, os.Getpid(), randomHex(8)))
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// kvLease is consume.Lease on a key of a NATS KV bucket whose TTL (the
// stream's MaxAge) expires a holder's key ttl after its last write: the
// holder creates the key (kv.Create succeeds only if it is absent or
// deleted), renews it by updating it at the revision it last wrote (an
// update fails if anyone else wrote since) and deletes it at that
// revision to release it.
type kvLease struct {
	js     jetstream.JetStream
	bucket string
	key    string
	ttl    time.Duration
	id     []byte
	// fatal is called with a bucket that cannot hold the lease safely.
	fatal func(error)
	warn  func(msg string, args ...any)
	// closed reports whether the connection was closed (for good).
	closed func() bool

	kv  jetstream.KeyValue
	rev uint64 // revision of this holder's last write; 0: not held
}

// open returns the bucket, creating it if missing.
func (l *kvLease) open(ctx context.Context) (jetstream.KeyValue, error) {
	if l.kv != nil {
		return l.kv, nil
	}
	kv, err := l.js.KeyValue(ctx, l.bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = l.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: l.bucket, TTL: l.ttl, History: 1,
			Storage: jetstream.FileStorage, Description: "inboxnats consumer leases (github.com/sqloutbox/outbox/inbox/nats)"})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = l.js.KeyValue(ctx, l.bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("inboxnats: lease bucket %s: %w", l.bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("inboxnats: lease bucket %s: %w", l.bucket, err)
	}
	switch ttl := st.TTL(); {
	case ttl == 0 || ttl < l.ttl:
		err := fmt.Errorf("%w: lease bucket %s has TTL %s, below LeaseTTL %s (none: a dead holder's lease never expires; shorter: a live holder's lease expires before it is renewed)",
			ErrLeaseBucket, l.bucket, ttl, l.ttl)
		l.fatal(err)
		return nil, err
	case ttl > l.ttl:
		l.warn("the lease bucket's TTL is longer than LeaseTTL: a dead holder's lease lasts the bucket's TTL", "bucket", l.bucket,
			"bucket_ttl", ttl, "lease_ttl", l.ttl)
	}
	l.kv = kv
	return kv, nil
}

// Acquire creates the key with this holder's ID.
func (l *kvLease) Acquire(ctx context.Context) (bool, error) {
	kv, err := l.open(ctx)
	if err != nil {
		if l.closed() {
			l.fatal(fmt.Errorf("inboxnats: %w", nats.ErrConnectionClosed))
		}
		return false, err
	}
	rev, err := kv.Create(ctx, l.key, l.id)
	if err == nil {
		l.rev = rev
		return true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		if l.closed() {
			l.fatal(fmt.Errorf("inboxnats: %w", nats.ErrConnectionClosed))
		}
		return false, fmt.Errorf("inboxnats: acquiring lease %s: %w", l.key, err)
	}
	// Held: by another holder, or by this one after a Create whose answer
	// was lost.
	return l.adopt(ctx, kv)
}

// Renew updates the key at the revision this holder last wrote.
func (l *kvLease) Renew(ctx context.Context) (bool, error) {
	kv, err := l.open(ctx)
	if err != nil {
		return false, err
	}
	rev, err := kv.Update(ctx, l.key, l.id, l.rev)
	if err == nil {
		l.rev = rev
		return true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, fmt.Errorf("inboxnats: renewing lease %s: %w", l.key, err)
	}
	// Written since: expired and taken by another holder, or renewed by
	// this one in an update whose answer was lost.
	return l.adopt(ctx, kv)
}

// adopt takes the key over if its value is this holder's ID, writing it
// again so that its TTL counts from now (the Lead loop counts from the
// start of this call).
func (l *kvLease) adopt(ctx context.Context, kv jetstream.KeyValue) (bool, error) {
	e, err := kv.Get(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		l.rev = 0
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inboxnats: reading lease %s: %w", l.key, err)
	}
	if !bytes.Equal(e.Value(), l.id) {
		l.rev = 0
		return false, nil
	}
	rev, err := kv.Update(ctx, l.key, l.id, e.Revision())
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		l.rev = 0
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inboxnats: renewing lease %s: %w", l.key, err)
	}
	l.rev = rev
	return true, nil
}

// Release deletes the key if it is still at this holder's revision.
func (l *kvLease) Release(ctx context.Context) error {
	if l.rev == 0 || l.kv == nil {
		return nil
	}
	rev := l.rev
	l.rev = 0
	err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !isWrongLastSeq(err) {
		return fmt.Errorf("inboxnats: releasing lease %s: %w", l.key, err)
	}
	return nil
}

// isWrongLastSeq: a write conditioned on a revision found another one.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
