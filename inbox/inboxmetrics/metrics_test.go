package inboxmetrics_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/inboxmetrics"
)

func TestNewRefusesBadLabelsAndTwins(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	for name, labels := range map[string]prometheus.Labels{"none": nil, "empty value": {"consumer": ""}} {
		if _, err := inboxmetrics.New(reg, labels); !errors.Is(err, inboxmetrics.ErrInvalidLabels) {
			t.Errorf("%s: %v, want ErrInvalidLabels", name, err)
		}
	}
	if _, err := inboxmetrics.New(reg, prometheus.Labels{"consumer": "a"}); err != nil {
		t.Fatal(err)
	}
	var are prometheus.AlreadyRegisteredError
	if _, err := inboxmetrics.New(reg, prometheus.Labels{"consumer": "a"}); !errors.As(err, &are) {
		t.Errorf("the same labels twice: %v, want AlreadyRegisteredError", err)
	}
	if _, err := inboxmetrics.New(reg, prometheus.Labels{"consumer": "b"}); err != nil {
		t.Errorf("another consumer: %v", err)
	}
}

// TestCountsOutcomes: each inbox.Observer call moves its own series, with
// the labels given.
func TestCountsOutcomes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := inboxmetrics.New(reg, prometheus.Labels{"consumer": "billing"})
	if err != nil {
		t.Fatal(err)
	}
	var o inbox.Observer = m
	msg := inbox.Message{ID: "m1"}
	o.Applied(msg, 3*time.Millisecond)
	o.Applied(msg, time.Millisecond)
	o.Duplicate(msg)
	o.Held(msg)
	o.Held(msg)
	o.Held(msg)
	o.HandlerFailed(msg, errors.New("x"))
	o.Parked(msg, errors.New("x"))
	want := map[string]float64{inboxmetrics.MetricProcessed: 2, inboxmetrics.MetricDuplicates: 1,
		inboxmetrics.MetricHeld: 3, inboxmetrics.MetricHandlerErrors: 1, inboxmetrics.MetricParked: 1}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			if l := metric.GetLabel(); len(l) != 1 || l[0].GetName() != "consumer" || l[0].GetValue() != "billing" {
				t.Errorf("%s labels %v, want consumer=billing", mf.GetName(), l)
			}
		}
		if w, ok := want[mf.GetName()]; ok {
			seen++
			if got := mf.GetMetric()[0].GetCounter().GetValue(); got != w {
				t.Errorf("%s = %v, want %v", mf.GetName(), got, w)
			}
		}
		if mf.GetName() == inboxmetrics.MetricHandlerDuration {
			if n := mf.GetMetric()[0].GetHistogram().GetSampleCount(); n != 2 {
				t.Errorf("duration samples %d, want 2", n)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("%d of %d counters gathered", seen, len(want))
	}
	if n := testutil.CollectAndCount(m); n != 6 {
		t.Errorf("%d series collected, want 6", n)
	}
}
