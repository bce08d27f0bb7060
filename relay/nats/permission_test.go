package natspub_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
)

// Users of the private server. permAdmin may do everything; permPub may
// not publish to permDenied's subjects (the stream stores them, were they
// published); permNoAPI may not publish to the JetStream API.
const (
	permAdmin  = "admin"
	permPub    = "pub"
	permNoAPI  = "noapi"
	permPass   = "secret"
	permStream = "PERM"
	permDenied = "perm.denied" // subject prefix permPub may not publish under
	permOpen   = "perm.open"   // subject prefix everyone may publish under
)

// permServer starts a private nats-server (privateserver.NATSServer:
// never the shared one) with JetStream (a temporary store directory) and
// the users above on a free port, and returns its URL once it accepts
// connections; the server is killed when the test ends. Without the
// binary the test is skipped, except under OUTBOX_TEST_REQUIRE (CI),
// where it fails.
func permServer(t *testing.T) string {
	t.Helper()
	addr := privateserver.NATSServer(t, func(dir string) string {
		return fmt.Sprintf(`
jetstream { store_dir: %q }
authorization {
  users: [
    { user: %q, password: %q }
    { user: %q, password: %q, permissions: { publish: { deny: [%q] } } }
    { user: %q, password: %q, permissions: { publish: { deny: ["$JS.API.>"] } } }
  ]
}
`, filepath.Join(dir, "js"), permAdmin, permPass, permPub, permPass, permDenied+".>", permNoAPI, permPass)
	})
	return "nats://" + addr
}

// permConnect connects to url as user and closes the connection when the
// test ends.
func permConnect(t *testing.T, url, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, permPass), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // quiet: the violations are expected
	if err != nil {
		t.Fatalf("connecting as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// permSubject routes aggregate type "denied" under permDenied, others
// under permOpen; aggregate type "quoted" under permDenied with a subject
// that has a double quote and a backslash in it (the server quotes the
// subject in its violation).
func permSubject(m relay.Message) string {
	switch m.AggregateType {
	case "denied":
		return permDenied + "." + natspub.SubjectToken(m.AggregateID)
	case "quoted":
		return permDenied + `.q"\` + natspub.SubjectToken(m.AggregateID)
	}
	return permOpen + "." + natspub.SubjectToken(m.AggregateID)
}

// TestPermissionDenied runs against a private nats-server with users: a
// publish the connection's user may not make is the route's fault
// (relay.ErrUnavailable, no attempt counted, nothing dead-lettered), not
// the message's (never relay.ErrPermanent), and it is reported at once,
// not as a PubAck timeout of the whole batch.
func TestPermissionDenied(t *testing.T) {
	t.Parallel()
	url := permServer(t)
	admin := permConnect(t, url, permAdmin)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: permStream, Subjects: []string{"perm.>"}, Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A PubAck timeout far above what a prompt answer takes: a denied
	// publish reported as a timeout shows up as the batch error below.
	const ackTimeout = 10 * time.Second
	pub, err := natspub.NewPublisher(natspub.Config{Conn: permConnect(t, url, permPub), Subject: permSubject, AckTimeout: ackTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	msg := func(typ, id, mid string) relay.Message {
		return relay.Message{MessageID: mid, AggregateType: typ, AggregateID: id, EventType: "e", Payload: []byte(mid)}
	}

	t.Run("EveryMessageDenied", func(t *testing.T) {
		batch := []relay.Message{msg("denied", "1", "d1"), msg("denied", "1", "d2"), msg("denied", "2", "d3"), msg("quoted", "1", "q1")}
		start := time.Now()
		err := pub.Publish(ctx, batch)
		var pe relay.PublishErrors
		if !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) || errors.As(err, &pe) {
			t.Fatalf("Publish of denied messages: %v; want one error wrapping relay.ErrUnavailable", err)
		}
		if !strings.Contains(err.Error(), permDenied) {
			t.Errorf("error %q does not name the denied subject", err)
		}
		if took := time.Since(start); took >= ackTimeout {
			t.Errorf("took %s: reported as a timeout, not as the violation", took)
		}
	})

	t.Run("SomeMessagesDenied", func(t *testing.T) {
		batch := []relay.Message{msg("denied", "3", "d4"), msg("open", "1", "o1"), msg("denied", "3", "d5"), msg("open", "1", "o2")}
		err := pub.Publish(ctx, batch)
		var pe relay.PublishErrors
		if !errors.As(err, &pe) || len(pe) != len(batch) {
			t.Fatalf("Publish of a mixed batch: %v; want relay.PublishErrors", err)
		}
		if !errors.Is(pe[0], relay.ErrUnavailable) || errors.Is(pe[0], relay.ErrPermanent) {
			t.Errorf("denied message: %v; want relay.ErrUnavailable", pe[0])
		}
		if !errors.Is(pe[2], natspub.ErrHeldBack) {
			t.Errorf("the denied aggregate's later message: %v; want ErrHeldBack", pe[2])
		}
		if pe[1] != nil || pe[3] != nil {
			t.Errorf("permitted messages: %v, %v; want acknowledged", pe[1], pe[3])
		}
		// The stream has the permitted messages and none of the denied.
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 2 {
			t.Errorf("stream holds %d messages, want the 2 permitted", info.State.Msgs)
		}
	})

	t.Run("PermittedAfterDenied", func(t *testing.T) {
		// The violations before do not stick to the connection.
		if err := pub.Publish(ctx, []relay.Message{msg("open", "2", "o3")}); err != nil {
			t.Fatalf("Publish of a permitted message: %v", err)
		}
		if err := pub.Healthy(ctx); err != nil {
			t.Fatalf("Healthy: %v", err)
		}
	})

	t.Run("HealthyWithoutJetStreamAPI", func(t *testing.T) {
		noAPI, err := natspub.NewPublisher(natspub.Config{Conn: permConnect(t, url, permNoAPI), Subject: permSubject, AckTimeout: ackTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = noAPI.Close() })
		hctx, cancel := context.WithTimeout(ctx, ackTimeout)
		defer cancel()
		start := time.Now()
		err = noAPI.Healthy(hctx)
		if !errors.Is(err, relay.ErrUnavailable) {
			t.Fatalf("Healthy of a user denied the JetStream API: %v; want relay.ErrUnavailable", err)
		}
		if took := time.Since(start); took >= ackTimeout {
			t.Errorf("took %s: reported as a timeout, not as the violation", took)
		}
	})
}
