package main

import (
	"bufio"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// mmm is min / median / max of repeated measurements.
type mmm struct{ Min, Med, Max float64 }

func summarize(xs []float64) mmm {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return mmm{math.NaN(), math.NaN(), math.NaN()}
	}
	sort.Float64s(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return mmm{v[0], med, v[len(v)-1]}
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

// --- Prometheus text exposition ------------------------------------------

// sample is one line of the text exposition format.
type sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// parseProm reads the text exposition format (what /metrics serves). It
// handles what client_golang writes: name{k="v",...} value [timestamp].
func parseProm(r io.Reader) []sample {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{Labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
			s.Name = line[:i]
			j := i + 1
			for j < len(line) && line[j] != '}' {
				k := j
				for k < len(line) && line[k] != '=' {
					k++
				}
				if k+1 >= len(line) || line[k+1] != '"' {
					break
				}
				name := strings.TrimLeft(line[j:k], ", ")
				var val strings.Builder
				m := k + 2
				for ; m < len(line) && line[m] != '"'; m++ {
					if line[m] == '\\' && m+1 < len(line) {
						m++
						switch line[m] {
						case 'n':
							val.WriteByte('\n')
						default:
							val.WriteByte(line[m])
						}
						continue
					}
					val.WriteByte(line[m])
				}
				s.Labels[name] = val.String()
				j = m + 1
				for j < len(line) && line[j] == ',' {
					j++
				}
			}
			rest = strings.TrimSpace(line[min(j+1, len(line)):])
		} else if i >= 0 {
			s.Name = line[:i]
			rest = strings.TrimSpace(line[i:])
		} else {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.Value = v
		out = append(out, s)
	}
	return out
}

// value sums every series of a metric whose labels include match.
func value(ss []sample, name string, match map[string]string) (float64, bool) {
	sum, found := 0.0, false
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			sum += s.Value
			found = true
		}
	}
	return sum, found
}

// --- histograms -------------------------------------------------------------

// bucket is one cumulative histogram bucket: count of observations <= LE.
type bucket struct {
	LE    float64 // +Inf for the last
	Count float64
}

// histogram reads a Prometheus histogram's cumulative buckets, sorted by le.
func histogram(ss []sample, name string) []bucket {
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
