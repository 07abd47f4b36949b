package testkit

import (
	"slices"
	"strings"
)

// promqlSkip are PromQL words that are not metric names when not followed
// by "(": binary operators, modifiers, literals.
var promqlSkip = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"inf": true, "nan": true, "atan2": true}

// promqlLabelLists are keywords followed by a parenthesised label list.
var promqlLabelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true}

// MetricNames returns the metric names a PromQL expression selects, sorted
// and unique: identifiers that are not functions, aggregations, keywords or
// label names; label matchers, strings, ranges, numbers, durations and
// Grafana variables ($job, $__rate_interval) are skipped. Grafana's
// label_values(selector, label) yields the selector's metric. A lexer, not
// a parser: enough for the rules and dashboards of this repository.
func MetricNames(expr string) []string {
	var out []string
	s := expr
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(s) && strings.ContainsRune(" \t\r\n", rune(s[i])) {
			i++
		}
		return i
	}
	// closing returns the index just past the bracket that closes s[i].
	closing := func(i int) int {
		open, close := s[i], map[byte]byte{'(': ')', '{': '}', '[': ']'}[s[i]]
		depth := 0
		for ; i < len(s); i++ {
			switch c := s[i]; {
			case c == '"' || c == '\'' || c == '`':
				for i++; i < len(s) && s[i] != c; i++ {
					if s[i] == '\\' && c != '`' {
						i++
					}
				}
			case c == open:
				depth++
			case c == close:
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(s)
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' && c != '`' {
					j++
				}
			}
			i = j + 1
		case c == '{' || c == '[':
			i = closing(i)
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '$' || c >= '0' && c <= '9' || c == '.':
			for i++; i < len(s) && (isIdent(s[i]) || s[i] == '.'); i++ {
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word, next := s[i:j], skipSpace(j)
			call := next < len(s) && s[next] == '('
			switch low := strings.ToLower(word); {
			case promqlLabelLists[low]:
				if call {
					next = closing(next)
				}
				i = next
				continue
			case low == "label_values" && call:
				end := closing(next)
				args := s[next+1 : max(next+1, end-1)]
				if k := lastTopLevelComma(args); k >= 0 {
					out = append(out, MetricNames(args[:k])...)
				}
				i = end
				continue
			case call || promqlSkip[low]:
			case next < len(s) && (strings.HasPrefix(strings.ToLower(s[next:]), "by") || strings.HasPrefix(strings.ToLower(s[next:]), "without")) && isAggregation(low):
			default:
				out = append(out, word)
			}
			i = j
		default:
			i++
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func isAggregation(w string) bool {
	switch w {
	case "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile":
		return true
	}
	return false
}

func lastTopLevelComma(s string) int {
	depth, last := 0, -1
	var quote byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
		case c == '(' || c == '{' || c == '[':
			depth++
		case c == ')' || c == '}' || c == ']':
			depth--
		case c == ',' && depth == 0:
			last = i
		}
	}
	return last
}
