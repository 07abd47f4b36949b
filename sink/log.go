package sink

import (
	"fmt"
	"strings"

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
}

// retryFormats are the sarama log formats that report a failed produce
// attempt about to be retried; the last argument is the error.
var retryFormats = map[string]bool{
	"producer/broker/%d state change to [retrying] on %s/%d because %v\n": true,
	"producer/broker/%d state change to [closing] because %s\n":           true,
}

func (s saramaLog) Print(v ...any) { s.l.Debug().Msg(strings.TrimSpace(fmt.Sprint(v...))) }
func (s saramaLog) Printf(format string, v ...any) {
	if retryFormats[format] && len(v) > 0 {
		if err, ok := v[len(v)-1].(error); ok {
			reason, _ := Classify(err)
			s.errors.WithLabelValues(reason).Inc()
		}
	}
	if s.l.GetLevel() <= zerolog.DebugLevel {
		s.l.Debug().Msg(strings.TrimSpace(fmt.Sprintf(format, v...)))
	}
}
func (s saramaLog) Println(v ...any) { s.l.Debug().Msg(strings.TrimSpace(fmt.Sprintln(v...))) }

// routeSaramaLog installs the forwarder. sarama's logger is package-global,
// so the last producer created wins (the relay has one).
func routeSaramaLog(log zerolog.Logger, errors *prometheus.CounterVec) {
	sarama.Logger = saramaLog{l: log.With().Str("component", "sarama").Logger(), errors: errors}
}
