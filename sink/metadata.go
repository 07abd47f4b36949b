package sink

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// metadataWatch makes sarama's metadata retries visible. A topic the
// cluster does not have (broker auto-creation off, or not allowed for the
// relay) or a partition without a leader is retried inside sarama's
// metadata refresh (Metadata.Retry: about an hour with the producer's
// settings) while publishing to it waits; nothing reaches the Errors
// channel. sarama calls Metadata.Retry.BackoffFunc once per retry: retry
// counts there. The topics come from sarama's own debug line before each
// request, the only place it names them.
type metadataWatch struct {
	retries  prometheus.Counter
	log      zerolog.Logger
	topics   atomic.Pointer[[]string] // the topics of the last metadata request
	lastWarn atomic.Int64             // unix nanoseconds of the last warning; 0 = never
	// lastRetry and streak count the retries of one episode: retries
	// less than metadataEpisodeGap apart.
	lastRetry atomic.Int64
	streak    atomic.Int64
}

// metadataQuietRetries is how many retries of one episode pass without a
// warning: a topic the broker auto-creates, or a leader being elected,
// answers within one or two (20 ms, 40 ms, ...), and is a relay's normal
// life. Five cover about 0.6 s of backoff.
const metadataQuietRetries = 5

// metadataEpisodeGap separates episodes: sarama's backoff never exceeds 2 s.
const metadataEpisodeGap = 5 * time.Second

// metadataWarnEvery rate-limits the warning: a missing topic is retried
// every 2 s for an hour.
const metadataWarnEvery = 30 * time.Second

// fetchMetadataFormat is sarama's debug line before a metadata request for
// given topics (client.go tryRefreshMetadata); its first argument is them.
const fetchMetadataFormat = "client/metadata fetching metadata for %v from broker %s\n"

// requested records the topics of a metadata request. sarama's goroutines.
func (w *metadataWatch) requested(topics []string) {
	c := slices.Clone(topics)
	w.topics.Store(&c)
}

// retry counts one metadata retry and, from the metadataQuietRetries-th
// retry of an episode on, warns at most every metadataWarnEvery. Called by sarama, from the goroutine that refreshes;
// an atomic add and a clock read in the common case.
func (w *metadataWatch) retry() {
	w.retries.Inc()
	now := time.Now().UnixNano()
	if now-w.lastRetry.Swap(now) > int64(metadataEpisodeGap) {
		w.streak.Store(0)
	}
	if w.streak.Add(1) < metadataQuietRetries {
		return
	}
	last := w.lastWarn.Load()
	if last != 0 && now-last < int64(metadataWarnEvery) || !w.lastWarn.CompareAndSwap(last, now) {
		return
	}
	var topics []string
	if p := w.topics.Load(); p != nil {
		topics = *p
	}
	w.log.Warn().Strs("topics", topics).
		Msg("kafka metadata refresh is being retried: a topic of the last request does not exist (broker auto-creation off, or not allowed for the relay), has a partition without a leader, or no broker answered; publishing to it waits meanwhile (up to about an hour). Create the topic, or check the cluster; outbox_relay_kafka_metadata_retries_total counts the retries")
}
