//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/preflight"
)

// unsecuredJWT is a token Kafka's default OAUTHBEARER validator (the
// unsecured one: alg none) accepts until exp.
func unsecuredJWT(sub string, iat, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." +
		enc([]byte(fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, sub, iat.Unix(), exp.Unix()))) + "."
}

func oauthBrokers(t *testing.T) string {
	t.Helper()
	sasl := svcs.Get("OUTBOX_TEST_KAFKA_SASL_BROKERS")
	if sasl == "" || !strings.Contains(svcs.Get("OUTBOX_TEST_KAFKA_SASL_MECHANISMS"), "OAUTHBEARER") {
		t.Fatal("OUTBOX_TEST_KAFKA_SASL_BROKERS / _MECHANISMS without OAUTHBEARER: test/services.sh must enable it on the SASL listener")
	}
	return sasl
}

// noSecret fails t if log holds any of secrets.
func noSecret(t *testing.T, what, log string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(log, s) {
			t.Errorf("%s contains a secret (token or client secret)", what)
			return
		}
	}
}

// SASL/OAUTHBEARER against the real broker (Kafka's unsecured JWT
// validator, sessions of at most 10 s): the relay publishes through it with
// the direct engine (a token file rewritten with short-lived tokens) and in
// exactly-once mode (a client credentials endpoint the test runs); both
// keep going past the first tokens' expiry, so the refreshed tokens were
// used. An expired token stops the relay at start, and halts a running
// one, naming the mechanism and the keys, never the token.
func TestSASLOAuthBearer(t *testing.T) {
	t.Parallel() // own outboxes, relays and topics; no service fault, no shared proxy
	sasl := oauthBrokers(t)
	const lifetime = 12 * time.Second // the broker's sessions: min(10 s, the token's)

	t.Run("file/direct", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "oauthfile")
		path := filepath.Join(t.TempDir(), "token")
		var mu sync.Mutex
		var issued []string
		rotate := func(exp time.Time) {
			tok := unsecuredJWT("relay", time.Now(), exp)
			tmp := path + ".new"
			if err := os.WriteFile(tmp, []byte(tok), 0o600); err == nil {
				_ = os.Rename(tmp, path) // as kubelet replaces a projected token
			}
			mu.Lock()
			issued = append(issued, tok)
			mu.Unlock()
		}
		rotate(time.Now().Add(lifetime))
		ctx, cancel := context.WithCancel(context.Background())
		rotated := make(chan struct{})
		go func() {
			defer close(rotated)
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(3 * time.Second):
					rotate(time.Now().Add(lifetime))
				}
			}
		}()
		stopRotating := func() { cancel(); <-rotated }
		defer stopRotating()

		args := []string{"--kafka-brokers", sasl, "--kafka-sasl-mechanism", "OAUTHBEARER",
			"--kafka-sasl-oauth-token-source", "file", "--kafka-sasl-oauth-token-file", path}
		r := e.startRelay(args...)
		start := time.Now()
		w := e.newWriter(31)
		// 30 s of writes: past the first token's expiry and several 10 s sessions.
		if err := w.run(context.Background(), 600, 5, 20, 30*time.Second, ""); err != nil {
			t.Fatal(err)
		}
		ws := w.written()
		requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, time.Second), e.partitions(t)), false)
		if h := r.metric("outbox_relay_halted"); h != 0 {
			t.Fatalf("outbox_relay_halted = %v while the tokens were valid", h)
		}
		t.Logf("OAUTHBEARER file/direct: %d events over %s, tokens of %s rotated every 3s, 0 lost", len(ws), time.Since(start).Round(time.Second), lifetime)

		// An expired token in the file: the next authentication (within a
		// session, 10 s) is refused and the relay halts, saying why.
		stopRotating()
		expired := unsecuredJWT("relay", time.Now().Add(-2*time.Minute), time.Now().Add(-time.Minute))
		if err := os.WriteFile(path, []byte(expired), 0o600); err != nil {
			t.Fatal(err)
		}
		// Events over 15 s: past the end of every session that began with a
		// valid token, so a connection must authenticate with this one.
		wctx, wcancel := context.WithCancel(context.Background())
		defer wcancel()
		wrote := make(chan struct{})
		go func() { defer close(wrote); _ = w.run(wctx, 30, 1, 5, 15*time.Second, "") }()
		waitFor(t, 60*time.Second, "outbox_relay_halted = 1 after the token expired", func() bool { return r.metric("outbox_relay_halted") == 1 })
		wcancel()
		<-wrote
		waitFor(t, 10*time.Second, "a log line naming OAUTHBEARER", func() bool { return strings.Contains(r.log(), "OAUTHBEARER") })
		r.stop(syscall.SIGTERM, 30*time.Second)
		mu.Lock()
		noSecret(t, "the relay log", r.log(), append(issued, expired)...)
		mu.Unlock()

		// check: the mechanism, the source and the broker's acceptance; never the token.
		fresh := unsecuredJWT("relay", time.Now(), time.Now().Add(time.Hour))
		if err := os.WriteFile(path, []byte(fresh), 0o600); err != nil {
			t.Fatal(err)
		}
		rep, out := e.runCheck(t, "", args...)
		if c := checkNamed(t, rep, "kafka.sasl"); c.Verdict != preflight.OK || !strings.Contains(c.Value, "OAUTHBEARER, token source file") ||
			!strings.Contains(c.Value, "accepted") {
			t.Errorf("check kafka.sasl = %+v, want OK naming OAUTHBEARER, the file source and the broker's acceptance", c)
		}
		noSecret(t, "check's output", out, fresh)
		if err := os.WriteFile(path, []byte(expired), 0o600); err != nil {
			t.Fatal(err)
		}
		rep, out = e.runCheck(t, "", args...)
		if c := checkNamed(t, rep, "kafka.sasl"); c.Verdict != preflight.Fail || !strings.Contains(c.Value, "refused") || !strings.Contains(c.Fix, "kafka.sasl.oauth") {
			t.Errorf("check kafka.sasl with an expired token = %+v, want Fail: refused, fix naming kafka.sasl.oauth", c)
		}
		noSecret(t, "check's output", out, expired)
	})

	t.Run("client_credentials/exactly_once", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "oauthcc")
		const secret = "cc-s3cret-for-the-relay"
		var issuedN atomic.Int32
		var expire atomic.Bool // issue expired tokens
		var mu sync.Mutex
		var issued []string
		idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, sec, ok := r.BasicAuth()
			if !ok || id != "outbox-relay" || sec != secret || r.FormValue("grant_type") != "client_credentials" || r.FormValue("scope") != "kafka" {
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"error":"invalid_client"}`)
				return
			}
			exp := time.Now().Add(lifetime)
			if expire.Load() {
				exp = time.Now().Add(-time.Minute)
			}
			tok := unsecuredJWT("relay", time.Now(), exp)
			mu.Lock()
			issued = append(issued, tok)
			mu.Unlock()
			issuedN.Add(1)
			fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":%d}`, tok, int(lifetime/time.Second))
		}))
		defer idp.Close()
		args := append(e.eosFlags(), "--kafka-brokers", sasl, "--kafka-sasl-mechanism", "OAUTHBEARER",
			"--kafka-sasl-oauth-token-source", "client_credentials", "--kafka-sasl-oauth-token-url", idp.URL+"/oauth2/token",
			"--kafka-sasl-oauth-client-id", "outbox-relay", "--kafka-sasl-oauth-scope", "kafka",
			"--kafka-sasl-oauth-extensions", "logicalCluster=lkc-test,identityPoolId=pool-test",
			"--shutdown-timeout", "5s") // the last stop drains against a broker refusing the token
		e.extra = []string{"OUTBOX_RELAY_KAFKA_SASL_OAUTH_CLIENT_SECRET=" + secret}
		r := e.startRelay(args...)
		start := time.Now()
		w := e.newWriter(32)
		if err := w.run(context.Background(), 600, 5, 20, 30*time.Second, ""); err != nil {
			t.Fatal(err)
		}
		ws := w.written()
		requireClean(t, check(t, ws, consumeCommitted(t, e.topics(), len(ws), 60*time.Second, 2*time.Second), e.partitions(t)), false)
		if h := r.metric("outbox_relay_halted"); h != 0 {
			t.Fatalf("outbox_relay_halted = %v while the endpoint issued valid tokens", h)
		}
		// Each token is kept for 80% of its 12 s: over 30 s each client
		// (metadata, transactional producer) asked again.
		n := issuedN.Load()
		if n < 3 {
			t.Errorf("the token endpoint issued %d tokens in %s, want refreshes (>= 3)", n, time.Since(start).Round(time.Second))
		}
		t.Logf("OAUTHBEARER client_credentials/exactly_once: %d events over %s, %d tokens issued, 0 lost", len(ws), time.Since(start).Round(time.Second), n)

		// The endpoint issues expired tokens from now on: once the cached
		// token is due and the sessions end, sarama retries a refused
		// authentication, and the relay says so.
		expire.Store(true)
		wctx, wcancel := context.WithCancel(context.Background())
		defer wcancel()
		wrote := make(chan struct{})
		go func() { defer close(wrote); _ = w.run(wctx, 30, 1, 5, 20*time.Second, "") }()
		waitFor(t, 90*time.Second, "a warning that kafka refused the credentials", func() bool {
			return strings.Contains(r.log(), "kafka refused the relay's SASL credentials")
		})
		wcancel()
		<-wrote
		r.stop(syscall.SIGTERM, 30*time.Second)
		mu.Lock()
		noSecret(t, "the relay log", r.log(), append(issued, secret)...)
		mu.Unlock()

		// A wrong client secret: the endpoint's 401 stops the relay at
		// start, naming the URL, the status and the keys.
		e.extra = []string{"OUTBOX_RELAY_KAFKA_SASL_OAUTH_CLIENT_SECRET=not-" + secret}
		code, log := e.runRelayToExit(60*time.Second, args...)
		if code != 1 || !strings.Contains(log, idp.URL+"/oauth2/token") || !strings.Contains(log, "HTTP 401") || !strings.Contains(log, "kafka.sasl.oauth") {
			t.Fatalf("wrong client secret: exit %d, want 1 naming the token URL, HTTP 401 and kafka.sasl.oauth:\n%s", code, tail([]byte(log), 2000))
		}
		noSecret(t, "the relay log", log, secret)
	})

	// kafka.producer: sarama, sarama's AsyncProducer, through the same
	// token provider.
	t.Run("static/sarama", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "oauthsarama")
		tok := unsecuredJWT("relay", time.Now(), time.Now().Add(time.Hour))
		e.extra = []string{"OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN=" + tok}
		r := e.startRelay("--kafka-producer", "sarama", "--kafka-brokers", sasl, "--kafka-sasl-mechanism", "OAUTHBEARER",
			"--kafka-sasl-oauth-token-source", "static")
		w := e.newWriter(33)
		if err := w.run(context.Background(), 200, 5, 20, 0, ""); err != nil {
			t.Fatal(err)
		}
		ws := w.written()
		requireClean(t, check(t, ws, consume(t, e.topics(), len(ws), 60*time.Second, time.Second), e.partitions(t)), false)
		r.stop(syscall.SIGTERM, 30*time.Second)
		noSecret(t, "the relay log", r.log(), tok)
	})

	for _, mode := range []string{"at_least_once", "exactly_once"} {
		t.Run("expired/"+mode, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "oauthexp"+mode[:1])
			expired := unsecuredJWT("relay", time.Now().Add(-2*time.Minute), time.Now().Add(-time.Minute))
			e.extra = []string{"OUTBOX_RELAY_KAFKA_SASL_OAUTH_TOKEN=" + expired}
			args := []string{"--kafka-brokers", sasl, "--kafka-sasl-mechanism", "OAUTHBEARER", "--kafka-sasl-oauth-token-source", "static"}
			if mode == "exactly_once" {
				args = append(e.eosFlags(), args...)
			}
			code, log := e.runRelayToExit(60*time.Second, args...)
			if code != 1 || !strings.Contains(log, "OAUTHBEARER") || !strings.Contains(log, "kafka.sasl.oauth") {
				t.Fatalf("expired token: exit %d, want 1 naming OAUTHBEARER and kafka.sasl.oauth:\n%s", code, tail([]byte(log), 2000))
			}
			noSecret(t, "the relay log", log, expired)
		})
	}
}
