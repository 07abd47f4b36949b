// Package serialize turns an outbox event's JSON payload into the Confluent
// Schema Registry wire format (magic byte 0, the schema id as 4 big-endian
// bytes, then the Avro, JSON Schema or Protobuf encoding) and back.
//
// Schemas come from a Confluent-compatible registry, looked up once per
// subject (and version) and cached; a registry that cannot be reached makes
// Encode wait, never emit another format; a payload that does not fit its
// schema is a *MismatchError.
package serialize

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Formats of a topic's records.
const (
	JSON       = "json" // the payload as it is; no registry
	JSONSchema = "json_schema"
	Avro       = "avro"
	Protobuf   = "protobuf"
)

// Subject name strategies, as Confluent's serializers name them.
const (
	TopicName       = "topic_name"        // <topic>-value
	RecordName      = "record_name"       // the record name
	TopicRecordName = "topic_record_name" // <topic>-<record name>
)

// Key encodings.
const (
	KeyRaw    = "raw"    // the key's bytes as they are
	KeyString = "string" // the primitive string schema of the topic's format, subject <topic>-key
)

// Defaults.
const (
	DefaultTimeout  = 10 * time.Second
	DefaultCacheTTL = 5 * time.Minute
)

// TLSConfig is the registry client's TLS.
type TLSConfig struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// RegistryConfig is the schema_registry section. Password is a secret: it
// never appears in errors, logs or String().
type RegistryConfig struct {
	URL      string    `yaml:"url"`
	Username string    `yaml:"username"`
	Password string    `yaml:"password"`
	TLS      TLSConfig `yaml:"tls"`
	// Timeout bounds each request; default 10s.
	Timeout time.Duration `yaml:"timeout"`
	// SubjectStrategy: topic_name (default), record_name or topic_record_name.
	SubjectStrategy string `yaml:"subject_strategy"`
	// RecordName is the record name template of the record strategies:
	// {aggregate_type} {event_type} {schema} {table} {topic}.
	RecordName string `yaml:"record_name"`
	// AutoRegister registers Schemas[subject] when the registry lacks it.
	AutoRegister bool `yaml:"auto_register"`
	// Schemas maps a subject to a schema file, used instead of its latest.
	Schemas map[string]string `yaml:"schemas"`
	// VersionHeader names an event header whose integer value picks the
	// subject's version; without the header the latest is used.
	VersionHeader string `yaml:"version_header"`
	// Key: raw (default) or string.
	Key string `yaml:"key"`
	// CacheTTL is how long a subject's latest version is trusted; default 5m.
	CacheTTL time.Duration `yaml:"cache_ttl"`
}

// String is the config with the password and the URL's userinfo redacted.
func (c RegistryConfig) String() string {
	pw := ""
	if c.Password != "" {
		pw = "[redacted]"
	}
	return fmt.Sprintf("{url: %s, username: %q, password: %q, subject_strategy: %q, record_name: %q, auto_register: %v, key: %q, timeout: %s, cache_ttl: %s}",
		redactURL(c.URL), c.Username, pw, c.SubjectStrategy, c.RecordName, c.AutoRegister, c.Key, c.Timeout, c.CacheTTL)
}

// RedactURL is u without its password: what the relay may print.
func RedactURL(u string) string { return redactURL(u) }

// redactURL drops the userinfo of u (a password may sit there).
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "[unparsable URL]"
	}
	if p.User != nil {
		p.User = url.User("[redacted]")
	}
	return p.String()
}

var placeholderRE = regexp.MustCompile(`\{[^{}]*\}`)

var placeholders = map[string]bool{
	"{aggregate_type}": true, "{event_type}": true, "{schema}": true, "{table}": true, "{topic}": true,
}

// Validate reports every bad key, each named with prefix (for example
// "schema_registry."). formats are the formats topics use: the registry
// keys only matter when one of them is not json.
func (c RegistryConfig) Validate(prefix string, formats []string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", prefix, key, fmt.Sprintf(format, args...)))
	}
	needRegistry, proto := false, false
	for _, f := range formats {
		switch f {
		case JSON:
		case Avro, JSONSchema:
			needRegistry = true
		case Protobuf:
			needRegistry, proto = true, true
		default:
			errs = append(errs, fmt.Errorf("unknown serialization format %q (want json, json_schema, avro or protobuf)", f))
		}
	}
	if c.URL == "" {
		if needRegistry {
			bad("url", "required for the formats json_schema, avro and protobuf")
		}
	} else if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("url", "%s is not an http(s) URL", redactURL(c.URL))
	}
	if c.Password != "" && c.Username == "" {
		bad("password", "is set without schema_registry.username: basic auth needs both")
	}
	if strings.ContainsRune(c.Username, ':') || strings.ContainsFunc(c.Username, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		bad("username", "%q cannot be sent in basic auth (no ':' nor control characters)", c.Username)
	}
	if c.Timeout < 0 {
		bad("timeout", "must not be negative")
	}
	if c.CacheTTL < 0 {
		bad("cache_ttl", "must not be negative")
	}
	switch c.SubjectStrategy {
	case "", TopicName:
	case RecordName, TopicRecordName:
		if c.RecordName == "" {
			bad("record_name", "required with subject_strategy %s (e.g. \"com.acme.{event_type}\")", c.SubjectStrategy)
		}
	default:
		bad("subject_strategy", "%q is not topic_name, record_name or topic_record_name", c.SubjectStrategy)
	}
	for _, p := range placeholderRE.FindAllString(c.RecordName, -1) {
		if !placeholders[p] {
			bad("record_name", "unknown placeholder %s (want {aggregate_type} {event_type} {schema} {table} {topic})", p)
		}
	}
	switch c.Key {
	case "", KeyRaw:
	case KeyString:
		if proto {
			bad("key", "string keys are not supported with protobuf topics (Protobuf has no primitive string schema): use raw")
		}
	default:
		bad("key", "%q is not raw or string", c.Key)
	}
	subjects := make([]string, 0, len(c.Schemas))
	for subject := range c.Schemas {
		subjects = append(subjects, subject)
	}
	sort.Strings(subjects)
	for _, subject := range subjects {
		file := c.Schemas[subject]
		if subject == "" {
			bad("schemas", "empty subject")
		}
		if _, err := os.Stat(file); err != nil {
			bad("schemas", "subject %q: %v", subject, err)
		}
	}
	switch {
	case c.TLS.CertFile != "" && c.TLS.KeyFile == "":
		bad("tls.cert_file", "needs %stls.key_file too (mutual TLS)", prefix)
	case c.TLS.KeyFile != "" && c.TLS.CertFile == "":
		bad("tls.key_file", "needs %stls.cert_file too (mutual TLS)", prefix)
	}
	for _, kf := range [][2]string{{"tls.ca_file", c.TLS.CAFile}, {"tls.cert_file", c.TLS.CertFile}, {"tls.key_file", c.TLS.KeyFile}} {
		if key, f := kf[0], kf[1]; f != "" {
			if _, err := os.Stat(f); err != nil {
				bad(key, "%v", err)
			}
		}
	}
	if strings.ContainsAny(c.VersionHeader, " \t\n") {
		bad("version_header", "%q is not a header name", c.VersionHeader)
	}
	return errors.Join(errs...)
}
