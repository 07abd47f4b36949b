package testkit

import (
	"slices"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, tt := range []struct {
		expr string
		want []string
	}{
		{`max by (job) (outbox_relay_lag_seconds{job="outbox-relay"}) > 30`, []string{"outbox_relay_lag_seconds"}},
		{`histogram_quantile(0.99, sum by (job, le) (rate(outbox_relay_commit_to_ack_seconds_bucket{job="x"}[5m]))) > 5`,
			[]string{"outbox_relay_commit_to_ack_seconds_bucket"}},
		{`a_bytes > 256 * 1024 * 1024 and deriv(b_bytes[10m]) > 0`, []string{"a_bytes", "b_bytes"}},
		{"outbox_relay_ready == 0\nunless on (job, instance) outbox_relay_leader == 0", []string{"outbox_relay_leader", "outbox_relay_ready"}},
		{`count by (job) (up{job="outbox-relay"} == 1) < 2`, []string{"up"}},
		{`sum without (instance) (rate(foo_total[5m] offset 1h)) / ignoring (x) group_left (y) bar`, []string{"bar", "foo_total"}},
		{`x{a="} by (y) {", b='z'} or absent(x{c=~"$job"})`, []string{"x"}},
		{`sum(rate(c_total{job="$job",instance=~"$instance"}[$__rate_interval])) > bool 1e3`, []string{"c_total"}},
		{`label_values(outbox_relay_ready{job="$job"}, instance)`, []string{"outbox_relay_ready"}},
		{`label_values(job)`, nil},
		{`outbox_relay_slot_wal_status{status=~"lost|missing"} == 1 # a comment naming not_a_metric`, []string{"outbox_relay_slot_wal_status"}},
		{`topk(3, m1) + on() vector(1) + time() - m2 @ start()`, []string{"m1", "m2"}},
	} {
		if got := MetricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("MetricNames(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}
