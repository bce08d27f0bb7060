package natspub_test

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
)

// ExampleNewPublisher connects to NATS and builds the publisher for a
// relay (relay.Config{Publisher: p}). A stream binding
// "outbox.event.order.>" must exist; the publisher creates none.
func ExampleNewPublisher() {
	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.MaxReconnects(-1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	p, err := natspub.NewPublisher(natspub.Config{Conn: nc})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	_ = relay.Config{Publisher: p}
}

// ExampleDefaultSubject shows where one aggregate's events go.
func ExampleDefaultSubject() {
	fmt.Println(natspub.DefaultSubject(relay.Message{AggregateType: "order", AggregateID: "o-17"}))
	fmt.Println(natspub.DefaultSubject(relay.Message{AggregateType: "order", AggregateID: "eu.customer 42/ü"}))
	// Output:
	// outbox.event.order.o-17
	// outbox.event.order.eu%2Ecustomer%2042%2F%C3%BC
}
