package report

import (
	"bytes"
	"strings"
	"testing"
)

func TestJudge(t *testing.T) {
	tests := []struct {
		name     string
		verdicts []Verdict
		want     Outcome
	}{
		{"none", nil, Outcome{OK, ExitOK}},
		{"all ok", []Verdict{OK, OK}, Outcome{OK, ExitOK}},
		{"skip changes nothing", []Verdict{OK, Skip}, Outcome{OK, ExitOK}},
		{"warn", []Verdict{OK, Warn, Skip}, Outcome{Warn, ExitWarn}},
		{"fail over warn", []Verdict{Warn, Fail, Warn}, Outcome{Fail, ExitBad}},
		{"bad over warn", []Verdict{Bad, Warn}, Outcome{Bad, ExitBad}},
	}
	for _, tt := range tests {
		var cs []Check
		for _, v := range tt.verdicts {
			cs = append(cs, Check{Name: "c", Verdict: v})
		}
		if got := Judge(cs); got != tt.want {
			t.Errorf("%s: Judge = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestText(t *testing.T) {
	cs := []Check{
		{Name: "a", Verdict: OK, Value: "fine", Fix: "not shown: ok"},
		{Name: "longer.name", Verdict: Warn, Value: "two\n  lines", Fix: "do\tthis"},
		{Name: "c", Verdict: Skip, Value: "not checked"},
	}
	var b bytes.Buffer
	if err := Text(&b, "title", cs, Judge(cs)); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"title",
		"",
		"a            OK    fine",
		"longer.name  WARN  two lines",
		"                   -> do this",
		"c            SKIP  not checked",
		"",
		"WARN (exit 4)",
		"",
	}, "\n")
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
