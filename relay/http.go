package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Observed is what the HTTP server shows: a Relay.
type Observed interface {
	prometheus.Gatherer
	Health() Health
}

// Server serves /metrics, /healthz, /readyz, /role and, when asked,
// /debug/pprof/. NewServer allocates; Run listens and serves until ctx ends.
type Server struct {
	addr string
	srv  *http.Server
	log  zerolog.Logger
}

// Limits of the HTTP server: what one client may hold. Scrapes and probes
// are small, fast requests; a client that sends its request or reads the
// answer more slowly than this, or idles between requests longer, is cut.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second // the whole request, body included
	httpWriteTimeout      = 10 * time.Second // Prometheus' default scrape_timeout
	httpIdleTimeout       = 60 * time.Second // keep-alive between scrapes
	httpMaxHeaderBytes    = 16 << 10         // net/http adds 4 KiB; its default is 1 MiB
)

// NewServer allocates; it does not listen.
func NewServer(addr string, profiling bool, o Observed, log zerolog.Logger) *Server {
	mux := http.NewServeMux()
	if profiling {
		// Index also serves allocs, heap, goroutine... These routes stream
		// for their ?seconds= (profile: 30 by default), longer than
		// WriteTimeout: net/http/pprof moves the connection's write deadline
		// to WriteTimeout + seconds itself (Go 1.23+), and the read timeout
		// ends with the request.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(o, promhttp.HandlerOpts{}))
	mux.HandleFunc("/role", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(o.Health().Role)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		h := o.Health()
		if !h.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, h.Reason)
	})
	return &Server{addr: addr, log: log, srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
	}}
}

// Run listens on the address and serves until ctx ends; then it stops
// within a second (open scrapes are cut). A listen error is returned.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen on metrics_addr %s: %w", s.addr, err)
	}
	s.log.Info().Str("addr", ln.Addr().String()).Msg("serving /metrics, /healthz, /readyz, /role")
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve metrics_addr %s: %w", s.addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if s.srv.Shutdown(sctx) != nil {
		_ = s.srv.Close()
	}
	<-served
	return nil
}

// newReadyGauge is outbox_relay_ready: /readyz as a metric, read from
// health at scrape time, so readiness lost for minutes can alert.
func newReadyGauge(health func() Health) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_relay_ready",
		Help: "1 while /readyz answers 200 (leader streaming, Kafka reachable, not halted, no ack overdue; standby: lease connection up), else 0."},
		func() float64 {
			if health().Ready {
				return 1
			}
			return 0
		})
}
