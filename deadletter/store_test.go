package deadletter

import (
	"context"
	"strings"
	"testing"
)

// An unparseable postgres.url is reported by key without echoing it: pgx's
// own redaction is best effort and keeps, e.g., what follows an escaped
// space in a keyword/value password.
func TestOpenErrorHasNoSecret(t *testing.T) {
	for _, url := range []string{
		`host=h password=abc\ s3cret port=x`,
		`host=h sslpassword='a s3cret' port=x`,
		"postgres://u@h/db?sslpassword=s3cret&x=%zz",
		"postgres://u:s3cret@h:notaport/db",
	} {
		_, err := Open(context.Background(), url, "public", "outbox")
		if err == nil {
			t.Fatalf("Open(%q): no error", url)
		}
		if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "postgres.url") {
			t.Errorf("Open(%q) error %q: must name postgres.url and not contain the secret", url, err)
		}
	}
}
