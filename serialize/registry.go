package serialize

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// newClient builds the registry client. The URL keeps its path (Apicurio
// serves the API under /apis/ccompat/v7: pkg/sr joins request paths to it)
// but loses its userinfo, which becomes basic auth: the URL shows up in
// errors, the credentials must not.
func newClient(cfg RegistryConfig) (*sr.Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("schema_registry.url: %s is not a URL", redactURL(cfg.URL))
	}
	user, pass := cfg.Username, cfg.Password
	if u.User != nil {
		if user == "" {
			user = u.User.Username()
			pass, _ = u.User.Password()
		}
		u.User = nil
	}
	tc := &tls.Config{InsecureSkipVerify: cfg.TLS.InsecureSkipVerify} //nolint:gosec // the user asked for it
	if cfg.TLS.CAFile != "" {
		pem, err := os.ReadFile(cfg.TLS.CAFile)
		if err != nil {
			return nil, fmt.Errorf("schema_registry.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("schema_registry.tls.ca_file: %s holds no PEM certificate", cfg.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	if cfg.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("schema_registry.tls.cert_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	opts := []sr.ClientOpt{
		sr.URLs(u.String()),
		sr.HTTPClient(&http.Client{Timeout: cfg.Timeout, Transport: tr}),
		sr.UserAgent("outbox-relay"),
	}
	if user != "" {
		opts = append(opts, sr.BasicAuth(user, pass))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("schema_registry.url: %w", err)
	}
	return cl, nil
}

// classify sorts a registry error: unknown subject/version/schema is
// not_found, an invalid or incompatible schema refused (both make the event
// a mismatch); anything else, network errors and 5xx, 429, 408, 401, 403
// and other statuses included, is unavailable: the event waits.
func classify(err error) string {
	if err == nil {
		return resultOK
	}
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		return resultUnavailable
	}
	switch {
	case re.StatusCode == http.StatusNotFound && re.ErrorCode >= 40400 && re.ErrorCode < 40500:
		return resultNotFound
	case re.StatusCode == http.StatusUnprocessableEntity || re.StatusCode == http.StatusConflict:
		return resultRefused
	}
	return resultUnavailable
}

// secretsOf lists what must never be printed: the password (of the config
// or the URL's userinfo) and the basic auth header's token built from it.
func secretsOf(cfg RegistryConfig) []string {
	user, pass := cfg.Username, cfg.Password
	if u, err := url.Parse(cfg.URL); err == nil && u.User != nil && user == "" {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	if pass == "" {
		return nil
	}
	return []string{pass, base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))}
}

// clean strips the secrets from a message, wherever a server or library
// may have echoed them.
func (s *Serializer) clean(msg string) string {
	for _, secret := range s.secrets {
		msg = strings.ReplaceAll(msg, secret, "[redacted]")
	}
	return msg
}

func (s *Serializer) describeErr(err error) string {
	var re *sr.ResponseError
	if errors.As(err, &re) {
		return s.clean(fmt.Sprintf("%s %s: HTTP %d, error code %d: %s", re.Method, redactURL(re.URL), re.StatusCode, re.ErrorCode, re.Error()))
	}
	return s.clean(err.Error())
}

// call runs fn until the registry answers: while it is unavailable it
// waits (backoff 100 ms doubling to 5 s) and says so through Unavailable
// and the gauge; not_found and refused answers become *MismatchError.
// Returns ctx's error (wrapped, with the last registry error) when ctx ends.
func (s *Serializer) call(ctx context.Context, subject string, fn func(context.Context) error) error {
	b := backoff.Backoff{Policy: s.policy}
	var waitStart time.Time
	defer func() {
		if !waitStart.IsZero() {
			s.m.wait.Add(s.now().Sub(waitStart).Seconds())
		}
	}()
	for {
		err := fn(ctx)
		if ctx.Err() != nil && err != nil {
			return fmt.Errorf("subject %s: waiting for the schema registry: %w (last error: %s)", subject, ctx.Err(), s.describeErr(err))
		}
		res := classify(err)
		s.m.requests.WithLabelValues(res).Inc()
		if res != resultUnavailable {
			s.markUp()
			if err != nil {
				return &MismatchError{Subject: subject, Err: errors.New(s.describeErr(err))}
			}
			return nil
		}
		if waitStart.IsZero() {
			waitStart = s.now()
		}
		s.markDown(subject, err)
		if serr := backoff.Sleep(ctx, b.Next()); serr != nil {
			return fmt.Errorf("subject %s: waiting for the schema registry: %w (last error: %s)", subject, serr, s.describeErr(err))
		}
	}
}

// once is call without the waiting: one attempt, for background refreshes
// and Decode.
func (s *Serializer) once(ctx context.Context, subject string, fn func(context.Context) error) error {
	err := fn(ctx)
	res := classify(err)
	s.m.requests.WithLabelValues(res).Inc()
	switch res {
	case resultOK:
		return nil
	case resultUnavailable:
		return fmt.Errorf("schema registry unavailable: %s", s.describeErr(err))
	}
	return &MismatchError{Subject: subject, Err: errors.New(s.describeErr(err))}
}

func (s *Serializer) markDown(subject string, err error) {
	msg := s.describeErr(err)
	s.mu.Lock()
	first := s.downSince.IsZero()
	if first {
		s.downSince = s.now()
	}
	s.lastErr = msg
	s.mu.Unlock()
	s.m.up.Set(0)
	if first {
		s.log.Warn().Str("subject", subject).Str("error", msg).Msg("schema registry unavailable: events wait for it")
	}
}

func (s *Serializer) markUp() {
	s.mu.Lock()
	since := s.downSince
	s.downSince, s.lastErr = time.Time{}, ""
	s.mu.Unlock()
	s.m.up.Set(1)
	if !since.IsZero() {
		s.log.Info().Dur("down_for", s.now().Sub(since)).Msg("schema registry answers again")
	}
}
