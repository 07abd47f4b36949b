package replication

import (
	"strings"
	"testing"
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
