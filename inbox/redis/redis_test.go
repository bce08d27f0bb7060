package inboxredis_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	inboxredis "github.com/sqloutbox/outbox/inbox/redis"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// redisAddr is the Redis the tests use: OUTBOX_TEST_REDIS or 127.0.0.1:6379.
func redisAddr() string {
	if a := os.Getenv("OUTBOX_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// client returns a client on addr after checking Redis answers (skipping,
// or failing under OUTBOX_TEST_REQUIRE, when it does not).
func client(t testing.TB, addr string, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := redis.NewClient(&redis.Options{Addr: redisAddr()}).Ping(ctx).Err(); err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("Redis required (OUTBOX_TEST_REQUIRE is set) but unavailable at %s: %v", redisAddr(), err)
		}
		t.Skipf("SKIP: no Redis at %s (%v); set OUTBOX_TEST_REDIS or start one", redisAddr(), err)
	}
	return c
}

// prefix is a key prefix of the test's own, its keys deleted at cleanup.
func prefix(t testing.TB, c *redis.Client) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	p := "inboxtest:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := c.Keys(ctx, p+"*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
	})
	return p
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer c.Close()
	for name, f := range map[string]func() (*inboxredis.Filter, error){
		"NilClient":   func() (*inboxredis.Filter, error) { return inboxredis.New(nil) },
		"EmptyPrefix": func() (*inboxredis.Filter, error) { return inboxredis.New(c, inboxredis.WithPrefix("")) },
		"ShortExpiry": func() (*inboxredis.Filter, error) { return inboxredis.New(c, inboxredis.WithExpiry(time.Millisecond)) },
	} {
		if _, err := f(); !errors.Is(err, inboxredis.ErrInvalidConfig) {
			t.Fatalf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestSeenMark: Seen is false until Mark; the key carries the expiry;
// consumers and IDs containing ":" do not collide.
func TestSeenMark(t *testing.T) {
	t.Parallel()
	c := client(t, redisAddr())
	ctx := context.Background()
	f, err := inboxredis.New(c, inboxredis.WithPrefix(prefix(t, c)), inboxredis.WithExpiry(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ consumer, id string }{{"a", "b:c"}, {"a:b", "c"}} {
		if seen, err := f.Seen(ctx, tc.consumer, tc.id); err != nil || seen {
			t.Fatalf("Seen(%q, %q) before Mark = %v, %v", tc.consumer, tc.id, seen, err)
		}
		if err := f.Mark(ctx, tc.consumer, tc.id); err != nil {
			t.Fatal(err)
		}
		if seen, err := f.Seen(ctx, tc.consumer, tc.id); err != nil || !seen {
			t.Fatalf("Seen(%q, %q) after Mark = %v, %v", tc.consumer, tc.id, seen, err)
		}
		ttl, err := c.TTL(ctx, f.Key(tc.consumer, tc.id)).Result()
		if err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
			t.Fatalf("TTL %v, %v; want about an hour", ttl, err)
		}
	}
	if f.Key("a", "b:c") == f.Key("a:b", "c") {
		t.Fatal("keys collide")
	}
}

// env is a PostgreSQL (or other target) database with an inbox using the
// filter, and a business table counting effects.
type env struct {
	ctx     context.Context
	db      *sql.DB
	in      *inbox.Inbox
	f       *inboxredis.Filter
	effects string
	ph      func(int) string
}

func newEnv(t *testing.T, tg testdb.Target, c *redis.Client, p string, opts ...inboxredis.Option) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	e := testdb.New(t, tg, driver.Config{})
	f, err := inboxredis.New(c, append([]inboxredis.Option{inboxredis.WithPrefix(p)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: e.Q("inbox_message"), Consumer: "shipping", Filter: f})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx, e.DB); err != nil {
		t.Fatal(err)
	}
	v := &env{ctx: ctx, db: e.DB, in: in, f: f, effects: e.Q("effects"), ph: e.Placeholder}
	if _, err := e.DB.ExecContext(ctx, "CREATE TABLE "+v.effects+" (id VARCHAR(100) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *env) apply(id string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (id) VALUES (%s)", v.effects, v.ph(1)), id)
		return err
	}
}

func (v *env) effectCount(t *testing.T, id string) int {
	t.Helper()
	var n int
	if err := v.db.QueryRowContext(v.ctx, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE id = %s", v.effects, v.ph(1)), id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func must(t *testing.T, out inbox.Outcome, err error, want inbox.Outcome) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if out != want {
		t.Fatalf("outcome %v, want %v", out, want)
	}
}

