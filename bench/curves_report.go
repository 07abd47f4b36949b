package main

import (
	"fmt"
	"math"
	"strings"
)

// curvesLink is section 7 of the main report: the curves of this run, or a
// link to the latest full-scale `make bench-curves` result.
func (r *results) curvesLink(asset string) string {
	if r.Curves == nil {
		return "Not part of this run (`curves` not in `OUTBOX_BENCH_PARTS`); `make bench-curves` measures them alone (bench/README.md); latest full-scale result: [latest-curves.md](latest-curves.md).\n\n"
	}
	return fmt.Sprintf("This run measured them: [%s-curves.md](%s-curves.md).\n\n", asset, asset)
}

// curvesMarkdown is the curves part's own report.
func (r *results) curvesMarkdown(asset string) string {
	c := r.Curves
	var sb strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) }
	cs := c.Scale
	w("# outbox-relay cost curves, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	w("Scale %s; git %s; %d cores, %s, load average %s at the start and %s at the end; PostgreSQL %s, Kafka %s. The curves part took %s.\n\n",
		r.Scale.Name, r.Git, r.Machine.NProc, r.Machine.MemTotal, r.Machine.LoadStart, r.LoadEnd, r.PG, r.Kafka, c.Elapsed.Round(1e9))
	w("![cost curves](%s-curves.png)\n\n", asset)
	w("Every point: a fresh slot made before its backlog (%d outbox rows per transaction, filled server-side, payload `{\"pad\": <hex>, \"seq\": n}`, the payload column stored uncompressed), then one relay (`run --leader-election=false`, otherwise defaults) from its start until `outbox_relay_events_published_total` counts every event (scraped every 50 ms): that time gives events/s and payload MB/s (10^6 B). The slot is then checked to reach the end LSN. CPU is user+sys from `/proc/<pid>/stat` over the relay's life (relay), its walsender's, and the broker JVM's over the same span; *cores* = CPU s / wall s. Peak RSS is the relay's `VmHWM`; goroutines the largest `go_goroutines` scraped. A single run per point, on a shared machine: read the shape, not the digits.\n\n", cs.PerTxn)
	w("**What binds** is read off the CPU shares: the walsender is one process (one core at most), so >= 0.8 cores means it is the limit; the relay or the broker likewise at >= 0.8 cores; when all together use >= 85%% of the machine's cores, the machine's CPU is the limit; when the whole machine (`/proc/stat`, every process) was >= 90%% busy over the drain while these three used less, the CPU is the limit too, taken by other load (the other engineers' runs on this shared box); >= 20%% iowait is the disk; for the payload family, a relay within 0.8x of the plain producer is at the broker's ingest limit; an added round trip with nothing saturated is network RTT.\n\n")

	row := func(p *curvePoint, first string) string {
		if p.Err != "" {
			return fmt.Sprintf("| %s | error: %s |\n", first, p.Err)
		}
		return ""
	}
	mib := func(b int64) string { return fmt.Sprintf("%.0f", float64(b)/(1<<20)) }
	cores := func(cpu, wall float64) string { return f2(coreShare(cpu, wall)) }

	w("## Payload size\n\nThe same payload bytes per point (%.0f MB: events = bytes / size), 4 partitions, keys from 10k aggregates. Reference: a plain sarama producer in the bench, configured like the relay's (idempotent, acks=all, one request in flight, murmur2 partitioner, 1 ms flush), writing the same number of records of the same size to a fresh topic with the same partitions, first send to last ack: the broker's own ingest limit on this machine.\n\n", float64(cs.PayloadBytes)/1e6)
	w("| payload | events | relay s | relay events/s | relay MB/s | reference events/s | reference MB/s | relay / reference | relay CPU us/event | relay cores | walsender cores | broker cores | peak RSS MiB | binds |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range c.family("payload") {
		if s := row(p, p.Label); s != "" {
			w("%s", s)
			continue
		}
		ratio := math.NaN()
		if p.RefEvPerS > 0 {
			ratio = p.EvPerS / p.RefEvPerS
		}
		w("| %s | %d | %.2f | %s | %.1f | %s | %.1f | %s | %.1f | %s | %s | %s | %s | %s |\n", p.Label, p.Events, p.Seconds, f0(p.EvPerS), p.MBPerS, f0(p.RefEvPerS), p.RefMBPerS, f2(ratio),
			p.RelayCPU/float64(p.Events)*1e6, cores(p.RelayCPU, p.Seconds), cores(p.Walsender, p.Seconds), cores(p.Broker, p.Seconds), mib(p.PeakRSS), p.Binds)
	}
	w("\n## Distinct topics\n\n%d events per point (%d per transaction, ~400 B payloads), `aggregate_type` = event number mod the topic count, so every topic gets events; topics created beforehand with %d partition each (1,000 topics x 4 partitions would be 4,000 partitions on the one test broker).\n\n", cs.TopicEvents, cs.PerTxn, cs.TopicParts)
	w("| topics | events/s | relay CPU us/event | peak RSS MiB | goroutines (max) | relay cores | walsender cores | broker cores | binds |\n|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range c.family("topics") {
		if s := row(p, p.Label); s != "" {
			w("%s", s)
			continue
		}
		w("| %s | %s | %.1f | %s | %.0f | %s | %s | %s | %s |\n", p.Label, f0(p.EvPerS), p.RelayCPU/float64(p.Events)*1e6, mib(p.PeakRSS), p.Goroutines,
			cores(p.RelayCPU, p.Seconds), cores(p.Walsender, p.Seconds), cores(p.Broker, p.Seconds), p.Binds)
	}
	w("\n## Distinct aggregates\n\n%d events per point drawn uniformly (hash of the event number) from a key space of the given size, so the larger key spaces give at most %d distinct aggregates (the *distinct* column counts them): a 10M-event backlog per point would take too long on this machine. The relay keeps no per-aggregate state on its data path (the key only picks the partition), so its RSS should not follow the distinct count.\n\n", cs.AggEvents, cs.AggEvents)
	w("| key space | distinct aggregate_ids | events/s | relay CPU us/event | peak RSS MiB | goroutines (max) | relay cores | walsender cores | broker cores | binds |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range c.family("aggregates") {
		if s := row(p, p.Label); s != "" {
			w("%s", s)
			continue
		}
		w("| %s | %d | %s | %.1f | %s | %.0f | %s | %s | %s | %s |\n", p.Label, p.Distinct, f0(p.EvPerS), p.RelayCPU/float64(p.Events)*1e6, mib(p.PeakRSS), p.Goroutines,
			cores(p.RelayCPU, p.Seconds), cores(p.Walsender, p.Seconds), cores(p.Broker, p.Seconds), p.Binds)
	}
	w("\n## One large transaction\n\nOne transaction of %d rows (one INSERT ... SELECT, ~400 B payloads) committed behind a fresh slot, then a relay started (`postgres.streaming` auto: the server streams the transaction once it exceeds `logical_decoding_work_mem`, the relay spools it to disk, decoder/spool.go, and publishes at the commit). Times from the relay's start.\n\n", cs.BigTxnRows)
	w("| rows | insert + commit s | start -> first ack s | start -> all acked s | start -> slot confirmed s | events/s | relay CPU s | peak RSS MiB | relay disk write / read MB | relay cores | walsender cores | broker cores | binds |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range c.family("bigtxn") {
		if s := row(p, p.Label); s != "" {
			w("%s", s)
			continue
		}
		w("| %d | %.1f | %s | %.2f | %s | %s | %.2f | %s | %.0f / %.0f | %s | %s | %s | %s |\n", p.Events, p.FillS, f2(p.FirstS), p.Seconds, f2(p.ConfS), f0(p.EvPerS), p.RelayCPU, mib(p.PeakRSS),
			float64(p.DiskW)/1e6, float64(p.DiskR)/1e6, cores(p.RelayCPU, p.Seconds), cores(p.Walsender, p.Seconds), cores(p.Broker, p.Seconds), p.Binds)
	}
	w("\n## 100 rows/txn drain with added round trip\n\nOne backlog of %d events behind five slots, drained in turn: direct; the relay's Kafka connection through test/proxy (bootstrap on the broker's PROXIED listener, which advertises the proxy's port, so every broker connection goes through it) with 0 and %s added round trip; its PostgreSQL connections (replication and queries) through a second proxy with 0 and %s. The proxy delays every chunk by half the round trip in each direction (`proxy.SetDelay`), pipelined. The proxies run inside the bench process (their CPU is in no column and competes for the same cores): compare +1 ms with +0 of the same path; direct against +0 is the cost of the proxy hop itself.\n\n", cs.RTTEvents, cs.RTT, cs.RTT)
	w("| path | events/s | vs direct | start -> first ack s | relay CPU us/event | relay cores | walsender cores | broker cores | binds |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	var direct float64
	for _, p := range c.family("rtt") {
		if s := row(p, p.Label); s != "" {
			w("%s", s)
			continue
		}
		if p.Label == "direct" {
			direct = p.EvPerS
		}
		vs := math.NaN()
		if direct > 0 {
			vs = p.EvPerS / direct
		}
		w("| %s | %s | %s | %s | %.1f | %s | %s | %s | %s |\n", p.Label, f0(p.EvPerS), f2(vs), f2(p.FirstS), p.RelayCPU/float64(p.Events)*1e6,
			cores(p.RelayCPU, p.Seconds), cores(p.Walsender, p.Seconds), cores(p.Broker, p.Seconds), p.Binds)
	}
	w("\n")
	return sb.String()
}
