package main

import "testing"

func TestGCTuning(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		env                  map[string]string
		maxBytes             int64
		percent              int
		setPercent, setLimit bool
		limit                int64
	}{
		{name: "defaults", maxBytes: 64 << 20, percent: 400, setPercent: true, limit: 96 << 20, setLimit: true},
		{name: "limit follows inflight.max_bytes", maxBytes: 1 << 30, percent: 400, setPercent: true, limit: 1<<30 + 32<<20, setLimit: true},
		{name: "GOGC set", env: map[string]string{"GOGC": "100"}, maxBytes: 64 << 20, percent: 400, limit: 96 << 20, setLimit: true},
		{name: "GOMEMLIMIT set", env: map[string]string{"GOMEMLIMIT": "1GiB"}, maxBytes: 64 << 20, percent: 400, setPercent: true, limit: 96 << 20},
		{name: "both set", env: map[string]string{"GOGC": "off", "GOMEMLIMIT": "1GiB"}, maxBytes: 64 << 20, percent: 400, limit: 96 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, sp, l, sl := gcTuning(tc.maxBytes, func(k string) string { return tc.env[k] })
			if p != tc.percent || sp != tc.setPercent || l != tc.limit || sl != tc.setLimit {
				t.Errorf("gcTuning(%d) = %d %v %d %v, want %d %v %d %v", tc.maxBytes, p, sp, l, sl, tc.percent, tc.setPercent, tc.limit, tc.setLimit)
			}
		})
	}
}
