package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/big"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// idOf is the value of a record's first "id" header ("" without one): the EventRouter's event id header.
func idOf(r Rec) (string, bool) {
	for _, h := range r.Headers {
		if h.Name == "id" {
			return string(h.Value), true
		}
	}
	return "", false
}

// cmdVerify checks one contender's dump against the backlog: every event that was inserted (deleted again or
// not) is there exactly once, on outbox.event.<aggregatetype>, keyed by its aggregateid, in commit order per
// key, with its payload text as the value (the JSONB's text as PostgreSQL prints it: compared after a JSON
// re-encoding, since the inserted text is not normalized) or no value for a SQL NULL payload.
func cmdVerify(args []string) error {
	fs := flag.NewFlagSet("verify", flag.ExitOnError)
	manifest := fs.String("manifest", "", "manifest file")
	dump := fs.String("dump", "", "dump file (or -kafka)")
	kafka := fs.Bool("kafka", false, "read the records from Kafka (topics outbox.*) instead of a dump: no file for big backlogs")
	brokers := brokersFlag(fs)
	name := fs.String("name", "output", "name in messages")
	deadOK := fs.Bool("dead-ok", true, "a dead letter for an event counts as its delivery (false: a dead letter is a finding)")
	_ = fs.Parse(args)
	_, evs, err := readManifest(*manifest)
	if err != nil {
		return err
	}
	var each func(func(Rec) error) error
	if *kafka {
		each = func(f func(Rec) error) error { return consumeAll(splitBrokers(*brokers), "outbox.", f) }
	} else {
		recs, err := readDump(*dump)
		if err != nil {
			return err
		}
		each = func(f func(Rec) error) error {
			for _, r := range recs {
				if err := f(r); err != nil {
					return err
				}
			}
			return nil
		}
	}
	byID := map[string]int{}
	for i, ev := range evs {
		byID[ev.ID] = i
	}
	seen := make([]int, len(evs))
	var problems []string
	bad := func(f string, a ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(f, a...))
		} else if len(problems) == 20 {
			problems = append(problems, "...")
		}
	}
	lastPos := map[string]int{} // topic + key -> manifest index of the last record read
	order, nulls := 0, 0
	dead, nrecs := 0, 0
	err = each(func(r Rec) error {
		nrecs++
		if reason := headerValue(r.Headers, "dlq.reason"); reason != nil {
			// a dead letter stands for its event (dlq.event_id): delivered to the dead-letter topic, not lost;
			// compare decides whether that is an allowed difference
			id := string(headerValue(r.Headers, "dlq.event_id"))
			if _, ok := byID[id]; !ok {
				if hid, has := idOf(r); has {
					if _, found := byID[hid]; found {
						bad("dead letter %s/%d@%d: dlq.event_id %q is not its event's id %q", r.Topic, r.Partition, r.Offset, id, hid)
						id = hid
					}
				}
			}
			if !*deadOK {
				bad("event %q was dead-lettered (%s): %s", id, reason, trunc(headerValue(r.Headers, "dlq.error")))
			}
			if i, ok := byID[id]; ok {
				seen[i]++
				dead++
				if seen[i] > 1 {
					bad("event %s read %d times (once as a dead letter)", id, seen[i])
				}
			} else {
				bad("dead letter %s/%d@%d for event %q that was never written", r.Topic, r.Partition, r.Offset, id)
			}
			return nil
		}
		id, ok := idOf(r)
		if !ok {
			bad("%s/%d@%d: no id header", r.Topic, r.Partition, r.Offset)
			return nil
		}
		i, ok := byID[id]
		if !ok {
			bad("%s/%d@%d: id %s was never written", r.Topic, r.Partition, r.Offset, id)
			return nil
		}
		ev := evs[i]
		seen[i]++
		if seen[i] > 1 {
			bad("event %s read %d times", id, seen[i])
		}
		if r.Topic != "outbox.event."+ev.Type {
			bad("event %s on topic %s, want outbox.event.%s", id, r.Topic, ev.Type)
		}
		if r.Key == nil || string(r.Key) != ev.Agg {
			bad("event %s: key %q, want %q", id, r.Key, ev.Agg)
		}
		if ev.Payload == nil {
			nulls++
			if r.Value != nil {
				bad("event %s: SQL NULL payload but value %q", id, trunc(r.Value))
			}
		} else if !sameJSON(r.Value, []byte(*ev.Payload)) {
			bad("event %s: value %q is not the payload %q", id, trunc(r.Value), trunc([]byte(*ev.Payload)))
		}
		k := r.Topic + "\x00" + string(r.Key)
		if p, ok := lastPos[k]; ok && p > i {
			order++
			bad("key %q on %s: event %s (written #%d) read after #%d", r.Key, r.Topic, id, i, p)
		}
		lastPos[k] = i
		return nil
	})
	if err != nil {
		return err
	}
	lost := 0
	for i, n := range seen {
		if n == 0 {
			lost++
			bad("event %s (%s/%q) never read", evs[i].ID, evs[i].Type, evs[i].Agg)
		}
	}
	fmt.Printf("verify %s: %d records for %d events written: lost %d, duplicates %d, out of order per key %d, SQL NULL payloads %d, dead-lettered %d\n",
		*name, nrecs, len(evs), lost, nrecs-(len(evs)-lost), order, nulls, dead)
	if len(problems) > 0 {
		return fmt.Errorf("%s does not match the backlog:\n  %s", *name, strings.Join(problems, "\n  "))
	}
	return nil
}

