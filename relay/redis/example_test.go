package redispub_test

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/relay"
	redispub "github.com/sqloutbox/outbox/relay/redis"
)

// ExampleNewPublisher builds the publisher for a relay
// (relay.Config{Publisher: p}). ContextTimeoutEnabled makes go-redis
// honour Publish's deadline; MaxRetries -1 leaves retries to the relay.
func ExampleNewPublisher() {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	p, err := redispub.NewPublisher(redispub.Config{Client: c})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	_ = relay.Config{Publisher: p}
}

// ExampleDefaultStream shows where one aggregate type's events go.
func ExampleDefaultStream() {
	fmt.Println(redispub.DefaultStream(relay.Message{AggregateType: "order", AggregateID: "o-17"}))
	fmt.Println(redispub.DefaultStream(relay.Message{AggregateType: "order", AggregateID: "o-17", Topic: "orders"}))
	// Output:
	// outbox.event.order
	// orders
}
