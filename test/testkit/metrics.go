package testkit

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// Sample is one line of the Prometheus text exposition format.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// ParseMetrics reads the text exposition format (what /metrics serves). It
// handles what client_golang writes: name{k="v",...} value [timestamp].
func ParseMetrics(r io.Reader) []Sample {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := Sample{Labels: map[string]string{}}
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

// SumMetric sums every series of a metric whose labels include match.
func SumMetric(ss []Sample, name string, match map[string]string) (float64, bool) {
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