// sameJSON: the value is the inserted JSON text up to what jsonb does to it (whitespace, key order, the last
// of duplicate keys, number spelling): both decoded, numbers compared as exact rationals. Used only by verify
// (each contender against the backlog); compare checks the two contenders' bytes exactly.
func sameJSON(got, want []byte) bool {
	if bytes.Equal(got, want) {
		return true
	}
	var g, w any
	dg := json.NewDecoder(bytes.NewReader(got))
	dg.UseNumber()
	dw := json.NewDecoder(bytes.NewReader(want))
	dw.UseNumber()
	if dg.Decode(&g) != nil || dw.Decode(&w) != nil {
		return false
	}
	return jsonEqual(g, w)
}

func jsonEqual(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || !jsonEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		rx, ok1 := new(big.Rat).SetString(string(x))
		ry, ok2 := new(big.Rat).SetString(string(y))
		return ok1 && ok2 && rx.Cmp(ry) == 0
	default:
		return a == b
	}
}

func trunc(b []byte) string {
	if b == nil {
		return "<null>"
	}
	if len(b) > 120 {
		return string(b[:120]) + fmt.Sprintf("...(%d bytes)", len(b))
	}
	return string(b)
}

func show(b []byte) string {
	if b == nil {
		return "null"
	}
	return strconv.Quote(trunc(b))
}