var targets = []testdb.Target{{Name: "pgx", Dialect: driver.Postgres}, {Name: "mysql", Dialect: driver.MySQL}, {Name: "sqlite", Dialect: driver.SQLite}}

// TestFilterInFrontOfTheTable: a marked message is skipped without a
// transaction (the database is closed and still the answer is Duplicate);
// the key is written only after the commit (a failed handler leaves none);
// a key deleted by hand falls back to the table (Duplicate, no second
// effect) and is written again.
func TestFilterInFrontOfTheTable(t *testing.T) {
	t.Parallel()
	for _, tg := range targets {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			c := client(t, redisAddr())
			v := newEnv(t, tg, c, prefix(t, c))
			boom := errors.New("boom")
			if _, err := v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-1"}, func(context.Context, *sql.Tx) error { return boom }); !errors.Is(err, boom) {
				t.Fatal(err)
			}
			if n, _ := c.Exists(v.ctx, v.f.Key("shipping", "m-1")).Result(); n != 0 {
				t.Fatal("key written for a message whose handler failed")
			}
			out, err := v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-1"}, v.apply("m-1"))
			must(t, out, err, inbox.Applied)
			if n, _ := c.Exists(v.ctx, v.f.Key("shipping", "m-1")).Result(); n != 1 {
				t.Fatal("no key after the commit")
			}
			// Lost key: the table decides.
			if err := c.Del(v.ctx, v.f.Key("shipping", "m-1")).Err(); err != nil {
				t.Fatal(err)
			}
			out, err = v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-1"}, v.apply("m-1"))
			must(t, out, err, inbox.Duplicate)
			if n, _ := c.Exists(v.ctx, v.f.Key("shipping", "m-1")).Result(); n != 1 {
				t.Fatal("key not written again after the table found the duplicate")
			}
			if st := v.in.Stats(); st.FilterHits != 0 || st.Duplicates != 1 {
				t.Fatalf("stats %+v", st)
			}
			if v.effectCount(t, "m-1") != 1 {
				t.Fatal("applied twice")
			}
			// With the key present no transaction is begun: a closed pool
			// still answers Duplicate.
			closed, err := sql.Open("sqlite", "file::memory:")
			if err != nil {
				t.Fatal(err)
			}
			closed.Close()
			out, err = v.in.Handle(v.ctx, closed, inbox.Message{ID: "m-1"}, v.apply("m-1"))
			must(t, out, err, inbox.Duplicate)
			if st := v.in.Stats(); st.FilterHits != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestRedisOutage: with Redis unreachable (every connection through a
// proxy cut and refused) Handle falls back to the table: a processed
// message is still a Duplicate, a new one applies once, nothing fails;
// after Redis returns the filter works again.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	client(t, redisAddr()) // skip without Redis
	px, err := faultproxy.Start(redisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	c := client(t, px.Addr())
	direct := client(t, redisAddr())
	p := prefix(t, direct)
	// A breaker that never trips here (TestBreakerBoundsAnOutage tests it).
	v := newEnv(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, c, p, inboxredis.WithBreaker(1000, time.Millisecond))
	out, err := v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-1"}, v.apply("m-1"))
	must(t, out, err, inbox.Applied)

	px.Refuse(true)
	px.CutAll()
	if _, err := v.f.Seen(v.ctx, "shipping", "m-1"); err == nil {
		t.Fatal("Seen succeeded through a refusing proxy")
	}
	out, err = v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-1"}, v.apply("m-1"))
	must(t, out, err, inbox.Duplicate)
	out, err = v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-2"}, v.apply("m-2"))
	must(t, out, err, inbox.Applied)
	out, err = v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-2"}, v.apply("m-2"))
	must(t, out, err, inbox.Duplicate)
	if v.effectCount(t, "m-1") != 1 || v.effectCount(t, "m-2") != 1 {
		t.Fatal("an outage caused a double effect")
	}
	if st := v.in.Stats(); st.FilterErrors < 3 || st.FilterHits != 0 {
		t.Fatalf("stats %+v: want Seen and Mark errors counted", st)
	}
	// m-2's key could not be written during the outage.
	if n, _ := direct.Exists(v.ctx, v.f.Key("shipping", "m-2")).Result(); n != 0 {
		t.Fatal("key written through a refusing proxy?")
	}

	px.Refuse(false)
	out, err = v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-2"}, v.apply("m-2"))
	must(t, out, err, inbox.Duplicate) // the table; the key is written now
	out, err = v.in.Handle(v.ctx, v.db, inbox.Message{ID: "m-2"}, v.apply("m-2"))
	must(t, out, err, inbox.Duplicate)
	if st := v.in.Stats(); st.FilterHits != 1 {
		t.Fatalf("stats %+v: want one filter hit after Redis returned", st)
	}
}

// TestBreakerBoundsAnOutage: a client with go-redis's default retries
// (DialerRetries 5, MaxRetries 3) against a refusing Redis. After
// DefaultTripAfter failed calls the breaker opens: Seen and Mark fail with
// ErrUnavailable and no connection is even attempted (the proxy's refused
// count stands still over 20 more messages), while the table keeps
// deciding. With a short cooldown, a probe after Redis returns closes it.
func TestBreakerBoundsAnOutage(t *testing.T) {
	t.Parallel()
	client(t, redisAddr()) // skip without Redis
	px, err := faultproxy.Start(redisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	defaults := func(o *redis.Options) { o.MaxRetries, o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 0, 0, 0, 0 }
	c := client(t, px.Addr(), defaults)
	p := prefix(t, client(t, redisAddr()))
	v := newEnv(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, c, p, inboxredis.WithBreaker(inboxredis.DefaultTripAfter, time.Hour))
	px.Refuse(true)
	for i := 0; !v.f.Open(); i++ {
		if i == inboxredis.DefaultTripAfter {
			t.Fatalf("breaker still closed after %d failed messages", i)
		}
		out, err := v.in.Handle(v.ctx, v.db, inbox.Message{ID: fmt.Sprintf("trip-%d", i)}, v.apply(fmt.Sprintf("trip-%d", i)))
		must(t, out, err, inbox.Applied)
	}
	refused := px.Refused.Load()
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("open-%d", i)
		out, err := v.in.Handle(v.ctx, v.db, inbox.Message{ID: id}, v.apply(id))
		must(t, out, err, inbox.Applied)
	}
	if _, err := v.f.Seen(v.ctx, "shipping", "x"); !errors.Is(err, inboxredis.ErrUnavailable) {
		t.Fatalf("Seen with the breaker open = %v, want ErrUnavailable", err)
	}
	if n := px.Refused.Load(); n != refused {
		t.Fatalf("%d connection attempts while the breaker was open, want 0", n-refused)
	}

	// Recovery, on a filter with a short cooldown.
	w := newEnv(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, c, p, inboxredis.WithBreaker(1, 20*time.Millisecond))
	if _, err := w.f.Seen(w.ctx, "shipping", "x"); err == nil || !w.f.Open() {
		t.Fatalf("Seen through a refusing proxy = %v, open %v; want an error and the breaker open", err, w.f.Open())
	}
	px.Refuse(false)
	testdb.Eventually(t, w.ctx, "the breaker closed after Redis returned", func() bool {
		_, err := w.f.Seen(w.ctx, "shipping", "x")
		return err == nil && !w.f.Open()
	})
}

// TestBatchMarksInOnePipeline: after HandleBatch commits, every applied
// (and duplicate) message's key exists, written through MarkAll; a
// redelivery is then a filter hit, without a transaction. A failed
// message gets no key.
func TestBatchMarksInOnePipeline(t *testing.T) {
	t.Parallel()
	c := client(t, redisAddr())
	v := newEnv(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, c, prefix(t, c))
	msgs := []inbox.Message{{ID: "b-1"}, {ID: "b-2"}, {ID: "b-3"}}
	res, err := v.in.HandleBatch(v.ctx, v.db, msgs, func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if m.ID == "b-2" {
			return errors.New("b-2 fails")
		}
		return v.apply(m.ID)(ctx, tx)
	})
	if err != nil || res[0].Outcome != inbox.Applied || res[1].Err == nil || res[2].Outcome != inbox.Applied {
		t.Fatalf("HandleBatch = %+v, %v", res, err)
	}
	for id, want := range map[string]int64{"b-1": 1, "b-2": 0, "b-3": 1} {
		if n, _ := c.Exists(v.ctx, v.f.Key("shipping", id)).Result(); n != want {
			t.Fatalf("%s: key exists %d, want %d", id, n, want)
		}
	}
	out, err := v.in.Handle(v.ctx, v.db, inbox.Message{ID: "b-3"}, v.apply("b-3"))
	must(t, out, err, inbox.Duplicate)
	if st := v.in.Stats(); st.FilterHits != 1 || st.FilterErrors != 0 {
		t.Fatalf("stats %+v: want one filter hit", st)
	}
}
