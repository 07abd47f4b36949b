package replay

import (
	"context"
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func parse(args ...string) (Options, error) {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	get := Bind(fs)
	if err := fs.Parse(args); err != nil {
		return Options{}, err
	}
	return get()
}

func TestFlags(t *testing.T) {
	day := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		args    []string
		want    Options
		wantErr []string // each must be in the error
	}{
		{"since date", []string{"--since", "2026-01-02"}, Options{Since: day}, nil},
		{"since rfc3339 offset", []string{"--since", "2026-01-02T03:00:00+02:00"}, Options{Since: day.Add(time.Hour)}, nil},
		{"from-id to-id", []string{"--from-id", "5", "--to-id", "9"}, Options{FromID: 5, ToID: 9}, nil},
		{"since until types rate", []string{"--since", "2026-01-02", "--until", "2026-01-03T00:00:00Z", "--aggregate-type", "order",
			"--event-type", "order.paid", "--rate", "20/s"},
			Options{Since: day, Until: day.Add(24 * time.Hour), AggregateType: "order", EventType: "order.paid", Rate: 20}, nil},
		{"since and to-id", []string{"--since", "2026-01-02", "--to-id", "3"}, Options{Since: day, ToID: 3}, nil},
		{"fractional rate", []string{"--from-id", "1", "--rate", "0.5/s"}, Options{FromID: 1, Rate: 0.5}, nil},
		{"dead letters", []string{"--from-id", "1", "--include-dead-letters"}, Options{FromID: 1, IncludeDeadLetters: true}, nil},
		{"neither", nil, Options{}, []string{"one of --since TIME or --from-id N is required"}},
		{"both starts", []string{"--since", "2026-01-02", "--from-id", "1"}, Options{}, []string{"--since and --from-id exclude each other"}},
		{"both ends", []string{"--from-id", "1", "--until", "2026-01-02", "--to-id", "4"}, Options{}, []string{"--until and --to-id exclude each other"}},
		{"bad time", []string{"--since", "yesterday"}, Options{}, []string{`--since: "yesterday" is neither RFC 3339`}},
		{"bad until", []string{"--from-id", "1", "--until", "2026-02-30"}, Options{}, []string{`--until: "2026-02-30"`}},
		{"bad id", []string{"--from-id", "x"}, Options{}, []string{`--from-id: "x" is not an outbox id`}},
		{"zero id", []string{"--from-id", "0"}, Options{}, []string{`--from-id: "0" is not an outbox id`}},
		{"bad to-id", []string{"--from-id", "1", "--to-id", "-3"}, Options{}, []string{`--to-id: "-3"`}},
		{"empty range ids", []string{"--from-id", "9", "--to-id", "5"}, Options{}, []string{"--to-id 5 is below --from-id 9"}},
		{"empty range times", []string{"--since", "2026-01-02", "--until", "2026-01-02"}, Options{}, []string{"is not after --since"}},
		{"rate without unit", []string{"--from-id", "1", "--rate", "20"}, Options{}, []string{`--rate: "20" is not a rate N/s`}},
		{"rate zero", []string{"--from-id", "1", "--rate", "0/s"}, Options{}, []string{`--rate: "0/s"`}},
		{"empty type", []string{"--from-id", "1", "--aggregate-type", ""}, Options{}, []string{"--aggregate-type: is empty"}},
		{"empty event type", []string{"--from-id", "1", "--event-type", ""}, Options{}, []string{"--event-type: is empty"}},
		{"every problem at once", []string{"--since", "x", "--rate", "y"}, Options{}, []string{"--since:", "--rate:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse(tt.args...)
			if tt.wantErr == nil {
				if err != nil || !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; want %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestQueries(t *testing.T) {
	since := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name           string
		o              Options
		headers        bool
		lo, hi         string
		countWhere     string
		pageWhere      string
		args           []any
		pageHasHeaders bool
	}{
		{"ids", Options{FromID: 3, ToID: 9}, true, "", "", " AND dead_lettered_at IS NULL", " AND dead_lettered_at IS NULL", nil, true},
		{"ids with dead letters", Options{FromID: 3, ToID: 9, IncludeDeadLetters: true}, true, "", "",
			" AND dlq_resolved_at IS NULL", " AND dlq_resolved_at IS NULL", nil, true},
		{"from id to the end", Options{FromID: 3}, false, "", "SELECT max(id) FROM t", " AND dead_lettered_at IS NULL", " AND dead_lettered_at IS NULL", nil, false},
		{"since", Options{Since: since}, true, "SELECT min(id) FROM t WHERE created_at >= $1", "SELECT max(id) FROM t",
			" AND dead_lettered_at IS NULL AND created_at >= $3", " AND dead_lettered_at IS NULL AND created_at >= $4", []any{since}, true},
		{"since until types", Options{Since: since, Until: since.Add(time.Hour), AggregateType: "a", EventType: "e"}, true,
			"SELECT min(id) FROM t WHERE created_at >= $1", "SELECT max(id) FROM t WHERE created_at < $1",
			" AND dead_lettered_at IS NULL AND created_at >= $3 AND created_at < $4 AND aggregate_type = $5 AND event_type = $6",
			" AND dead_lettered_at IS NULL AND created_at >= $4 AND created_at < $5 AND aggregate_type = $6 AND event_type = $7",
			[]any{since, since.Add(time.Hour), "a", "e"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := buildQueries("t", columns{headers: tt.headers}, tt.o)
			if q.lo != tt.lo || q.hi != tt.hi {
				t.Errorf("bounds %q, %q; want %q, %q", q.lo, q.hi, tt.lo, tt.hi)
			}
			if want := "SELECT count(*) FROM t WHERE id >= $1 AND id <= $2" + tt.countWhere; q.count != want {
				t.Errorf("count %q\nwant  %q", q.count, want)
			}
			if want := " WHERE id > $1 AND id <= $2" + tt.pageWhere + " ORDER BY id LIMIT $3"; !strings.HasSuffix(q.page, want) {
				t.Errorf("page %q\nwant suffix %q", q.page, want)
			}
			if strings.Contains(q.page, "OFFSET") || strings.Contains(q.page, "headers::text") != tt.pageHasHeaders {
				t.Errorf("page %q", q.page)
			}
			if !reflect.DeepEqual(q.args, tt.args) {
				t.Errorf("args %v, want %v", q.args, tt.args)
			}
		})
	}
}

// fakeTable serves pages of ids like the page query: id > after, in order.
func fakeTable(ids []int64, calls *[]int64) pageFunc {
	return func(_ context.Context, after int64, limit int) ([]row, error) {
		*calls = append(*calls, after)
		var out []row
		for _, id := range ids {
			if id > after && len(out) < limit {
				out = append(out, row{id: id})
			}
		}
		return out, nil
	}
}

func TestReadPages(t *testing.T) {
	tests := []struct {
		name      string
		ids       []int64
		start     int64
		size      int
		wantCalls []int64 // the "after" of each page query
	}{
		{"empty", nil, 0, 3, []int64{0}},
		{"one short page", []int64{1, 2}, 0, 3, []int64{0}},
		{"exact pages then an empty one", []int64{1, 2, 3, 4, 5, 6}, 0, 3, []int64{0, 3, 6}},
		{"gaps", []int64{2, 5, 9, 10, 40, 41, 100}, 0, 2, []int64{0, 5, 10, 41}},
		{"start inside", []int64{2, 5, 9, 10, 40}, 5, 2, []int64{5, 10}},
		{"page of one", []int64{7, 8, 9}, 0, 1, []int64{0, 7, 8, 9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls, got []int64
			err := readPages(context.Background(), fakeTable(tt.ids, &calls), tt.start, tt.size, func(r row) error {
				got = append(got, r.id)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var want []int64
			for _, id := range tt.ids {
				if id > tt.start {
					want = append(want, id)
				}
			}
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(calls, tt.wantCalls) {
				t.Fatalf("rows %v (want %v), page queries after %v (want %v)", got, want, calls, tt.wantCalls)
			}
		})
	}
}

func TestReadPagesStops(t *testing.T) {
	boom := errors.New("boom")
	var calls []int64
	n := 0
	err := readPages(context.Background(), fakeTable([]int64{1, 2, 3, 4, 5}, &calls), 0, 2, func(r row) error {
		if n++; r.id == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || n != 3 {
		t.Fatalf("err %v after %d rows", err, n)
	}
	backwards := func(context.Context, int64, int) ([]row, error) { return []row{{id: 5}, {id: 4}}, nil }
	if err := readPages(context.Background(), backwards, 0, 2, func(row) error { return nil }); err == nil {
		t.Fatal("rows out of id order accepted")
	}
}

// The token bucket, on a fake clock: count-based, no timing flakiness.
func TestLimiter(t *testing.T) {
	tests := []struct {
		rate    float64
		n       int
		minTime time.Duration // the fake time n waits take at least
		maxTime time.Duration
	}{
		{20, 40, 1950 * time.Millisecond, 1960 * time.Millisecond}, // burst 1: evenly paced
		{20, 1, 0, 0},
		{1000, 1050, 999 * time.Millisecond, 1001 * time.Millisecond}, // burst 50 up front
		{0.5, 3, 4 * time.Second, 4001 * time.Millisecond},
	}
	for _, tt := range tests {
		now := time.Unix(1000, 0)
		l := newLimiter(tt.rate)
		l.last, l.now = now, func() time.Time { return now }
		l.sleep = func(_ context.Context, d time.Duration) error { now = now.Add(d); return nil }
		start := now
		for range tt.n {
			if err := l.wait(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if d := now.Sub(start); d < tt.minTime || d > tt.maxTime {
			t.Errorf("rate %v: %d rows took %s, want %s..%s", tt.rate, tt.n, d, tt.minTime, tt.maxTime)
		}
	}
	if newLimiter(0) != nil {
		t.Error("rate 0 must mean no limiter")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := newLimiter(1).wait(ctx); err != nil { // the burst token is there
		t.Fatal(err)
	}
}

func TestBudget(t *testing.T) {
	b := newBudget(2, 100)
	ctx := context.Background()
	if err := b.acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := b.acquire(short, 60); err == nil { // 120 bytes > 100
		t.Fatal("acquired over the byte limit")
	}
	got := make(chan error, 1)
	go func() { got <- b.acquire(ctx, 60) }()
	b.release(60)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	b.release(60)
	if err := b.acquire(ctx, 1000); err != nil { // one row always fits
		t.Fatal(err)
	}
	b.release(1000)
	if err := b.drained(ctx); err != nil || b.inFlight() != 0 {
		t.Fatal(err, b.inFlight())
	}
}

// The page reads the identity columns when the table has them (migration
// 0006), so a row is republished under the identity the relay streamed it
// with; a table without them reads NULLs: its rows' identity is their id.
func TestPageReadsIdentityColumns(t *testing.T) {
	for _, tt := range []struct {
		cols columns
		want []string
	}{
		{columns{headers: true, eventID: true, replayOf: true},
			[]string{"headers::text AS headers_text, event_id::text AS event_id_text, dlq_replay_of::text AS dlq_replay_of_text, created_at"}},
		{columns{},
			[]string{"NULL::text AS headers_text, NULL::text AS event_id_text, NULL::text AS dlq_replay_of_text, created_at"}},
	} {
		q := buildQueries("t", tt.cols, Options{FromID: 1})
		for _, w := range tt.want {
			if !strings.Contains(q.page, w) {
				t.Errorf("columns %+v: page %q\nwant %q in it", tt.cols, q.page, w)
			}
		}
	}
}
