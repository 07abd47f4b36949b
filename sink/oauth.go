package sink

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/aws/aws-msk-iam-sasl-signer-go/signer"
)

// Token is one SASL/OAUTHBEARER credential. Value is a secret: it never
// goes into a log, an error or a metric.
type Token struct {
	Value string
	// Expiry is when the token stops being valid; zero when unknown.
	Expiry time.Time
	// Extensions are sent with the token (RFC 7628 key=value pairs), e.g.
	// Confluent Cloud's logicalCluster and identityPoolId.
	Extensions map[string]string
}

// TokenSource gives the token for the next SASL authentication. Called
// from any goroutine whenever a broker connection authenticates or
// re-authenticates (KIP-368), so it caches: it returns the same token until
// that one is close to its expiry. It blocks at most until ctx ends. An
// error must not contain the token or any other secret.
type TokenSource interface {
	Token(ctx context.Context) (Token, error)
}

// The values of kafka.sasl.oauth.token_source.
const (
	TokenStatic            = "static"
	TokenFile              = "file"
	TokenClientCredentials = "client_credentials"
	TokenAWSMSKIAM         = "aws_msk_iam"
)

// OAuthConfig chooses and configures the built-in TokenSource of
// kafka.sasl.mechanism OAUTHBEARER.
type OAuthConfig struct {
	// Source is static, file, client_credentials or aws_msk_iam.
	Source string `yaml:"token_source"`
	// Token is the static token: a secret (OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN).
	Token string `yaml:"token"`
	// TokenFile holds the token (e.g. a Kubernetes projected service account
	// token); read again whenever it changes.
	TokenFile string `yaml:"token_file"`
	// TokenURL, ClientID, ClientSecret and Scope: the OAuth 2 client
	// credentials grant (RFC 6749 4.4). ClientSecret is a secret.
	TokenURL     string `yaml:"token_url"`
	ClientID     string `yaml:"client_id"`
	ClientSecret string `yaml:"client_secret"`
	Scope        string `yaml:"scope"`
	// Extensions are sent with every token (SASL extensions).
	Extensions map[string]string `yaml:"extensions"`
	// AWSRegion is the MSK cluster's region (aws_msk_iam); credentials come
	// from the default AWS chain, or AWSProfile, or by assuming AWSRoleARN.
	AWSRegion  string `yaml:"aws_region"`
	AWSProfile string `yaml:"aws_profile"`
	AWSRoleARN string `yaml:"aws_role_arn"`
}

var tokenSources = []string{TokenStatic, TokenFile, TokenClientCredentials, TokenAWSMSKIAM}

