package sink

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

func oauthConfig(mutate func(*OAuthConfig)) Config {
	c := validConfig()
	c.SASL.Mechanism = sarama.SASLTypeOAuth
	c.SASL.OAuth = OAuthConfig{Source: TokenStatic, Token: "tok"}
	mutate(&c.SASL.OAuth)
	return c
}

// Every OAUTHBEARER setting is checked, each problem named by its key,
// and no secret is quoted.
func TestOAuthConfigValidate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"static", func(*Config) {}, nil},
		{"file", func(c *Config) { c.SASL.OAuth = OAuthConfig{Source: TokenFile, TokenFile: file} }, nil},
		{"client credentials", func(c *Config) {
			c.SASL.OAuth = OAuthConfig{Source: TokenClientCredentials, TokenURL: "https://idp.example/token", ClientID: "relay", ClientSecret: "s3cret",
				Scope: "kafka", Extensions: map[string]string{"logicalCluster": "lkc-1", "identityPoolId": "pool-2"}}
		}, nil},
		{"msk", func(c *Config) {
			c.SASL.OAuth = OAuthConfig{Source: TokenAWSMSKIAM, AWSRegion: "eu-west-1", AWSRoleARN: "arn:aws:iam::1:role/r"}
		}, nil},
		{"program's source", func(c *Config) { c.SASL.OAuth = OAuthConfig{}; c.SASL.Source = staticToken{} }, nil},

		{"no source", func(c *Config) { c.SASL.OAuth = OAuthConfig{} }, []string{"kafka.sasl.oauth.token_source"}},
		{"unknown source", func(c *Config) { c.SASL.OAuth.Source = "jwt" }, []string{"kafka.sasl.oauth.token_source"}},
		{"static without token", func(c *Config) { c.SASL.OAuth.Token = "" }, []string{"kafka.sasl.oauth.token"}},
		{"missing file", func(c *Config) { c.SASL.OAuth = OAuthConfig{Source: TokenFile, TokenFile: file + ".gone"} }, []string{"kafka.sasl.oauth.token_file"}},
		{"client credentials incomplete", func(c *Config) {
			c.SASL.OAuth = OAuthConfig{Source: TokenClientCredentials, TokenURL: "idp.example/token"}
		}, []string{"kafka.sasl.oauth.client_id", "kafka.sasl.oauth.client_secret", "kafka.sasl.oauth.token_url"}},
		{"msk without region", func(c *Config) { c.SASL.OAuth = OAuthConfig{Source: TokenAWSMSKIAM} }, []string{"kafka.sasl.oauth.aws_region"}},
		{"msk profile and role", func(c *Config) {
			c.SASL.OAuth = OAuthConfig{Source: TokenAWSMSKIAM, AWSRegion: "r", AWSProfile: "p", AWSRoleARN: "a"}
		}, []string{"kafka.sasl.oauth.aws_role_arn"}},
		{"another source's key", func(c *Config) { c.SASL.OAuth.ClientSecret = "s3cret" }, []string{"kafka.sasl.oauth.client_secret"}},
		{"bad extension", func(c *Config) { c.SASL.OAuth.Extensions = map[string]string{"auth": "x"} }, []string{"kafka.sasl.oauth.extensions"}},
		{"bad extension value", func(c *Config) { c.SASL.OAuth.Extensions = map[string]string{"a": "x\x01y"} }, []string{"kafka.sasl.oauth.extensions"}},
		{"user with OAUTHBEARER", func(c *Config) { c.SASL.Username, c.SASL.Password = "u", "s3cret" }, []string{"kafka.sasl.username", "kafka.sasl.password"}},
		{"source without OAUTHBEARER", func(c *Config) { c.SASL.Mechanism = "" }, []string{"kafka.sasl.oauth.token_source", "kafka.sasl.oauth.token"}},
		{"source with SCRAM", func(c *Config) { c.SASL.Mechanism, c.SASL.Username, c.SASL.Password = "SCRAM-SHA-512", "u", "p" },
			[]string{"kafka.sasl.oauth.token_source", "kafka.sasl.oauth.token"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := oauthConfig(func(*OAuthConfig) {})
			tt.mutate(&c)
			err := c.Validate("kafka.")
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				sc, err := saramaConfig(c)
				if err != nil {
					t.Fatalf("saramaConfig: %v", err)
				}
				if sc.Net.SASL.Mechanism != sarama.SASLTypeOAuth || sc.Net.SASL.TokenProvider == nil {
					t.Fatalf("sarama SASL %q provider %v, want OAUTHBEARER with a provider", sc.Net.SASL.Mechanism, sc.Net.SASL.TokenProvider)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %v", tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error quotes the secret: %v", err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("%d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, line := range lines {
				if !strings.HasPrefix(line, tt.want[i]+": ") {
					t.Errorf("line %q does not start with %s", line, tt.want[i])
				}
			}
		})
	}
}

