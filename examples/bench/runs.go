package main

import (
	"reflect"
	"sort"
)

// medianOf returns a copy of runs[0] in which every float64 and int field
// is the median of that field over runs (the lower middle for an even
// count, so it is one run's value); other fields are runs[0]'s. Each
// figure's median is taken on its own: the result is not any one run.
func medianOf[T any](runs []T) T {
	out := runs[0]
	v := reflect.ValueOf(&out).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.Float64:
			xs := make([]float64, len(runs))
			for j := range runs {
				xs[j] = reflect.ValueOf(runs[j]).Field(i).Float()
			}
			sort.Float64s(xs)
			f.SetFloat(xs[(len(xs)-1)/2])
		case reflect.Int, reflect.Int64:
			xs := make([]int64, len(runs))
			for j := range runs {
				xs[j] = reflect.ValueOf(runs[j]).Field(i).Int()
			}
			sort.Slice(xs, func(a, b int) bool { return xs[a] < xs[b] })
			f.SetInt(xs[(len(xs)-1)/2])
		}
	}
	return out
}

// medianLatency returns the per-point, per-figure medians of runs (which
// all offered the same loads), with Run 0 and Runs len(runs).
func medianLatency(runs []*LatencyResult) *LatencyResult {
	if len(runs) == 0 {
		return nil
	}
	m := *runs[0]
	m.Run, m.Runs, m.TableState, m.TableStateAfter = 0, len(runs), nil, nil
	m.Points = make([]LatencyPoint, len(runs[0].Points))
	for i := range m.Points {
		ps := make([]LatencyPoint, len(runs))
		for j, r := range runs {
			ps[j] = r.Points[i]
		}
		m.Points[i] = medianOf(ps)
	}
	return &m
}

// medianDrain returns the per-figure medians of runs (one variant), with
// Run 0, Runs len(runs) and no table state.
func medianDrain(runs []*DrainResult) *DrainResult {
	if len(runs) == 0 {
		return nil
	}
	vs := make([]DrainResult, len(runs))
	for i, r := range runs {
		vs[i] = *r
	}
	m := medianOf(vs)
	m.Run, m.Runs, m.TableState, m.TableStateAfter = 0, len(runs), nil, nil
	return &m
}
