package relay_test

import (
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestPostgresClaimsOnOneSession: the PostgreSQL claim runs on one
// connection of the relay's pool for the relay's lifetime, while mark-sent
// and the lease heartbeats use the other. Issue 34: claims from the pool
// ran on whichever connection was free, and the first claim on the second
// one (its session compiles the claim function and plans its statements)
// took 35-128 ms among claims of 0.6 ms, and held up every event
// committed meanwhile. A sampler reads, every millisecond, which of the
// relay pool's sessions last ran the claim; with 8 writers the marks
// overlap the claims, so both connections are in use. The relay's pool
// has three connections: one pinned, two left (claimconn.go's
// minUnpinned).
func TestPostgresClaimsOnOneSession(t *testing.T) {
	t.Parallel()
	for _, tg := range append(testdb.All, testdb.PgxSimple) {
		if tg.Dialect != driver.Postgres {
			continue
		}
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			e.RelayDB.SetMaxOpenConns(3)
			b := setupOn(t, e, nil)
			mon, err := sql.Open("pgx", testdb.PostgresDSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer mon.Close()
			claim := strings.ReplaceAll(b.e.Table, `"`, "") + "_claim("
			var mu sync.Mutex
			pids := map[int]bool{}
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					select {
					case <-stop:
						return
					default:
					}
					rows, err := mon.QueryContext(b.ctx, "SELECT pid FROM pg_stat_activity WHERE strpos(replace(query, '\"', ''), $1) > 0 AND pid <> pg_backend_pid()", claim)
					if err != nil {
						return
					}
					for rows.Next() {
						var pid int
						if rows.Scan(&pid) == nil {
							mu.Lock()
							pids[pid] = true
							mu.Unlock()
						}
					}
					rows.Close()
					time.Sleep(time.Millisecond)
				}
			}()
			var wg sync.WaitGroup
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 60; i++ {
						ctx := outbox.NewContext(b.ctx)
						tx, err := b.e.DB.BeginTx(ctx, nil)
						if err == nil {
							if err = outbox.Emit(ctx, event(fmt.Sprintf("w%d", w), i)); err == nil {
								err = tx.Commit()
							} else {
								_ = tx.Rollback()
							}
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if _, err := b.pub.WaitForCount(b.ctx, 480); err != nil {
				t.Fatal(err)
			}
			close(stop)
			<-sampled
			mu.Lock()
			defer mu.Unlock()
			if len(pids) != 1 {
				t.Errorf("the claim ran on %d sessions (%v), want 1", len(pids), pids)
			}
		})
	}
}

// TestRunOpensItsConnectionsBeforeItsFirstClaim: on PostgreSQL the relay
// opens, before its first claim, the connections its mark-sent and
// heartbeats use beside its claim connection. Opened on demand, the first
// mark-sent's connection queued behind every connection the application
// opened at the same moment: in issue 34's exactly-once benchmark (32
// writers starting with the relay) it waited 0.9-1.2 s for it, and the
// relay, which waits for a batch's mark before it records the next one,
// stalled that long (p99 1.0-1.2 s against 0.19-0.24 s with the
// connections opened at start).
func TestRunOpensItsConnectionsBeforeItsFirstClaim(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[0], driver.Config{})
	e.RelayDB.SetMaxOpenConns(0) // unbounded, as a pool is by default
	b := setupOn(t, e, nil)
	eventually(t, b.ctx, "the relay ready", func() bool { return b.r.Ready() == nil })
	// The claim connection, and two more opened together and put back.
	if st := e.RelayDB.Stats(); st.OpenConnections < 3 {
		t.Errorf("the relay's pool holds %d connections once the relay is ready, want its claim connection and two more", st.OpenConnections)
	}
}