func jwt(t *testing.T, claims string) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(claims)) + "."
}

func TestStaticTokenWithExtensions(t *testing.T) {
	src, err := NewTokenSource(OAuthConfig{Source: TokenStatic, Token: "abc", Extensions: map[string]string{"logicalCluster": "lkc-1"}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := saramaTokens{src}.Token()
	if err != nil {
		t.Fatal(err)
	}
	if tok.Token != "abc" || tok.Extensions["logicalCluster"] != "lkc-1" {
		t.Fatalf("token %+v", tok)
	}
}

// A token file replaced (as a projected service account token is) is read
// again at the next authentication; an unchanged one is not re-read.
func TestFileTokenRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	first := jwt(t, fmt.Sprintf(`{"sub":"relay","exp":%d}`, exp.Unix()))
	if err := os.WriteFile(path, []byte(first+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src, _ := NewTokenSource(OAuthConfig{Source: TokenFile, TokenFile: path})
	tok, err := src.Token(context.Background())
	if err != nil || tok.Value != first || !tok.Expiry.Equal(exp) {
		t.Fatalf("first read: %q %v %v, want the file's JWT expiring %v", tok.Value, tok.Expiry, err, exp)
	}
	// Replaced by a rename, as kubelet does.
	second := jwt(t, `{"sub":"relay","exp":4102444800}`)
	tmp := filepath.Join(dir, "token.new")
	if err := os.WriteFile(tmp, []byte(second), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, time.Now().Add(time.Minute), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if tok, err = src.Token(context.Background()); err != nil || tok.Value != second {
		t.Fatalf("after the rotation: %q %v, want the new token", tok.Value, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err = src.Token(context.Background()); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("missing file: %v, want an error naming %s", err, path)
	}
	if IsAuthError(err) {
		t.Errorf("a missing token file is an auth error (it may come back): %v", err)
	}
}

// The client credentials grant: the client authenticates with HTTP basic,
// asks for its scope, and the token is kept until 80% of expires_in.
func TestClientCredentialsToken(t *testing.T) {
	var issued atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, secret, ok := r.BasicAuth()
		_ = r.ParseForm()
		if !ok || id != "relay" || secret != "s3cret" || r.Form.Get("grant_type") != "client_credentials" || r.Form.Get("scope") != "kafka" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":"invalid_client","error_description":"bad secret %s"}`, secret)
			return
		}
		n := issued.Add(1)
		fmt.Fprintf(w, `{"access_token":"tok-%d","token_type":"Bearer","expires_in":100}`, n)
	}))
	defer srv.Close()
	cfg := OAuthConfig{Source: TokenClientCredentials, TokenURL: srv.URL + "/token", ClientID: "relay", ClientSecret: "s3cret", Scope: "kafka"}
	src, _ := NewTokenSource(cfg)
	clock := time.Now()
	src.(*cachedToken).now = func() time.Time { return clock }
	get := func() Token {
		t.Helper()
		tok, err := src.Token(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if tok := get(); tok.Value != "tok-1" || tok.Expiry.Before(clock.Add(99*time.Second)) {
		t.Fatalf("first token %q expiring %v", tok.Value, tok.Expiry)
	}
	clock = clock.Add(79 * time.Second)
	if tok := get(); tok.Value != "tok-1" {
		t.Fatalf("at 79%% of its life: %q, want the cached tok-1", tok.Value)
	}
	clock = clock.Add(2 * time.Second)
	if tok := get(); tok.Value != "tok-2" {
		t.Fatalf("at 81%% of its life: %q, want a fresh tok-2", tok.Value)
	}
	if issued.Load() != 2 {
		t.Fatalf("%d tokens issued, want 2", issued.Load())
	}

	cfg.ClientSecret = "wrong-s3cret"
	bad, _ := NewTokenSource(cfg)
	_, err := bad.Token(context.Background())
	var te *TokenEndpointError
	if !errors.As(err, &te) || te.Status != 401 || te.Code != "invalid_client" {
		t.Fatalf("refused client: %v, want a TokenEndpointError 401 invalid_client", err)
	}
	if msg := err.Error(); !strings.Contains(msg, srv.URL+"/token") || !strings.Contains(msg, "401") || strings.Contains(msg, "s3cret") {
		t.Fatalf("error %q must name the URL and status and not the secret", msg)
	}
	if !IsAuthError(err) {
		t.Error("a refused client is not an auth error")
	}
	if reason, kind := Classify(fmt.Errorf("SASL OAUTHBEARER with broker b:1: %w", err)); reason != "authorization" || kind != Refused {
		t.Errorf("Classify = %s %v, want authorization Refused", reason, kind)
	}
}

// An endpoint that fails or answers nonsense is a transient error naming
// the URL; a down endpoint too.
func TestClientCredentialsErrors(t *testing.T) {
	var answer atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := answer.Load().([2]string)
		var code int
		fmt.Sscan(a[0], &code)
		w.WriteHeader(code)
		io.WriteString(w, a[1])
	}))
	url := srv.URL + "/oauth2/token"
	cases := []struct {
		status, body, want string
	}{
		{"500", `{"error":"server_error"}`, "HTTP 500 (server_error)"},
		{"200", `not json`, "without an access_token"},
		{"200", `{"access_token":"x","token_type":"mac"}`, `"mac" token`},
	}
	for _, c := range cases {
		answer.Store([2]string{c.status, c.body})
		src, _ := NewTokenSource(OAuthConfig{Source: TokenClientCredentials, TokenURL: url, ClientID: "relay", ClientSecret: "s3cret"})
		_, err := src.Token(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), url) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s %s: %v, want %q naming %s", c.status, c.body, err, c.want, url)
		}
		if IsAuthError(err) {
			t.Errorf("%s %s: %v is an auth error, want transient", c.status, c.body, err)
		}
	}
	srv.Close()
	src, _ := NewTokenSource(OAuthConfig{Source: TokenClientCredentials, TokenURL: url, ClientID: "relay", ClientSecret: "s3cret"})
	if _, err := src.Token(context.Background()); err == nil || !strings.Contains(err.Error(), url) || IsAuthError(err) {
		t.Errorf("endpoint down: %v, want a transient error naming %s", err, url)
	}
}