func (c OAuthConfig) validate(bad func(key, format string, a ...any)) {
	need := func(key, val, why string) {
		if val == "" {
			bad("sasl.oauth."+key, "is empty but kafka.sasl.oauth.token_source is %s%s", c.Source, why)
		}
	}
	unused := func(key, val string, sources ...string) {
		if val != "" && !slices.Contains(sources, c.Source) {
			bad("sasl.oauth."+key, "is set but kafka.sasl.oauth.token_source is %q: it is used only by %s", c.Source, strings.Join(sources, ", "))
		}
	}
	switch c.Source {
	case TokenStatic:
		need("token", c.Token, " (set OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN)")
	case TokenFile:
		need("token_file", c.TokenFile, "")
		if c.TokenFile != "" {
			if _, err := os.Stat(c.TokenFile); err != nil {
				bad("sasl.oauth.token_file", "%s cannot be read: %v", c.TokenFile, errors.Unwrap(err))
			}
		}
	case TokenClientCredentials:
		need("token_url", c.TokenURL, "")
		need("client_id", c.ClientID, "")
		need("client_secret", c.ClientSecret, " (set OUTBOX_RELAY_KAFKA_SASL_OAUTH_CLIENT_SECRET)")
		if c.TokenURL != "" {
			if u, err := url.Parse(c.TokenURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				bad("sasl.oauth.token_url", "%q is not an http(s) URL", c.TokenURL)
			}
		}
	case TokenAWSMSKIAM:
		need("aws_region", c.AWSRegion, " (e.g. us-east-1)")
		if c.AWSProfile != "" && c.AWSRoleARN != "" {
			bad("sasl.oauth.aws_role_arn", "and kafka.sasl.oauth.aws_profile are both set: choose one")
		}
	case "":
		bad("sasl.oauth.token_source", "is empty but kafka.sasl.mechanism is OAUTHBEARER: use one of %s", strings.Join(tokenSources, ", "))
		return
	default:
		bad("sasl.oauth.token_source", "%q is not one of %s", c.Source, strings.Join(tokenSources, ", "))
		return
	}
	unused("token", c.Token, TokenStatic)
	unused("token_file", c.TokenFile, TokenFile)
	unused("token_url", c.TokenURL, TokenClientCredentials)
	unused("client_id", c.ClientID, TokenClientCredentials)
	unused("client_secret", c.ClientSecret, TokenClientCredentials)
	unused("scope", c.Scope, TokenClientCredentials)
	unused("aws_region", c.AWSRegion, TokenAWSMSKIAM)
	unused("aws_profile", c.AWSProfile, TokenAWSMSKIAM)
	unused("aws_role_arn", c.AWSRoleARN, TokenAWSMSKIAM)
	for k, v := range c.Extensions {
		// RFC 7628 3.1: key 1*ALPHA, value printable ASCII and spaces; "auth" is the token's.
		if k == "" || k == "auth" || strings.IndexFunc(k, func(r rune) bool { return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') }) >= 0 {
			bad("sasl.oauth.extensions", "key %q is not letters only (or is the reserved auth)", k)
		}
		if strings.IndexFunc(v, func(r rune) bool { return r < 0x20 && r != '\t' && r != '\r' && r != '\n' || r > 0x7e }) >= 0 {
			bad("sasl.oauth.extensions", "value of %q has a control or non-ASCII character", k)
		}
	}
	if c.Source == TokenAWSMSKIAM && len(c.Extensions) > 0 {
		bad("sasl.oauth.extensions", "is set but AWS MSK IAM takes none")
	}
}

// unused names each kafka.sasl.oauth key that is set while the mechanism
// is not OAUTHBEARER.
func (c OAuthConfig) unused(bad func(key, format string, a ...any), mechanism string) {
	set := []struct {
		key string
		on  bool
	}{{"token_source", c.Source != ""}, {"token", c.Token != ""}, {"token_file", c.TokenFile != ""}, {"token_url", c.TokenURL != ""},
		{"client_id", c.ClientID != ""}, {"client_secret", c.ClientSecret != ""}, {"scope", c.Scope != ""},
		{"extensions", len(c.Extensions) > 0}, {"aws_region", c.AWSRegion != ""}, {"aws_profile", c.AWSProfile != ""},
		{"aws_role_arn", c.AWSRoleARN != ""}}
	for _, f := range set {
		if f.on {
			bad("sasl.oauth."+f.key, "is set but kafka.sasl.mechanism is %s, not OAUTHBEARER", mechanism)
		}
	}
}

// NewTokenSource builds the built-in TokenSource c names. It does no I/O:
// the first token is fetched by the first authentication.
func NewTokenSource(c OAuthConfig) (TokenSource, error) {
	var src TokenSource
	switch c.Source {
	case TokenStatic:
		src = staticToken{Token{Value: c.Token}}
	case TokenFile:
		src = &fileToken{path: c.TokenFile}
	case TokenClientCredentials:
		src = &cachedToken{fetch: clientCredentials{url: c.TokenURL, id: c.ClientID, secret: c.ClientSecret, scope: c.Scope,
			client: &http.Client{Timeout: 15 * time.Second}}.fetch}
	case TokenAWSMSKIAM:
		src = &cachedToken{fetch: mskIAM{region: c.AWSRegion, profile: c.AWSProfile, role: c.AWSRoleARN}.fetch}
	default:
		return nil, fmt.Errorf("kafka.sasl.oauth.token_source: %q is not one of %s", c.Source, strings.Join(tokenSources, ", "))
	}
	if len(c.Extensions) > 0 {
		src = withExtensions{src, maps.Clone(c.Extensions)}
	}
	return src, nil
}

type staticToken struct{ t Token }

func (s staticToken) Token(context.Context) (Token, error) { return s.t, nil }

type withExtensions struct {
	src TokenSource
	ext map[string]string
}

func (w withExtensions) Token(ctx context.Context) (Token, error) {
	t, err := w.src.Token(ctx)
	if err != nil {
		return t, err
	}
	ext := maps.Clone(w.ext)
	maps.Copy(ext, t.Extensions) // the source's own win
	t.Extensions = ext
	return t, nil
}

// fileToken reads the token from a file and again whenever its size or
// modification time changes: a projected token is replaced in place by a
// rename, so the new one is read at the next authentication.
type fileToken struct {
	path string
	mu   sync.Mutex
	mod  time.Time
	size int64
	tok  Token
}

func (f *fileToken) Token(context.Context) (Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.path)
	if err != nil {
		return Token{}, fmt.Errorf("read OAUTHBEARER token file %s: %w", f.path, errors.Unwrap(err))
	}
	if f.tok.Value != "" && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return f.tok, nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return Token{}, fmt.Errorf("read OAUTHBEARER token file %s: %w", f.path, errors.Unwrap(err))
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return Token{}, fmt.Errorf("OAUTHBEARER token file %s is empty", f.path)
	}
	f.tok, f.mod, f.size = Token{Value: v, Expiry: jwtExpiry(v)}, st.ModTime(), st.Size()
	return f.tok, nil
}

