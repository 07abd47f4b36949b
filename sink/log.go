package sink

import (
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"
)

// saramaLog forwards sarama's internal log (retries, leader changes, epoch
// bumps) to zerolog at debug level: invaluable when a broker misbehaves,
// too chatty for info.
type saramaLog struct{ l zerolog.Logger }

func (s saramaLog) Print(v ...any) { s.l.Debug().Msg(strings.TrimSpace(fmt.Sprint(v...))) }
func (s saramaLog) Printf(format string, v ...any) {
	s.l.Debug().Msg(strings.TrimSpace(fmt.Sprintf(format, v...)))
}
func (s saramaLog) Println(v ...any) { s.l.Debug().Msg(strings.TrimSpace(fmt.Sprintln(v...))) }

// routeSaramaLog installs the forwarder when debug logging is on. sarama's
// logger is package-global, so the last producer created wins.
func routeSaramaLog(log zerolog.Logger) {
	if log.GetLevel() <= zerolog.DebugLevel {
		sarama.Logger = saramaLog{log.With().Str("component", "sarama").Logger()}
	}
}
