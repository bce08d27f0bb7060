module github.com/sqloutbox/outbox/relay/rabbitmq

go 1.26.0

require (
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/sqloutbox/outbox v0.0.0
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.13.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/sqloutbox/outbox => ../../