func showHeaders(hs []Header) string {
	var parts []string
	for _, h := range hs {
		parts = append(parts, h.Name+"="+show(h.Value))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func showRec(r Rec) string {
	return fmt.Sprintf("%s/%d@%d key=%s value=%s headers=%s", r.Topic, r.Partition, r.Offset, show(r.Key), show(r.Value), showHeaders(r.Headers))
}

// finding is one difference class with its count and first example.
type finding struct {
	class   string
	count   int
	example string
}

type findings struct {
	m     map[string]*finding
	order []string
}

func (f *findings) add(class, example string) {
	if f.m == nil {
		f.m = map[string]*finding{}
	}
	x, ok := f.m[class]
	if !ok {
		x = &finding{class: class, example: example}
		f.m[class] = x
		f.order = append(f.order, class)
	}
	x.count++
}

// readAllowList reads the allowed difference classes from a document: the lines "- `class`: reason" between
// "<!-- compat-allow-list:begin -->" and "<!-- compat-allow-list:end -->". A class ending in "*" allows every
// class with that prefix.
func readAllowList(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	in, found := false, false
	re := regexp.MustCompile("^- `([^`]+)`:? ?(.*)$")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "<!-- compat-allow-list:begin -->":
			in, found = true, true
		case line == "<!-- compat-allow-list:end -->":
			in = false
		case in:
			if m := re.FindStringSubmatch(line); m != nil {
				out[m[1]] = m[2]
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("%s has no <!-- compat-allow-list:begin --> block", path)
	}
	return out, sc.Err()
}

func allowed(allow map[string]string, class string) (string, bool) {
	if r, ok := allow[class]; ok {
		return r, true
	}
	for k, r := range allow {
		if strings.HasSuffix(k, "*") && strings.HasPrefix(class, strings.TrimSuffix(k, "*")) {
			return r, true
		}
	}
	return "", false
}

type tp struct {
	topic string
	part  int32
}

// cmdCompare compares two dumps record by record. Records are matched by their "id" header (the event id,
// unique per row); a record without one is matched by position. For each matched pair: topic, partition,
// offset (so the order within each partition), key bytes (null apart from empty), value bytes (null apart from
// empty), headers (names, order, value bytes). Records of one side only are "missing_in_<b>"/"extra_in_<b>".
// Timestamps are shown, not compared (see the allow-list document).
func cmdCompare(args []string) error {
	fs := flag.NewFlagSet("compare", flag.ExitOnError)
	aPath := fs.String("a", "", "first dump (the reference)")
	bPath := fs.String("b", "", "second dump")
	aName := fs.String("a-name", "debezium", "name of the first")
	bName := fs.String("b-name", "relay", "name of the second")
	allowDoc := fs.String("allow", "", "document with the allow-list block (empty: nothing allowed)")
	_ = fs.Parse(args)
	allow := map[string]string{}
	if *allowDoc != "" {
		var err error
		if allow, err = readAllowList(*allowDoc); err != nil {
			return err
		}
	}
	A, err := readDump(*aPath)
	if err != nil {
		return err
	}
	B, err := readDump(*bPath)
	if err != nil {
		return err
	}
	d := diffDumps(A, B, *aName, *bName)
	fd, countA, countB := d.fd, d.countA, d.countB
	matched, identical, tsSame, tsDiff := d.matched, d.identical, d.tsSame, d.tsDiff
	// summary table
	fmt.Printf("\n## compare: %s (%s) vs %s (%s)\n\n", *aName, *aPath, *bName, *bPath)
	fmt.Printf("| topic | partition | %s records | %s records |\n|---|---|---|---|\n", *aName, *bName)
	var keys []tp
	for k := range countA {
		keys = append(keys, k)
	}
	for k := range countB {
		if _, ok := countA[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].topic != keys[j].topic {
			return keys[i].topic < keys[j].topic
		}
		return keys[i].part < keys[j].part
	})
	for _, k := range keys {
		fmt.Printf("| %s | %d | %d | %d |\n", k.topic, k.part, countA[k], countB[k])
	}
	fmt.Printf("| **total** | | %d | %d |\n\n", len(A), len(B))
	fmt.Printf("records compared (matched by event id): %d; identical (topic, partition, offset, key, value, headers): %d; with differences: %d\n",
		matched, identical, matched-identical)
	okApart := 0
	for _, cls := range d.recClasses {
		all := true
		for _, c := range cls {
			if _, ok := allowed(allow, c); !ok {
				all = false
			}
		}
		if all {
			okApart++
		}
	}
	fmt.Printf("identical apart from allowed difference classes: %d of %d\n", okApart, matched)
	fmt.Printf("timestamps (not compared): equal %d, different %d\n\n", tsSame, tsDiff)
	failed := 0
	if len(fd.order) == 0 {
		fmt.Println("difference classes: none")
	} else {
		fmt.Printf("| difference class | count | allowed |\n|---|---|---|\n")
		for _, c := range fd.order {
			x := fd.m[c]
			why, ok := allowed(allow, c)
			st := "NO"
			if ok {
				st = "yes: " + why
			} else {
				failed++
			}
			fmt.Printf("| %s | %d | %s |\n", c, x.count, st)
		}
		fmt.Println()
		for _, c := range fd.order {
			fmt.Printf("- %s (%d), e.g. %s\n", c, fd.m[c].count, fd.m[c].example)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d difference class(es) not in the allow-list%s", failed, map[bool]string{true: " of " + *allowDoc, false: ""}[*allowDoc != ""])
	}
	fmt.Println("\ncompare: OK (no difference outside the allow-list)")
	return nil
}

func head(s []string) []string {
	if len(s) > 4 {
		return append(slices.Clone(s[:4]), "...")
	}
	return s
}

func partSeqs(rs []Rec) map[tp][]string {
	m := map[tp][]string{}
	seen := map[string]bool{}
	for _, r := range rs {
		if id, ok := idOf(r); ok && !seen[id] {
			seen[id] = true
			k := tp{r.Topic, r.Partition}
			m[k] = append(m[k], id)
		}
	}
	return m
}

func keySeqs(rs []Rec) map[string][]string {
	m := map[string][]string{}
	seen := map[string]bool{} // a duplicate is its own class: first occurrence only
	for _, r := range rs {
		if id, ok := idOf(r); ok && !seen[id] {
			seen[id] = true
			k := r.Topic + "|" + string(r.Key)
			m[k] = append(m[k], id)
		}
	}
	return m
}

func headerNames(hs []Header) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.Name)
	}
	return out
}

