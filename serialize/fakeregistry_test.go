package serialize

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeRegistry is a minimal Confluent-compatible registry under
// /apis/ccompat/v7 (a base URL with a path, like Apicurio's) that counts
// requests and can be told to fail.
type fakeRegistry struct {
	t        testing.TB
	srv      *httptest.Server
	mu       sync.Mutex
	schemas  []schemaRec            // id-1 -> schema
	subjects map[string][]int       // subject -> ids by version-1
	requests map[string]int         // "GET /subjects/x/versions/latest" -> count
	fail     atomic.Int32           // HTTP status to answer every request with (0: serve)
	failBody atomic.Pointer[string] // body of failures
	total    atomic.Int64
	badCT    atomic.Int64 // POSTs without the registry content type
	auth     atomic.Pointer[string]
}

type schemaRec struct {
	Schema     string            `json:"schema"`
	SchemaType string            `json:"schemaType,omitempty"`
	References []json.RawMessage `json:"references,omitempty"`
}

const basePath = "/apis/ccompat/v7"

func newFakeRegistry(t testing.TB) *fakeRegistry {
	f := &fakeRegistry{t: t, subjects: map[string][]int{}, requests: map[string]int{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRegistry) url() string { return f.srv.URL + basePath }

// add registers text under subject as a new version and returns its id
// (the same text gets the same id, across subjects too).
func (f *fakeRegistry) add(subject, typ, text string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addLocked(subject, typ, text)
}

func (f *fakeRegistry) addLocked(subject, typ, text string) int {
	if typ == "AVRO" {
		typ = ""
	}
	id := 0
	for i, s := range f.schemas {
		if s.Schema == text && s.SchemaType == typ {
			id = i + 1
		}
	}
	if id == 0 {
		f.schemas = append(f.schemas, schemaRec{Schema: text, SchemaType: typ})
		id = len(f.schemas)
	}
	for _, have := range f.subjects[subject] {
		if have == id {
			return id
		}
	}
	f.subjects[subject] = append(f.subjects[subject], id)
	return id
}

// addRefs is add for a schema with references ({name, subject, version}).
func (f *fakeRegistry) addRefs(subject, typ, text string, refs ...string) int {
	id := f.add(subject, typ, text)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range refs {
		f.schemas[id-1].References = append(f.schemas[id-1].References, json.RawMessage(r))
	}
	return id
}

func (f *fakeRegistry) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[key]
}

func writeErr(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error_code":%d,"message":%q}`, code, msg)
}

func (f *fakeRegistry) serve(w http.ResponseWriter, r *http.Request) {
	f.total.Add(1)
	if a := r.Header.Get("Authorization"); a != "" {
		f.auth.Store(&a)
	}
	if st := f.fail.Load(); st != 0 {
		body := `{"error_code":50001,"message":"store unavailable"}`
		if b := f.failBody.Load(); b != nil {
			body = strings.ReplaceAll(*b, "{auth}", r.Header.Get("Authorization"))
		}
		w.WriteHeader(int(st))
		_, _ = w.Write([]byte(body))
		return
	}
	if r.Method == http.MethodPost && r.Header.Get("Content-Type") != "application/vnd.schemaregistry.v1+json" {
		f.badCT.Add(1)
		writeErr(w, http.StatusUnsupportedMediaType, 415, "unsupported media type")
		return
	}
	path, ok := strings.CutPrefix(r.URL.EscapedPath(), basePath)
	if !ok {
		writeErr(w, http.StatusNotFound, 404, "not under the base path: "+r.URL.Path)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests[r.Method+" "+path]++
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i := range parts {
		parts[i], _ = unescape(parts[i])
	}
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch {
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "schemas" && parts[1] == "ids":
		id, _ := strconv.Atoi(parts[2])
		if id < 1 || id > len(f.schemas) {
			writeErr(w, 404, 40403, "Schema not found")
			return
		}
		reply(f.schemas[id-1])
	case r.Method == http.MethodGet && len(parts) == 4 && parts[0] == "subjects" && parts[2] == "versions":
		ids, ok := f.subjects[parts[1]]
		if !ok {
			writeErr(w, 404, 40401, "Subject '"+parts[1]+"' not found.")
			return
		}
		v := len(ids)
		if parts[3] != "latest" {
			v, _ = strconv.Atoi(parts[3])
		}
		if v < 1 || v > len(ids) {
			writeErr(w, 404, 40402, "Version "+parts[3]+" not found.")
			return
		}
		s := f.schemas[ids[v-1]-1]
		reply(map[string]any{"subject": parts[1], "version": v, "id": ids[v-1], "schema": s.Schema, "schemaType": s.SchemaType, "references": s.References})
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "subjects" && parts[2] == "versions":
		var in schemaRec
		_ = json.NewDecoder(r.Body).Decode(&in)
		if strings.Contains(in.Schema, "INVALID") {
			writeErr(w, 422, 42201, "Invalid schema")
			return
		}
		if strings.Contains(in.Schema, "INCOMPATIBLE") {
			writeErr(w, 409, 409, "Schema being registered is incompatible with an earlier schema")
			return
		}
		reply(map[string]int{"id": f.addLocked(parts[1], in.SchemaType, in.Schema)})
	case r.Method == http.MethodPost && len(parts) == 2 && parts[0] == "subjects":
		var in schemaRec
		_ = json.NewDecoder(r.Body).Decode(&in)
		if in.SchemaType == "AVRO" {
			in.SchemaType = ""
		}
		for v, id := range f.subjects[parts[1]] {
			if s := f.schemas[id-1]; s.Schema == in.Schema && s.SchemaType == in.SchemaType {
				reply(map[string]any{"subject": parts[1], "version": v + 1, "id": id, "schema": s.Schema, "schemaType": s.SchemaType})
				return
			}
		}
		if _, ok := f.subjects[parts[1]]; !ok {
			writeErr(w, 404, 40401, "Subject '"+parts[1]+"' not found.")
			return
		}
		writeErr(w, 404, 40403, "Schema not found")
	default:
		writeErr(w, 404, 404, "no route "+r.Method+" "+path)
	}
}

func unescape(s string) (string, error) {
	return strings.NewReplacer("%2F", "/", "%2f", "/").Replace(s), nil
}