// jwtExpiry is the exp claim of a JWT, zero if v is not one: for the
// operator's information (check); the broker decides.
func jwtExpiry(v string) time.Time {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	b, err := decodeSegment(parts[1])
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp float64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}
	}
	return time.Unix(int64(claims.Exp), 0)
}

// cachedToken keeps the token fetch returned until 80% of its lifetime
// has passed (a token without an expiry: for an hour), so reconnects and
// re-authentications do not each ask the issuer.
type cachedToken struct {
	fetch   func(ctx context.Context) (Token, error)
	now     func() time.Time // tests
	mu      sync.Mutex
	tok     Token
	refresh time.Time
}

func (c *cachedToken) Token(ctx context.Context) (Token, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	t0 := now()
	if c.tok.Value != "" && t0.Before(c.refresh) {
		return c.tok, nil
	}
	t, err := c.fetch(ctx)
	if err != nil {
		return Token{}, err
	}
	c.tok = t
	c.refresh = t0.Add(time.Hour)
	if !t.Expiry.IsZero() {
		c.refresh = t0.Add(t.Expiry.Sub(t0) * 8 / 10)
	}
	return t, nil
}

// TokenEndpointError is a refusal by the OAuth token endpoint: it names
// the URL, the HTTP status and the OAuth error code, never the secret.
type TokenEndpointError struct {
	URL    string
	Status int
	Code   string // the response's "error", e.g. invalid_client
}

func (e *TokenEndpointError) Error() string {
	s := fmt.Sprintf("OAuth token endpoint %s answered HTTP %d", e.URL, e.Status)
	if e.Code != "" {
		s += " (" + e.Code + ")"
	}
	return s
}

// refused reports whether the endpoint refused the client itself (wrong
// id, secret or scope): retrying cannot help.
func (e *TokenEndpointError) refused() bool {
	return e.Status == http.StatusBadRequest || e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
}

type clientCredentials struct {
	url, id, secret, scope string
	client                 *http.Client
}