func headerValue(hs []Header, name string) []byte {
	for _, h := range hs {
		if h.Name == name {
			return h.Value
		}
	}
	return nil
}

func headersEqual(a, b []Header) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || (a[i].Value == nil) != (b[i].Value == nil) || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

// diffResult is what diffDumps found.
type diffResult struct {
	fd                 findings
	countA, countB     map[tp]int
	matched, identical int
	tsSame, tsDiff     int
	recClasses         [][]string
}

// diffDumps compares A (the reference) with B record by record (see cmdCompare).
func diffDumps(A, B []Rec, aName, bName string) diffResult {
	var fd findings
	pair := func(a, b Rec) string {
		return fmt.Sprintf("%s: %s | %s: %s", aName, showRec(a), bName, showRec(b))
	}

	// per-partition record counts and topic sets
	countA, countB := map[tp]int{}, map[tp]int{}
	for _, r := range A {
		countA[tp{r.Topic, r.Partition}]++
	}
	for _, r := range B {
		countB[tp{r.Topic, r.Partition}]++
	}

	index := func(rs []Rec, side string) (map[string]int, []int) {
		m := map[string]int{}
		var noID []int
		for i, r := range rs {
			id, ok := idOf(r)
			if !ok {
				noID = append(noID, i)
				continue
			}
			if j, dup := m[id]; dup {
				fd.add("duplicate_in_"+side, fmt.Sprintf("id %s at %s and %s", id, showRec(rs[j]), showRec(r)))
				continue
			}
			m[id] = i
		}
		return m, noID
	}
	// B's dead letters (records with a dlq.reason header): each one names the event it stands for (dlq.event_id)
	var dead []Rec
	B = slices.DeleteFunc(slices.Clone(B), func(r Rec) bool {
		if headerValue(r.Headers, "dlq.reason") != nil {
			dead = append(dead, r)
			return true
		}
		return false
	})
	ia, noA := index(A, aName)
	ib, noB := index(B, bName)
	deadFor := map[string]bool{}
	for _, r := range dead {
		id := string(headerValue(r.Headers, "dlq.event_id"))
		i, ok := ia[id]
		if !ok {
			// docs/configuration.md: dlq.event_id is the id's text. A dead letter whose id header names an
			// event but whose dlq.event_id does not is a difference of its own (and is then matched by id).
			if hid, has := idOf(r); has {
				if j, found := ia[hid]; found {
					fd.add("dead_letter_event_id_wrong", fmt.Sprintf("dlq.event_id=%q, id=%q: %s", id, hid, showRec(r)))
					id, i, ok = hid, j, true
				}
			}
		}
		if !ok {
			fd.add("extra_in_"+bName+":dead_letter", showRec(r))
			continue
		}
		deadFor[id] = true
		class := "dead_lettered_in_" + bName + ":" + string(headerValue(r.Headers, "dlq.reason"))
		if len(A[i].Key) == 0 {
			class += ":empty_key"
		}
		fd.add(class, fmt.Sprintf("%s: %s | %s: %s", aName, showRec(A[i]), bName, showRec(r)))
	}
	identical, matched := 0, 0
	offsetDiff := map[tp][]string{}
	var recClasses [][]string // per matched record: its difference classes (offset shifts judged per partition)
	compareOne := func(a, b Rec) {
		matched++
		var cls []string
		add := func(c, ex string) { fd.add(c, ex); cls = append(cls, c) }
		defer func() { recClasses = append(recClasses, cls) }()
		same := true
		if a.Topic != b.Topic {
			add("topic", pair(a, b))
			same = false
		} else if a.Partition != b.Partition {
			add("partition", pair(a, b))
			same = false
		} else if a.Offset != b.Offset {
			// judged per partition below: a record missing before it shifts every later offset
			offsetDiff[tp{a.Topic, a.Partition}] = append(offsetDiff[tp{a.Topic, a.Partition}], pair(a, b))
			same = false
		}
		if (a.Key == nil) != (b.Key == nil) {
			add("key_null", pair(a, b))
			same = false
		} else if !bytes.Equal(a.Key, b.Key) {
			add("key", pair(a, b))
			same = false
		}
		if (a.Value == nil) != (b.Value == nil) {
			add("value_null", pair(a, b))
			same = false
		} else if !bytes.Equal(a.Value, b.Value) {
			add("value", pair(a, b))
			same = false
		}
		if !headersEqual(a.Headers, b.Headers) {
			same = false
			na, nb := headerNames(a.Headers), headerNames(b.Headers)
			for _, n := range na {
				if !slices.Contains(nb, n) {
					add("header_missing_in_"+bName+":"+n, pair(a, b))
				}
			}
			for _, n := range nb {
				if !slices.Contains(na, n) {
					add("header_extra_in_"+bName+":"+n, pair(a, b))
				}
			}
			for _, n := range na {
				if slices.Contains(nb, n) && !bytes.Equal(headerValue(a.Headers, n), headerValue(b.Headers, n)) {
					add("header_value:"+n, pair(a, b))
				}
			}
			common := func(x, y []string) []string {
				var c []string
				for _, n := range x {
					if slices.Contains(y, n) {
						c = append(c, n)
					}
				}
				return c
			}
			if !slices.Equal(common(na, nb), common(nb, na)) || len(na) != len(slices.Compact(slices.Clone(na))) {
				add("header_order", pair(a, b))
			}
		}
		if same {
			identical++
		}
	}
	for _, a := range A {
		id, ok := idOf(a)
		if !ok {
			continue
		}
		j, ok := ib[id]
		if !ok {
			if !deadFor[id] {
				fd.add("missing_in_"+bName, showRec(a))
			}
			continue
		}
		compareOne(a, B[j])
	}
	for _, b := range B {
		id, ok := idOf(b)
		if !ok {
			continue
		}
		if _, ok := ia[id]; !ok {
			fd.add("extra_in_"+bName, showRec(b))
		}
	}
	// records without an id header: by position within their partition
	for k := 0; k < len(noA) || k < len(noB); k++ {
		switch {
		case k >= len(noA):
			fd.add("extra_in_"+bName+"(no id header)", showRec(B[noB[k]]))
		case k >= len(noB):
			fd.add("missing_in_"+bName+"(no id header)", showRec(A[noA[k]]))
		default:
			fd.add("no_id_header", pair(A[noA[k]], B[noB[k]]))
			compareOne(A[noA[k]], B[noB[k]])
		}
	}
	// Order within each partition: the events both sides have there must come in the same order. Offsets that
	// differ only because records are missing or extra before them (their own classes) are no difference; in a
	// partition where both sides have the same records, any offset difference is one ("offset").
	partA, partB := partSeqs(A), partSeqs(B)
	for k, sa := range partA {
		sb := partB[k]
		inA, inB := map[string]bool{}, map[string]bool{}
		for _, id := range sa {
			inA[id] = true
		}
		for _, id := range sb {
			inB[id] = true
		}
		ca := slices.DeleteFunc(slices.Clone(sa), func(id string) bool { return !inB[id] })
		cb := slices.DeleteFunc(slices.Clone(sb), func(id string) bool { return !inA[id] })
		if !slices.Equal(ca, cb) {
			for i := range ca {
				if ca[i] != cb[i] {
					fd.add("order_within_partition", fmt.Sprintf("%s/%d: position %d among common records: %s has %s, %s has %s",
						k.topic, k.part, i, aName, ca[i], bName, cb[i]))
				}
			}
		} else if len(ca) == len(sa) && len(cb) == len(sb) {
			for _, ex := range offsetDiff[k] {
				fd.add("offset", ex)
			}
		}
	}

	// per-key order: for each key, the sequence of ids must be the same on both sides
	seqA, seqB := keySeqs(A), keySeqs(B)
	for k, sa := range seqA {
		sb := seqB[k]
		// only the events both sides have: a missing or extra one is its own class
		inB, inA := map[string]bool{}, map[string]bool{}
		for _, id := range sb {
			inB[id] = true
		}
		for _, id := range sa {
			inA[id] = true
		}
		sa = slices.DeleteFunc(slices.Clone(sa), func(id string) bool { return !inB[id] })
		sb = slices.DeleteFunc(slices.Clone(sb), func(id string) bool { return !inA[id] })
		if !slices.Equal(sa, sb) {
			fd.add("order_within_key", fmt.Sprintf("key %q: %s %v | %s %v", k, aName, head(sa), bName, head(sb)))
		}
	}

	// timestamps: informational
	var tsDiff, tsSame int
	for _, a := range A {
		if id, ok := idOf(a); ok {
			if j, ok := ib[id]; ok {
				if a.TSMillis == B[j].TSMillis {
					tsSame++
				} else {
					tsDiff++
				}
			}
		}
	}

	return diffResult{fd: fd, countA: countA, countB: countB, matched: matched, identical: identical, tsSame: tsSame, tsDiff: tsDiff, recClasses: recClasses}
}
