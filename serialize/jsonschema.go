package serialize

import (
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonSchemaCodec validates payloads against one JSON Schema. Safe for
// concurrent use once built.
type jsonSchemaCodec struct {
	schema *jsonschema.Schema
}

// schemaURL names the registry's schema inside the compiler; references are
// added under their own names.
const schemaURL = "https://outbox-relay.invalid/schema.json"

// newJSONSchemaCodec compiles text; refs maps a reference name (as the
// schema's $ref writes it) to its text. Nothing is loaded from elsewhere: a
// $ref to a URL not given is an error, not a fetch.
func newJSONSchemaCodec(text string, refs map[string]string) (*jsonSchemaCodec, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(jsonschema.SchemeURLLoader{}) // no file or network access
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse JSON Schema: %w", err)
	}
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("add JSON Schema: %w", err)
	}
	for name, refText := range refs {
		refDoc, err := jsonschema.UnmarshalJSON(strings.NewReader(refText))
		if err != nil {
			return nil, fmt.Errorf("parse JSON Schema reference %q: %w", name, err)
		}
		loc := name
		if !strings.Contains(name, "://") { // relative: as the schema's $ref resolves it
			loc = "https://outbox-relay.invalid/" + strings.TrimPrefix(name, "/")
		}
		if err := c.AddResource(loc, refDoc); err != nil {
			return nil, fmt.Errorf("add JSON Schema reference %q: %w", name, err)
		}
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fmt.Errorf("compile JSON Schema: %w", err)
	}
	return &jsonSchemaCodec{schema: s}, nil
}

// validate checks payload; the payload itself is what goes on the wire.
func (c *jsonSchemaCodec) validate(payload []byte) error {
	v, err := decodeJSON(payload)
	if err != nil {
		return err
	}
	err = c.schema.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return mismatchf("", "%v", err)
	}
	leaf := ve
	for len(leaf.Causes) > 0 {
		leaf = leaf.Causes[0]
	}
	path := ""
	if len(leaf.InstanceLocation) > 0 {
		path = "/" + strings.Join(leaf.InstanceLocation, "/")
	}
	// The library's text without its first line (which names our internal URL).
	msg := ve.Error()
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[i+1:]
	}
	msg = strings.ReplaceAll(strings.TrimSpace(msg), "\n", "; ")
	msg = strings.TrimPrefix(strings.TrimSpace(msg), "- ")
	return &fieldError{path: path, msg: "JSON Schema: " + msg}
}
