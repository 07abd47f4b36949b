package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrUnroutable is wrapped by the error of a Router for a record whose
// event_type, or schema_version of that type, has no handler.
var ErrUnroutable = errors.New("no handler")

// Router dispatches records to handlers by event_type and schema_version,
// so that one consumer serves versions N and N-1 during a rolling deploy:
//
//	r := inbox.NewRouter()
//	r.Handle("order.created", 1, createdV1)
//	r.Handle("order.created", 2, createdV2)
//	r.Ignore("order.viewed")
//	c, err := inbox.New(cfg, pool, r.Dispatch)
//
// A record without a schema_version header has version 0: register
// version 0 for events written before versioning. A record whose type or
// version has no handler is an error wrapping ErrUnroutable that names
// what is registered: like any handler error it rolls back and is retried
// (Config.Retry), holding its partition until a consumer that knows it is
// deployed, or until OnGiveUp takes it after Config.MaxAttempts. That is
// why consumers are deployed before the producers of a new version, and a
// breaking change is a new event_type. Register everything before the
// consumer runs; Dispatch may then be called from any goroutine.
type Router struct {
	handlers map[string]map[int]Handler
	ignored  map[string]bool
}

// NewRouter returns an empty Router.
func NewRouter() *Router {
	return &Router{handlers: map[string]map[int]Handler{}, ignored: map[string]bool{}}
}

// Handle registers h for eventType at schema version version (0 = records
// without a schema_version header). Registering a pair twice panics, as
// does a negative version, a nil h or an eventType also ignored. Call it
// before the consumer runs, from one goroutine.
func (r *Router) Handle(eventType string, version int, h Handler) {
	switch {
	case version < 0:
		panic(fmt.Sprintf("inbox: Router.Handle(%q, %d): negative version", eventType, version))
	case h == nil:
		panic(fmt.Sprintf("inbox: Router.Handle(%q, %d): nil handler", eventType, version))
	case r.ignored[eventType]:
		panic(fmt.Sprintf("inbox: Router.Handle(%q, %d): the type is ignored", eventType, version))
	case r.handlers[eventType][version] != nil:
		panic(fmt.Sprintf("inbox: Router.Handle(%q, %d): registered twice", eventType, version))
	}
	if r.handlers[eventType] == nil {
		r.handlers[eventType] = map[int]Handler{}
	}
	r.handlers[eventType][version] = h
}

// Ignore makes records of eventType (any version) succeed without a
// handler: their event_id is still recorded. For types on a topic that
// this consumer does not care about. It panics if eventType has handlers.
// Call it before the consumer runs, from one goroutine.
func (r *Router) Ignore(eventType string) {
	if r.handlers[eventType] != nil {
		panic(fmt.Sprintf("inbox: Router.Ignore(%q): the type has handlers", eventType))
	}
	r.ignored[eventType] = true
}

// Dispatch is the Router as a Handler: it calls the handler of m's
// event_type and schema_version.
func (r *Router) Dispatch(ctx context.Context, tx pgx.Tx, m *Message) error {
	if r.ignored[m.EventType] {
		return nil
	}
	v, err := m.SchemaVersion()
	if err != nil {
		return fmt.Errorf("inbox: route: %w", err)
	}
	byVersion := r.handlers[m.EventType]
	if h := byVersion[v]; h != nil {
		return h(ctx, tx, m)
	}
	if byVersion == nil {
		return fmt.Errorf("inbox: route event %s: %w for event_type %q (handled: %s)", m.EventID, ErrUnroutable, m.EventType, r.types())
	}
	return fmt.Errorf("inbox: route event %s: %w for %s schema_version %d (handled: %s)", m.EventID, ErrUnroutable, m.EventType, v, versions(byVersion))
}

func (r *Router) types() string {
	var ts []string
	for t := range r.handlers {
		ts = append(ts, strconv.Quote(t))
	}
	for t := range r.ignored {
		ts = append(ts, strconv.Quote(t)+" (ignored)")
	}
	if len(ts) == 0 {
		return "none"
	}
	slices.Sort(ts)
	return strings.Join(ts, ", ")
}

func versions(m map[int]Handler) string {
	var vs []int
	for v := range m {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.Itoa(v)
	}
	return "versions " + strings.Join(s, ", ")
}
