package main

import (
	"math"
	"slices"
	"sort"
	"strconv"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// spread is min / median / max of repeated measurements.
type spread struct{ Min, Med, Max float64 }

func summarize(xs []float64) spread {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return spread{math.NaN(), math.NaN(), math.NaN()}
	}
	sort.Float64s(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{v[0], med, v[len(v)-1]}
}

// exactQuantile is the nearest-rank quantile of sorted samples.
func exactQuantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

// --- histograms -------------------------------------------------------------

// bucket is one cumulative histogram bucket: count of observations <= LE.
type bucket struct {
	LE    float64 // +Inf for the last
	Count float64
}

// histogram reads a Prometheus histogram's cumulative buckets, sorted by le.
func histogram(ss []testkit.Sample, name string) []bucket {
	var bs []bucket
	for _, s := range ss {
		if s.Name != name+"_bucket" {
			continue
		}
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, s.Value})
	}
	slices.SortFunc(bs, func(a, b bucket) int {
		switch {
		case a.LE < b.LE:
			return -1
		case a.LE > b.LE:
			return 1
		}
		return 0
	})
	return bs
}

// histDelta is after - before, bucket by bucket (same layout; a bucket missing
// from before counts as 0).
func histDelta(before, after []bucket) []bucket {
	prev := map[float64]float64{}
	for _, b := range before {
		prev[b.LE] = b.Count
	}
	out := make([]bucket, len(after))
	for i, b := range after {
		out[i] = bucket{b.LE, b.Count - prev[b.LE]}
	}
	return out
}

// histQuantile computes the q-quantile of cumulative buckets the way
// Prometheus' histogram_quantile does: find the bucket holding rank q*count
// and interpolate linearly inside it (the lowest bucket starts at 0); a
// quantile that falls in the +Inf bucket is the highest finite upper bound.
func histQuantile(q float64, bs []bucket) float64 {
	if len(bs) < 2 || !math.IsInf(bs[len(bs)-1].LE, 1) {
		return math.NaN()
	}
	total := bs[len(bs)-1].Count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	i := sort.Search(len(bs)-1, func(i int) bool { return bs[i].Count >= rank })
	if i == len(bs)-1 {
		return bs[len(bs)-2].LE
	}
	if i == 0 && bs[0].LE <= 0 {
		return bs[0].LE
	}
	start, prevCount := 0.0, 0.0
	if i > 0 {
		start, prevCount = bs[i-1].LE, bs[i-1].Count
	}
	end := bs[i].LE
	in := bs[i].Count - prevCount
	if in <= 0 {
		return end
	}
	return start + (end-start)*(rank-prevCount)/in
}

// histMax is the upper bound of the highest non-empty bucket (+Inf when
// something landed above the highest finite bound).
func histMax(bs []bucket) float64 {
	prev := 0.0
	hi := math.NaN()
	for _, b := range bs {
		if b.Count-prev > 0 {
			hi = b.LE
		}
		prev = b.Count
	}
	return hi
}

func histCount(bs []bucket) float64 {
	if len(bs) == 0 {
		return 0
	}
	return bs[len(bs)-1].Count
}
