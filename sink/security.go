package sink

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// SASLConfig authenticates the producer. Mechanism "" means no SASL.
type SASLConfig struct {
	Mechanism string `yaml:"mechanism"` // PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER
	Username  string `yaml:"username"`
	// Password is a secret: it is redacted from the logged config and never
	// appears in errors. Prefer OUTBOX_RELAY_KAFKA_SASL_PASSWORD over the file.
	Password string `yaml:"password"`
	// OAuth configures the token of OAUTHBEARER.
	OAuth OAuthConfig `yaml:"oauth"`
	// Source, when set, gives the OAUTHBEARER tokens instead of the
	// built-in source OAuth names (for programs that embed the relay).
	Source TokenSource `yaml:"-"`
}

// mechanisms lists the values of kafka.sasl.mechanism, for errors.
const mechanisms = "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"

// TLSConfig encrypts (and optionally authenticates) the broker connections.
type TLSConfig struct {
	Enabled            bool   `yaml:"enabled"`
	CAFile             string `yaml:"ca_file"`   // PEM; empty = system roots
	CertFile           string `yaml:"cert_file"` // PEM client certificate for mTLS
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

func (c SASLConfig) validate(bad func(key, format string, a ...any)) {
	switch c.Mechanism {
	case "":
		// Credentials without a mechanism are a half-done setup, not a default.
		if c.Username != "" {
			bad("sasl.username", "is set but kafka.sasl.mechanism is empty: set the mechanism (%s)", mechanisms)
		}
		if c.Password != "" {
			bad("sasl.password", "is set but kafka.sasl.mechanism is empty: set the mechanism (%s)", mechanisms)
		}
		c.OAuth.unused(bad, "empty")
		return
	case sarama.SASLTypeOAuth:
		if c.Username != "" {
			bad("sasl.username", "is set but kafka.sasl.mechanism is OAUTHBEARER, which authenticates with a token (kafka.sasl.oauth.*)")
		}
		if c.Password != "" {
			bad("sasl.password", "is set but kafka.sasl.mechanism is OAUTHBEARER, which authenticates with a token (kafka.sasl.oauth.*)")
		}
		if c.Source == nil {
			c.OAuth.validate(bad)
		}
		return
	case sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512:
	default:
		bad("sasl.mechanism", "%q is not one of %s", c.Mechanism, mechanisms)
		return
	}
	c.OAuth.unused(bad, c.Mechanism)
	if c.Username == "" {
		bad("sasl.username", "is empty but sasl.mechanism is %s", c.Mechanism)
	}
	if c.Password == "" {
		bad("sasl.password", "is empty but sasl.mechanism is %s (set OUTBOX_RELAY_KAFKA_SASL_PASSWORD)", c.Mechanism)
	}
}

func (c TLSConfig) validate(bad func(key, format string, a ...any)) {
	files := []struct{ key, path string }{{"tls.ca_file", c.CAFile}, {"tls.cert_file", c.CertFile}, {"tls.key_file", c.KeyFile}}
	if !c.Enabled {
		for _, f := range files {
			if f.path != "" {
				bad(f.key, "is set but kafka.tls.enabled is false: enable TLS or remove it")
			}
		}
		if c.ServerName != "" {
			bad("tls.server_name", "is set but kafka.tls.enabled is false: enable TLS or remove it")
		}
		return
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		bad("tls.cert_file", "cert_file and key_file must be set together")
	}
	for _, f := range files {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				bad(f.key, "%s cannot be read: %v", f.path, errors.Unwrap(err))
			}
		}
	}
}

// applySecurity sets sarama's TLS and SASL options.
func applySecurity(cfg Config, sc *sarama.Config) error {
	if cfg.TLS.Enabled {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLS.ServerName,
			InsecureSkipVerify: cfg.TLS.InsecureSkipVerify} //nolint:gosec // operator's explicit choice
		if cfg.TLS.CAFile != "" {
			pem, err := os.ReadFile(cfg.TLS.CAFile)
			if err != nil {
				return fmt.Errorf("kafka.tls.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("kafka.tls.ca_file: %s holds no PEM certificate", cfg.TLS.CAFile)
			}
			tc.RootCAs = pool
		}
		if cfg.TLS.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
			if err != nil {
				return fmt.Errorf("kafka.tls.cert_file/key_file: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = tc
	}
	if m := cfg.SASL.Mechanism; m != "" {
		sc.Net.SASL.Enable = true
		sc.Net.SASL.Handshake = true
		sc.Net.SASL.Mechanism = sarama.SASLMechanism(m)
		sc.Net.SASL.User = cfg.SASL.Username
		sc.Net.SASL.Password = cfg.SASL.Password
		switch m {
		case sarama.SASLTypeOAuth:
			src := cfg.SASL.Source
			if src == nil {
				var err error
				if src, err = NewTokenSource(cfg.SASL.OAuth); err != nil {
					return err
				}
			}
			sc.Net.SASL.TokenProvider = saramaTokens{src}
		case sarama.SASLTypeSCRAMSHA256:
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha256.New)} }
		case sarama.SASLTypeSCRAMSHA512:
			sc.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: scram.HashGeneratorFcn(sha512.New)} }
		}
	}
	return nil
}

// scramClient adapts xdg-go/scram to sarama's SCRAMClient.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

func (c *scramClient) Begin(user, password, authzID string) error {
	client, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return fmt.Errorf("prepare SCRAM for user %q: %w", user, err)
	}
	c.conv = client.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) { return c.conv.Step(challenge) }
func (c *scramClient) Done() bool                            { return c.conv.Done() }

// IsAuthError reports whether err means the broker refused our credentials:
// retrying cannot fix that, so the relay stops and says which keys to check.
// A token endpoint that refuses the relay's client (HTTP 400, 401, 403)
// is one too.
func IsAuthError(err error) bool {
	var te *TokenEndpointError
	return errors.Is(err, sarama.ErrSASLAuthenticationFailed) || errors.Is(err, sarama.ErrIllegalSASLState) ||
		errors.Is(err, sarama.ErrUnsupportedSASLMechanism) || (errors.As(err, &te) && te.refused())
}

// authError explains a refusal of the relay's SASL credentials by the
// broker (or the token endpoint) and names the keys to check.
func authError(c SASLConfig, err error) error {
	if c.Mechanism == sarama.SASLTypeOAuth {
		src := c.OAuth.Source
		if c.Source != nil {
			src = "set by the program"
		}
		return fmt.Errorf("kafka refused the relay's SASL OAUTHBEARER authentication (token source %s): %w; check kafka.sasl.oauth.* and that the token is valid, unexpired and meant for this cluster", src, err)
	}
	return fmt.Errorf("kafka refused the credentials of user %q (SASL %s): %w; check kafka.sasl.username and kafka.sasl.password (OUTBOX_RELAY_KAFKA_SASL_PASSWORD)",
		c.Username, c.Mechanism, err)
}
