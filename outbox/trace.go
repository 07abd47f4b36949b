package outbox

import "context"

type traceKey struct{}

type traceContextValue struct{ traceparent, tracestate string }

// WithTraceparent returns a context whose events Write gives the W3C
// traceparent header (https://www.w3.org/TR/trace-context/), e.g.
// "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", typically
// the incoming request's. A malformed value is ignored, as W3C receivers
// do, rather than failing the business transaction. Any goroutine.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	v, _ := ctx.Value(traceKey{}).(traceContextValue)
	v.traceparent = traceparent
	return context.WithValue(ctx, traceKey{}, v)
}

// WithTracestate adds the W3C tracestate that goes with the context's
// traceparent; without a traceparent it is not written.
func WithTracestate(ctx context.Context, tracestate string) context.Context {
	v, _ := ctx.Value(traceKey{}).(traceContextValue)
	v.tracestate = tracestate
	return context.WithValue(ctx, traceKey{}, v)
}

// TraceparentFrom, when not nil, gives Write the trace context of a context
// that has none from WithTraceparent: set it once at start, before any
// Write, to read your tracer's span. This package imports no tracing
// library; with OpenTelemetry it is one statement:
//
//	outbox.TraceparentFrom = func(ctx context.Context) (traceparent, tracestate string) {
//		c := propagation.MapCarrier{}
//		propagation.TraceContext{}.Inject(ctx, c)
//		return c["traceparent"], c["tracestate"]
//	}
//
// It is read without synchronisation: do not change it while Write runs.
var TraceparentFrom func(ctx context.Context) (traceparent, tracestate string)

// traceContext is the valid traceparent of ctx (WithTraceparent first, then
// TraceparentFrom) and its tracestate, or "", "".
func traceContext(ctx context.Context) (string, string) {
	v, _ := ctx.Value(traceKey{}).(traceContextValue)
	if v.traceparent == "" && TraceparentFrom != nil {
		v.traceparent, v.tracestate = TraceparentFrom(ctx)
	}
	if !validTraceparent(v.traceparent) {
		return "", ""
	}
	return v.traceparent, v.tracestate
}

// validTraceparent checks the W3C shape: version-traceid-parentid-flags in
// lower-case hex (2-32-16-2), version not ff, ids not all zero. Later
// versions may append "-..." fields.
func validTraceparent(s string) bool {
	if len(s) < 55 || (len(s) > 55 && s[55] != '-') || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	if s[:2] == "ff" || (s[:2] == "00" && len(s) != 55) {
		return false
	}
	hex := func(f string) bool {
		zero := true
		for i := 0; i < len(f); i++ {
			c := f[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
			zero = zero && c == '0'
		}
		return !zero || len(f) == 2
	}
	return hex(s[:2]) && hex(s[3:35]) && hex(s[36:52]) && hex(s[53:55])
}