// With AWS credentials in the environment (fake ones: offline) the MSK IAM
// source signs a kafka-cluster:Connect presigned URL for the region.
func TestMSKIAMToken(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAOUTBOXRELAYTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-key")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	src, err := NewTokenSource(OAuthConfig{Source: TokenAWSMSKIAM, AWSRegion: "eu-west-1"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tok, err := src.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok.Value)
	if err != nil {
		t.Fatalf("token is not base64url: %v", err)
	}
	u, err := url.Parse(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if u.Host != "kafka.eu-west-1.amazonaws.com" || q.Get("Action") != "kafka-cluster:Connect" ||
		!strings.HasPrefix(q.Get("X-Amz-Credential"), "AKIAOUTBOXRELAYTEST/") || !strings.Contains(q.Get("X-Amz-Credential"), "/eu-west-1/kafka-cluster/") ||
		len(q.Get("X-Amz-Signature")) != 64 {
		t.Fatalf("presigned URL %s lacks the MSK action, credential or signature", u)
	}
	if strings.Contains(string(raw), "fake-secret-key") {
		t.Fatal("the token holds the secret key")
	}
	if d := tok.Expiry.Sub(start); d < 14*time.Minute || d > 16*time.Minute {
		t.Errorf("expiry in %v, want about 15 minutes", d)
	}
	again, _ := src.Token(context.Background())
	if again.Value != tok.Value {
		t.Error("a second call within the token's life signed a new one")
	}

	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	src, _ = NewTokenSource(OAuthConfig{Source: TokenAWSMSKIAM, AWSRegion: "eu-west-1", AWSProfile: "missing"})
	if _, err := src.Token(context.Background()); err == nil || !strings.Contains(err.Error(), "eu-west-1") {
		t.Errorf("no credentials: %v, want an error naming the region", err)
	}
}

// fakeBroker answers the wire's SASL requests with reply(api, body), one
// at a time under mu (the test reads what reply saw under it too).
func fakeBroker(t *testing.T, mu *sync.Mutex, reply func(api int16, body []byte) []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for {
			var size [4]byte
			if _, err := io.ReadFull(c, size[:]); err != nil {
				return
			}
			req := make([]byte, binary.BigEndian.Uint32(size[:]))
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			api, corr := int16(binary.BigEndian.Uint16(req)), req[4:8]
			idLen := int(binary.BigEndian.Uint16(req[8:]))
			mu.Lock()
			body := reply(api, req[10+idLen:])
			mu.Unlock()
			out := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
			out = append(append(out, corr...), body...)
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}()
	return ln.Addr().String()
}

func saslAuthReply(code int16, msg string, auth []byte, life int64) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(code))
	if msg == "" {
		b = binary.BigEndian.AppendUint16(b, 0xffff)
	} else {
		b = appendString(b, msg)
	}
	b = appendBytes(b, auth)
	return binary.BigEndian.AppendUint64(b, uint64(life))
}

