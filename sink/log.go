package sink

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// saramaLog forwards sarama's internal log (retries, leader changes, epoch
// bumps) to zerolog at debug level, and counts the produce attempts sarama
// retries internally: they never reach the Errors channel, and an operator
// wants to see a broker outage in outbox_relay_publish_errors_total while
// it happens, not an hour later.
type saramaLog struct {
	l      zerolog.Logger
	errors *prometheus.CounterVec
	meta   *metadataWatch // nil in tests that route only the log
	// authWarned is when a refused-credentials retry was last logged at
	// warn (unix nanoseconds): sarama retries it silently for up to
	// kafka.retry_max attempts, and the operator must learn why nothing
	// is acked.
	authWarned atomic.Int64
}

// saslFailFormats are sarama's log formats for a broker connection closed
// because its SASL authentication failed; the last argument is the error.
var saslFailFormats = map[string]bool{
	"Closed connection to broker %s due to SASL v0 auth error: %s\n": true,
	"Closed connection to broker %s due to SASL v1 auth error: %s\n": true,
}

// authWarnEvery spaces the warnings about refused credentials.
const authWarnEvery = 30 * time.Second

// retryFormats are the sarama log formats that report a failed produce
// attempt about to be retried; the last argument is the error.
var retryFormats = map[string]bool{
	"producer/broker/%d state change to [retrying] on %s/%d because %v\n": true,
	"producer/broker/%d state change to [closing] because %s\n":           true,
}

func (s *saramaLog) Print(v ...any) { s.l.Debug().Msg(strings.TrimSpace(fmt.Sprint(v...))) }
func (s *saramaLog) Printf(format string, v ...any) {
	if format == fetchMetadataFormat && s.meta != nil && len(v) > 0 {
		if topics, ok := v[0].([]string); ok {
			s.meta.requested(topics)
		}
	}
	if (retryFormats[format] || saslFailFormats[format]) && len(v) > 0 {
		if err, ok := v[len(v)-1].(error); ok {
			if retryFormats[format] {
				reason, _ := Classify(err)
				s.errors.WithLabelValues(reason).Inc()
			}
			if IsAuthError(err) {
				now, last := time.Now().UnixNano(), s.authWarned.Load()
				if now-last >= int64(authWarnEvery) && s.authWarned.CompareAndSwap(last, now) {
					s.l.Warn().Err(err).Msg("kafka refused the relay's SASL credentials (kafka.sasl.*; for OAUTHBEARER the token kafka.sasl.oauth.* gives): sarama retries, nothing is acked until they are accepted")
				}
			}
		}
	}
	if s.l.GetLevel() <= zerolog.DebugLevel {
		s.l.Debug().Msg(strings.TrimSpace(fmt.Sprintf(format, v...)))
	}
}
func (s *saramaLog) Println(v ...any) { s.l.Debug().Msg(strings.TrimSpace(fmt.Sprintln(v...))) }

// sarama's logger is one package variable, read by its goroutines at any
// time, also those of a producer being abandoned. It is set once, to a
// forwarder; each new producer swaps what it forwards to atomically.
var (
	saramaTarget  atomic.Pointer[saramaLog]
	saramaInstall sync.Once
)

type saramaForwarder struct{}

func (saramaForwarder) Print(v ...any) {
	if s := saramaTarget.Load(); s != nil {
		s.Print(v...)
	}
}

func (saramaForwarder) Printf(format string, v ...any) {
	if s := saramaTarget.Load(); s != nil {
		s.Printf(format, v...)
	}
}

func (saramaForwarder) Println(v ...any) {
	if s := saramaTarget.Load(); s != nil {
		s.Println(v...)
	}
}

// routeSaramaLog sends sarama's log to log, its retry reports to errors and
// the topics of its metadata requests to meta, from now on (the last
// producer created wins; the relay has one at a time).
func routeSaramaLog(log zerolog.Logger, errors *prometheus.CounterVec, meta *metadataWatch) {
	saramaTarget.Store(&saramaLog{l: log.With().Str("component", "sarama").Logger(), errors: errors, meta: meta})
	saramaInstall.Do(func() { sarama.Logger = saramaForwarder{} })
}
