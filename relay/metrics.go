package relay

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/deadletter"
	"github.com/outbox-relay/outbox-relay/history"
)

type pipelineMetrics struct {
	commitToAck  prometheus.Histogram
	deadLettered *prometheus.CounterVec
	halted       prometheus.Gauge
	rewinds      prometheus.Counter
	// history: kept positions against the server's history (resume.go).
	history       *prometheus.CounterVec
	resumeSkipped prometheus.Counter
}

// newPipelineMetrics builds p's metrics and registers them with reg (nil
// in tests). Gauges of the tracker and the decoder are read at scrape time.
func newPipelineMetrics(p *Pipeline, reg prometheus.Registerer) pipelineMetrics {
	m := pipelineMetrics{
		commitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_relay_commit_to_ack_seconds",
			Help:    "Time from the PostgreSQL commit of an event's transaction to the Kafka ack (acks=all).",
			Buckets: []float64{.001, .0025, .005, .01, .02, .04, .08, .16, .32, .64, 1.28, 2.56, 5, 10, 30, 60},
		}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_dead_lettered_total",
			Help: "Poison events written to the dead-letter topic (acked), by reason and outbox table (schema.name)."}, []string{"reason", "table"}),
		halted: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_halted",
			Help: "1 when publishing stopped on a poison event (on_poison: halt, or the dead-letter write failed)."}),
	}
	m.history = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_relay_history_decisions_total",
		Help: "Kept positions (source: watermark, checkpoint) judged against the server's history at a session start (verdict: apply, behind, republish, refuse), and kept positions the stream disproved (source stream, verdict mismatch)."},
		[]string{"source", "verdict"})
	// Every series from 0, so increase() sees the first decision.
	for _, src := range []string{"watermark", "checkpoint"} {
		for _, v := range []history.Verdict{history.Apply, history.Behind, history.Republish, history.Refuse} {
			m.history.WithLabelValues(src, v.String())
		}
	}
	m.history.WithLabelValues("stream", "mismatch")
	m.resumeSkipped = prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_resume_skipped_events_total",
		Help: "Events read again from the slot after a reconnect or restart and not published: at or before a kept position verified on the same history."})
	m.rewinds = prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_relay_rewinds_total",
		Help: "Times a publish error made the relay republish from the ack watermark to keep per-aggregate order."})
	for _, r := range []string{deadletter.ReasonBadRow, deadletter.ReasonReservedHeader, deadletter.ReasonInvalidTopic,
		deadletter.ReasonTopicLimit, deadletter.ReasonTopicNotAllowed, "message_too_large", "broker_rejected"} {
		for _, t := range p.tables { // bounded: the configured tables
			m.deadLettered.WithLabelValues(r, t)
		}
	}
	if reg == nil {
		return m
	}
	for i, t := range p.tables {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_table_events_decoded_total",
			Help:        "Outbox events decoded from the slot, by outbox table (schema.name).",
			ConstLabels: prometheus.Labels{"table": t}},
			func() float64 { return float64(p.decodedBy[i].Load()) }))
	}
	t := p.tracker
	reg.MustRegister(m.commitToAck, m.deadLettered, m.halted, m.rewinds, m.history, m.resumeSkipped,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_reordered_events_total",
			Help: "Events written to Kafka after a later event of their partition (an error came back while later events were inside the producer)."},
			func() float64 { return float64(p.order.reorders.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_republished_events_total",
			Help: "Events published again after a rewind, i.e. possible duplicates for consumers: handed to the producer again after being handed over earlier in the term, acked or not (delivery: at_least_once)."},
			func() float64 { return float64(p.resend.republished.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_rewind_skipped_events_total",
			Help: "Events a rewind did not publish again: acked before it, with no failed event before them on their partition or with their key (delivery: at_least_once)."},
			func() float64 { return float64(p.resend.skipped.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_inflight_events",
			Help: "Events published and not yet acked by Kafka."},
			func() float64 { e, _ := t.InFlight(); return float64(e) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_inflight_bytes",
			Help: "Payload bytes published and not yet acked by Kafka."},
			func() float64 { _, b := t.InFlight(); return float64(b) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_oldest_unacked_seconds",
			Help: "Age of the oldest event published and not yet acked by Kafka (0 when none); over max_unacked_age the leader is not ready."},
			func() float64 { return p.OldestUnacked().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_acked_lsn",
			Help: "Watermark: every event before this WAL position is acked by Kafka."},
			func() float64 { return float64(t.Flushed()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_events_decoded_total",
			Help: "Outbox events decoded from the slot."},
			func() float64 { return float64(p.decoded.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_other_table_rows_total",
			Help: "Inserts of other tables seen in the stream and ignored."},
			func() float64 { return float64(p.otherRows.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_streamed_transactions_total",
			Help: "Transactions the server streamed before their commit (postgres.streaming) and that committed."},
			func() float64 { return float64(p.streamed.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_streamed_transactions_aborted_total",
			Help: "Streamed transactions aborted whole: nothing of them was published."},
			func() float64 { return float64(p.streamAborts.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_streamed_transactions_spilled_total",
			Help: "Streamed transactions whose events exceeded the in-memory budget (4 MiB, or inflight.max_bytes/2 if less) and went to a temporary file."},
			func() float64 { return float64(p.spilledTxns.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_streamed_open_bytes",
			Help: "Bytes held (memory and temporary files) for streamed transactions not committed yet."},
			func() float64 { return float64(p.streamOpen.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "outbox_relay_resent_transactions_skipped_total",
			Help: "Transactions the server resent below the confirmed watermark, already delivered."},
			func() float64 { return float64(p.resent.Load()) }),
	)
	return m
}