func oauthSarama(t *testing.T, token string) *sarama.Config {
	t.Helper()
	c := oauthConfig(func(o *OAuthConfig) {
		o.Token = token
		o.Extensions = map[string]string{"logicalCluster": "lkc-1", "identityPoolId": "pool-2"}
	})
	sc, err := saramaConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = 5*time.Second, 5*time.Second, 5*time.Second
	return sc
}

// The direct engine's wire sends the RFC 7628 initial client response with
// the extensions and takes the broker's session lifetime (KIP-368).
func TestWireOAuthBearer(t *testing.T) {
	var got []byte
	var mu sync.Mutex
	addr := fakeBroker(t, &mu, func(api int16, body []byte) []byte {
		switch api {
		case apiSaslHandshake:
			if string(body[2:]) != "OAUTHBEARER" {
				return binary.BigEndian.AppendUint16(nil, uint16(sarama.ErrUnsupportedSASLMechanism))
			}
			return []byte{0, 0, 0, 0, 0, 0}
		case apiSaslAuthenticate:
			got = append([]byte(nil), body[4:]...)
			return saslAuthReply(0, "", nil, 60_000)
		}
		return nil
	})
	w, err := dialWire(addr, oauthSarama(t, "the.jwt.token"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	mu.Lock()
	defer mu.Unlock()
	want := "n,,\x01auth=Bearer the.jwt.token\x01identityPoolId=pool-2\x01logicalCluster=lkc-1\x01\x01"
	if string(got) != want {
		t.Fatalf("client first message %q, want %q", got, want)
	}
	if d := time.Until(w.reauth); d < 50*time.Second || d > 55*time.Second {
		t.Errorf("re-authentication in %v, want 90%% of the 60s session", d)
	}
}

// A refused token: the broker answers a JSON status, the wire sends %x01,
// the broker fails the exchange; the error is an auth error (Refused),
// names the mechanism and the broker's status, never the token.
func TestWireOAuthBearerRefused(t *testing.T) {
	var steps []string
	var mu sync.Mutex
	addr := fakeBroker(t, &mu, func(api int16, body []byte) []byte {
		switch api {
		case apiSaslHandshake:
			return []byte{0, 0, 0, 0, 0, 0}
		case apiSaslAuthenticate:
			msg := body[4:]
			steps = append(steps, string(msg))
			if bytes.Equal(msg, []byte{1}) {
				return saslAuthReply(int16(sarama.ErrSASLAuthenticationFailed), "Authentication failed during authentication due to invalid credentials with SASL mechanism OAUTHBEARER", nil, 0)
			}
			return saslAuthReply(0, "", []byte(`{"status":"invalid_token"}`), 0)
		}
		return nil
	})
	_, err := dialWire(addr, oauthSarama(t, "expired.jwt.secret"))
	if err == nil {
		t.Fatal("a refused token authenticated")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(steps) != 2 || steps[1] != "\x01" {
		t.Fatalf("client steps %q, want the first message then %%x01", steps)
	}
	msg := err.Error()
	if !IsAuthError(err) || !strings.Contains(msg, "OAUTHBEARER") || !strings.Contains(msg, "invalid_token") || strings.Contains(msg, "expired.jwt.secret") {
		t.Fatalf("error %q: want an auth error naming OAUTHBEARER and the status, without the token", msg)
	}
	if reason, kind := Classify(err); reason != "authorization" || kind != Refused {
		t.Errorf("Classify = %s %v, want authorization Refused", reason, kind)
	}
	if e := authError(oauthConfig(func(*OAuthConfig) {}).SASL, err); !strings.Contains(e.Error(), "kafka.sasl.oauth") {
		t.Errorf("authError %q does not name kafka.sasl.oauth", e)
	}
}

// sarama retries a produce the broker refused for the credentials
// silently (kafka.producer: sarama, exactly-once): the relay warns, once
// per authWarnEvery, and counts it as authorization.
func TestSaramaLogWarnsOnRefusedCredentials(t *testing.T) {
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	if _, err := New(validConfig(), zerolog.New(&buf), reg); err != nil {
		t.Fatal(err)
	}
	refused := fmt.Errorf("%w: Authentication failed due to invalid credentials with SASL mechanism OAUTHBEARER", sarama.ErrSASLAuthenticationFailed)
	for range 3 {
		sarama.Logger.Printf("producer/broker/%d state change to [closing] because %s\n", int32(1), refused)
	}
	if n := strings.Count(buf.String(), "kafka refused the relay's SASL credentials"); n != 1 {
		t.Fatalf("%d warnings for 3 refused retries within %s, want 1:\n%s", n, authWarnEvery, buf.String())
	}
	// A connection whose authentication failed (the client's coordinator
	// and metadata lookups) warns too, once the interval passed.
	buf.Reset()
	saramaTarget.Load().authWarned.Store(0)
	sarama.DebugLogger.Printf("Closed connection to broker %s due to SASL v1 auth error: %s\n", "b:9092", refused)
	if !strings.Contains(buf.String(), "kafka refused the relay's SASL credentials") || !strings.Contains(buf.String(), "OAUTHBEARER") {
		t.Fatalf("no warning for a connection refused at authentication:\n%s", buf.String())
	}
	if got := counterValues(t, reg)["outbox_relay_publish_errors_total{reason=authorization}"]; got != 3 {
		t.Errorf("authorization errors counted %v, want 3", got)
	}
}
