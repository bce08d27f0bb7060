package emit

import (
	"context"
	"strconv"
	"testing"
)

// benchPayload is a ~200-byte JSON document.
var benchPayload = []byte(`{"order_id":"ord-000042","customer_id":"cus-7731","currency":"EUR","total_cents":129900,` +
	`"items":[{"sku":"SKU-1","qty":1,"price_cents":99900},{"sku":"SKU-2","qty":2,"price_cents":15000}],"paid":true}`)

func benchEvent() Event {
	return Event{
		AggregateType: "order",
		AggregateID:   "ord-000042",
		Type:          "order.paid",
		Payload:       benchPayload,
	}
}

func BenchmarkEmit(b *testing.B) {
	if n := len(benchPayload); n < 180 || n > 220 {
		b.Fatalf("bench payload is %d bytes, want ~200", n)
	}
	e := benchEvent()

	// One transaction per event: Begin, Emit, Take.
	b.Run("FreshBatch", func(b *testing.B) {
		ctx := NewContext(context.Background())
		s := FromContext(ctx)
		b.ReportAllocs()
		b.SetBytes(int64(len(benchPayload)))
		for b.Loop() {
			batch := s.Begin(Limits{})
			if err := Emit(ctx, e); err != nil {
				b.Fatal(err)
			}
			batch.Take()
		}
	})

	// Many events per transaction (1,000), generated IDs.
	b.Run("ReuseBatch", func(b *testing.B) {
		ctx := NewContext(context.Background())
		s := FromContext(ctx)
		batch := s.Begin(Limits{})
		b.ReportAllocs()
		b.SetBytes(int64(len(benchPayload)))
		i := 0
		for b.Loop() {
			if err := Emit(ctx, e); err != nil {
				b.Fatal(err)
			}
			if i++; i%1000 == 0 {
				batch.Take()
				batch = s.Begin(Limits{})
			}
		}
		batch.Take()
	})

	// Many events per transaction with caller-supplied IDs (duplicate check).
	b.Run("ReuseBatchSuppliedID", func(b *testing.B) {
		ids := make([]string, 1000)
		for i := range ids {
			ids[i] = "msg-" + strconv.Itoa(i)
		}
		ctx := NewContext(context.Background())
		s := FromContext(ctx)
		batch := s.Begin(Limits{})
		b.ReportAllocs()
		b.SetBytes(int64(len(benchPayload)))
		i := 0
		for b.Loop() {
			e := e
			e.ID = ids[i]
			if err := Emit(ctx, e); err != nil {
				b.Fatal(err)
			}
			if i++; i == len(ids) {
				i = 0
				batch.Take()
				batch = s.Begin(Limits{})
			}
		}
		batch.Take()
	})
}

func BenchmarkPrepare(b *testing.B) {
	limits := Limits{}.WithDefaults()
	cases := []struct {
		name string
		ev   Event
	}{
		{"GeneratedID", benchEvent()},
		{"SuppliedID", func() Event { e := benchEvent(); e.ID = "msg-0001"; return e }()},
		{"Headers", func() Event {
			e := benchEvent()
			e.ID = "msg-0001"
			e.Headers = map[string]string{"trace-id": "4bf92f3577b34da6a3ce929d0e0e4736", "tenant": "acme", "schema": "v3"}
			return e
		}()},
		{"Raw64KiB", func() Event {
			e := benchEvent()
			e.ID = "msg-0001"
			e.ContentType = "application/octet-stream"
			e.Payload = make([]byte, 64<<10)
			return e
		}()},
		{"JSON64KiB", func() Event {
			e := benchEvent()
			e.ID = "msg-0001"
			p := make([]byte, 64<<10)
			for i := range p {
				p[i] = 'a'
			}
			p[0], p[len(p)-1] = '"', '"'
			e.Payload = p
			return e
		}()},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.ev.Payload)))
			for b.Loop() {
				e := c.ev
				if _, err := prepare(&e, limits); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