func (c clientCredentials) fetch(ctx context.Context) (Token, error) {
	form := url.Values{"grant_type": {"client_credentials"}}
	if c.scope != "" {
		form.Set("scope", c.scope)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(form.Encode()))
	if err != nil {
		return Token{}, fmt.Errorf("OAuth token request to %s: %w", c.url, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	// RFC 6749 2.3.1: client_secret_basic, the id and secret form-encoded first.
	req.SetBasicAuth(url.QueryEscape(c.id), url.QueryEscape(c.secret))
	start := time.Now()
	resp, err := c.client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // url.Error repeats the URL
		}
		return Token{}, fmt.Errorf("OAuth token request to %s: %w", c.url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Token{}, fmt.Errorf("OAuth token response from %s: %w", c.url, err)
	}
	var r struct {
		AccessToken string  `json:"access_token"`
		TokenType   string  `json:"token_type"`
		ExpiresIn   float64 `json:"expires_in"`
		Error       string  `json:"error"`
	}
	jerr := json.Unmarshal(body, &r)
	if resp.StatusCode != http.StatusOK {
		code := r.Error
		if len(code) > 64 || strings.ContainsAny(code, "\x00\n") {
			code = ""
		}
		return Token{}, &TokenEndpointError{URL: c.url, Status: resp.StatusCode, Code: code}
	}
	if jerr != nil || r.AccessToken == "" {
		return Token{}, fmt.Errorf("OAuth token endpoint %s answered HTTP 200 without an access_token in JSON", c.url)
	}
	if r.TokenType != "" && !strings.EqualFold(r.TokenType, "bearer") {
		return Token{}, fmt.Errorf("OAuth token endpoint %s issued a %q token, not a Bearer token", c.url, r.TokenType)
	}
	t := Token{Value: r.AccessToken, Expiry: jwtExpiry(r.AccessToken)}
	if r.ExpiresIn > 0 {
		t.Expiry = start.Add(time.Duration(r.ExpiresIn * float64(time.Second)))
	}
	return t, nil
}

type mskIAM struct{ region, profile, role string }

func (m mskIAM) fetch(ctx context.Context) (Token, error) {
	var (
		v   string
		exp int64
		err error
	)
	switch {
	case m.role != "":
		v, exp, err = signer.GenerateAuthTokenFromRole(ctx, m.region, m.role, "outbox-relay")
	case m.profile != "":
		v, exp, err = signer.GenerateAuthTokenFromProfile(ctx, m.region, m.profile)
	default:
		v, exp, err = signer.GenerateAuthToken(ctx, m.region)
	}
	if err != nil {
		return Token{}, fmt.Errorf("sign AWS MSK IAM token for region %s: %w", m.region, err)
	}
	return Token{Value: v, Expiry: time.UnixMilli(exp)}, nil
}

// saramaTokens adapts a TokenSource to sarama's AccessTokenProvider; the
// direct engine's wire calls it too.
type saramaTokens struct{ src TokenSource }

// tokenTimeout bounds one Token call: sarama's contract asks for an
// error rather than an indefinite block.
const tokenTimeout = 20 * time.Second

func (s saramaTokens) Token() (*sarama.AccessToken, error) {
	ctx, cancel := context.WithTimeout(context.Background(), tokenTimeout)
	defer cancel()
	t, err := s.src.Token(ctx)
	if err != nil {
		return nil, fmt.Errorf("get OAUTHBEARER token: %w", err)
	}
	return &sarama.AccessToken{Token: t.Value, Extensions: t.Extensions}, nil
}

// oauthClientFirst is the RFC 7628 initial client response: gs2 header,
// auth=Bearer <token>, then the extensions sorted by key.
func oauthClientFirst(t *sarama.AccessToken) []byte {
	var b bytes.Buffer
	b.WriteString("n,,\x01auth=Bearer ")
	b.WriteString(t.Token)
	b.WriteByte(1)
	for _, k := range slices.Sorted(maps.Keys(t.Extensions)) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(t.Extensions[k])
		b.WriteByte(1)
	}
	b.WriteByte(1)
	return b.Bytes()
}

func decodeSegment(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}
