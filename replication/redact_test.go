package replication

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRedactURLUnparseable(t *testing.T) {
	for _, in := range []string{
		"postgres://u:s3#cret@h/db",
		"postgres://u:s3cret@h:notaport/db",
		"host=h password=s3cret&x user=u",
	} {
		if out := RedactURL(in); strings.Contains(out, "s3cret") || strings.Contains(out, "s3#cret") {
			t.Errorf("RedactURL(%q) = %q leaks the password", in, out)
		}
	}
}

// Every secret libpq and pgx read from a connection string, in both forms,
// however it is spelt: the secret parts are "s3cret", "tail" and "3cr".
func TestRedactURLHostile(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		// URL form: userinfo and the password / sslpassword parameters.
		{"postgres://u@h/db?sslpassword=s3cret", "postgres://u@h/db?sslpassword=xxxxx"},
		{"postgres://u@h/db?sslmode=verify-full&sslpassword=s3cret&sslkey=/k.pem", "postgres://u@h/db?sslmode=verify-full&sslpassword=xxxxx&sslkey=/k.pem"},
		{"postgres://u@h/db?password=s3cret#tail", "postgres://u@h/db?password=xxxxx"}, // libpq reads s3cret#tail
		{"postgres://u@h/db?pass%77ord=s3cret", "postgres://u@h/db?pass%77ord=xxxxx"},
		{"postgresql://u:s3cret@h/db?sslpassword=tail", "postgresql://u:xxxxx@h/db?sslpassword=xxxxx"},
		{"postgres://u@h/db?password=s3cret&password=tail", "postgres://u@h/db?password=xxxxx&password=xxxxx"},
		{"postgres://u@h/db?PassWord=s3cret", "postgres://u@h/db?PassWord=xxxxx"},
		{"postgres://u@h/db?sslpassword=s3%20cret", "postgres://u@h/db?sslpassword=xxxxx"},
		{"postgres://u:s3cret@h1:5432,h2:5433/db", "postgres://u:xxxxx@h1:5432,h2:5433/db"},
		// URLs Go does not parse: masked by libpq's structure all the same.
		{"postgres://u@h/db?sslpassword=s3cret&x=%zz", "postgres://u@h/db?sslpassword=xxxxx&x=%zz"},
		{"postgres://u:s3@cr@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3/cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3?cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3 tail@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u@h:x/db?password=s3cret#tail", "postgres://u@h:x/db?password=xxxxx"},
		// Keyword/value form, parsed as libpq does (conninfo_parse).
		{`host=h password=abc\ tail dbname=db`, "host=h password=xxxxx dbname=db"},
		{`host=h password=s3cret\`, "host=h password=xxxxx"},
		{"host=h sslpassword=s3cret dbname=db", "host=h sslpassword=xxxxx dbname=db"},
		{`host=h sslpassword='s3 cret tail' dbname=db`, "host=h sslpassword=xxxxx dbname=db"},
		{`password='a b tail'`, "password=xxxxx"},
		{`password='it\'s tail\\' dbname=db`, "password=xxxxx dbname=db"},
		{`password=''`, "password=xxxxx"},
		{"password=", "password=xxxxx"},
		{"host=h\tpassword\t=\ts3cret\tport=5", "host=h\tpassword\t=\txxxxx\tport=5"},
		{"host=h\npassword=s3cret\nport=5", "host=h\npassword=xxxxx\nport=5"},
		{"host=h password=s3cret password=tail", "host=h password=xxxxx password=xxxxx"},
		{"host=h SSLPASSWORD=s3cret", "host=h SSLPASSWORD=xxxxx"},
		{"options='-c password=x' password=s3cret", "options='-c password=x' password=xxxxx"},
		{`application_name=a\ password=x password=s3cret`, `application_name=a\ password=x password=xxxxx`},
		// Malformed: never less redaction than a parse would give.
		{"host=h password='s3cret tail", "host=h password=xxxxx"},
		{"host h password=s3cret", "host h password=xxxxx"},
		{"password", "password"},
		{"nopassword=s3cret", "nopassword=s3cret"}, // not a libpq keyword, and not a secret
		{"postgresx://u:s3cret@h/db", "postgresx://u:xxxxx@h/db"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := RedactURL(tt.in)
			if got != tt.want {
				t.Errorf("RedactURL(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
			// What pgx itself reads as the password never survives.
			if c, err := pgconn.ParseConfig(tt.in); err == nil && len(c.Password) >= 3 && strings.Contains(got, c.Password) {
				t.Errorf("RedactURL(%q) = %q keeps the password pgx reads, %q", tt.in, got, c.Password)
			}
			for _, secret := range []string{"s3cret", "tail", "3cr", "s3%20cret"} {
				if strings.Contains(got, secret) && !strings.Contains(tt.want, secret) {
					t.Errorf("RedactURL(%q) = %q leaks %q", tt.in, got, secret)
				}
			}
		})
	}
}
