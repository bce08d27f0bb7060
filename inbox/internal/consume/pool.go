package consume

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/internal/failpoint"
)

// ErrStopped is returned by Pool.Submit once the pool is stopping.
var ErrStopped = errors.New("consume: pool stopped")

// Pool runs deliveries through an Engine on a fixed number of workers.
// A delivery goes to the worker of its aggregate (a hash of aggregate
// type and ID), which handles its deliveries one after another (or in
// batches, with Settings.BatchSize) in the order they were submitted: so
// an aggregate submitted in order is applied in order, while different
// aggregates run in parallel. Each delivery's Ack is called by its worker
// right after its outcome is stored, never before, and never for a
// delivery whose outcome was not stored (stopped first): the broker
// delivers that one again.
type Pool struct {
	e       *Engine
	seed    maphash.Seed
	workers []chan *Delivery
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

// NewPool starts workers workers (at least 1), each with a queue of
// queue deliveries (at least 1) for Submit to fill.
func (e *Engine) NewPool(workers, queue int) *Pool {
	workers, queue = max(workers, 1), max(queue, 1)
	p := &Pool{e: e, seed: maphash.MakeSeed(), stop: make(chan struct{})}
	for range workers {
		ch := make(chan *Delivery, queue)
		p.workers = append(p.workers, ch)
		p.wg.Add(1)
		go p.run(ch)
	}
	return p
}

// Submit queues d on its aggregate's worker, waiting while that queue is
// full. It returns ctx's error or ErrStopped if it could not queue it (d
// is then not acknowledged).
func (p *Pool) Submit(ctx context.Context, d *Delivery) error {
	var h maphash.Hash
	h.SetSeed(p.seed)
	h.WriteString(d.Msg.AggregateType)
	h.WriteByte(0)
	h.WriteString(d.Msg.AggregateID)
	ch := p.workers[h.Sum64()%uint64(len(p.workers))]
	select {
	case <-p.stop:
		return ErrStopped
	default:
	}
	select {
	case ch <- d:
		return nil
	case <-p.stop:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop stops the workers and waits for them: a worker finishes the
// delivery or batch in progress (a handler is never interrupted; its
// retry waits are), acknowledges what it stored, and leaves the rest of
// its queue unacknowledged.
func (p *Pool) Stop() {
	p.once.Do(func() { close(p.stop) })
	p.wg.Wait()
}

func (p *Pool) stopped() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

func (p *Pool) run(ch chan *Delivery) {
	defer p.wg.Done()
	size := p.e.s.BatchSize
	for {
		var d *Delivery
		select {
		case <-p.stop:
			return
		case d = <-ch:
		}
		if p.stopped() {
			return
		}
		if size < 2 {
			if p.e.Process(p.stop, d, 0, nil) {
				failpoint.Inject(p.e.s.AfterStore)
				ack(d)
			}
			continue
		}
		batch := p.collect(ch, d, size)
		n, _ := p.e.ProcessBatch(p.stop, batch)
		if n > 0 {
			failpoint.Inject(p.e.s.AfterStore)
		}
		for _, d := range batch[:n] {
			ack(d)
		}
	}
}

// collect returns first and what else is queued, up to size, waiting up
// to BatchLinger for more when fewer are queued.
func (p *Pool) collect(ch chan *Delivery, first *Delivery, size int) []*Delivery {
	batch := []*Delivery{first}
	var linger <-chan time.Time
	for len(batch) < size {
		select {
		case d := <-ch:
			batch = append(batch, d)
			continue
		default:
		}
		if linger == nil {
			t := time.NewTimer(p.e.s.BatchLinger)
			defer t.Stop()
			linger = t.C
		}
		select {
		case d := <-ch:
			batch = append(batch, d)
			continue
		case <-linger:
		case <-p.stop:
		}
		break
	}
	return batch
}

func ack(d *Delivery) {
	if d.Ack != nil {
		d.Ack()
	}
}
