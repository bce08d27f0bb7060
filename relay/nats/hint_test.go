package natspub_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

// TestNoStreamHintNamesTheSubject: a message whose subject no stream
// binds fails with relay.ErrUnavailable and a hint naming that subject and
// the commands that bind exactly it or its parent, never the default
// stream's outbox.event.> (issue 36: a mistyped Topic "fu.nowhere").
func TestNoStreamHintNamesTheSubject(t *testing.T) {
	t.Parallel()
	nc := connect(t, serverURL())
	p := newPublisher(t, natspub.Config{Conn: nc})
	subject := natstest.UniqueName("outboxtest-nostream-") + ".nowhere"
	m := relay.Message{ID: 1, MessageID: "N-1", AggregateType: "acct", AggregateID: "N", EventType: "t", Topic: subject, Payload: []byte("x")}
	err := p.Publish(testCtx(t, 30*time.Second), []relay.Message{m})
	if !errors.Is(err, relay.ErrUnavailable) {
		t.Fatalf("Publish to an unbound subject = %v, want ErrUnavailable", err)
	}
	for _, want := range []string{
		`no JetStream stream stores subject "` + subject + `.N"`,
		"--subject-prefix " + subject + ".` (binds " + subject + ".>)",
		"--subjects '" + subject + ".>'`",
		"fix the event's Topic",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "outbox.event.") {
		t.Errorf("error names the default subjects instead of the failed one:\n%v", err)
	}
}

func TestNoStreamHint(t *testing.T) {
	t.Parallel()
	for subject, want := range map[string]string{
		"fu.nowhere.o-17": "no JetStream stream stores subject \"fu.nowhere.o-17\": fix the event's Topic if it is mistyped, or create a stream that binds it: " +
			"`outbox nats stream create --stream FU --subject-prefix fu.nowhere.` (binds fu.nowhere.>) or `nats stream add FU --subjects 'fu.nowhere.>'` or natspub.CreateStream",
		"orders": "no JetStream stream stores subject \"orders\": fix the event's Topic if it is mistyped, or create a stream that binds it: " +
			"`nats stream add ORDERS --subjects 'orders'` or natspub.CreateStream",
	} {
		if got := natspub.NoStreamHint(subject); got != want {
			t.Errorf("NoStreamHint(%q) =\n%s\nwant\n%s", subject, got, want)
		}
	}
}
