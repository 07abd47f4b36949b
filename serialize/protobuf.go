package serialize

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoCodec encodes JSON payloads as one message of a compiled .proto
// file. Safe for concurrent use once built.
type protoCodec struct {
	file    protoreflect.FileDescriptor
	msg     protoreflect.MessageDescriptor // the message Encode writes
	indexes []int                          // its Confluent message indexes
}

const protoMain = "outbox-relay-schema.proto"

// newProtoCodec compiles text with refs (import path -> text); message is
// the full name of the message to encode, "" for the file's first.
func newProtoCodec(text string, refs map[string]string, message string) (*protoCodec, error) {
	srcs := make(map[string]string, len(refs)+1)
	for k, v := range refs {
		srcs[k] = v
	}
	srcs[protoMain] = text
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(srcs),
		}),
	}
	files, err := c.Compile(context.Background(), protoMain)
	if err != nil {
		return nil, fmt.Errorf("compile Protobuf schema: %w", err)
	}
	fd := files[0]
	pc := &protoCodec{file: fd}
	if message == "" {
		if fd.Messages().Len() == 0 {
			return nil, fmt.Errorf("protobuf schema declares no message")
		}
		pc.msg = fd.Messages().Get(0)
	} else {
		d := fd.FindDescriptorByName(protoreflect.FullName(message))
		md, ok := d.(protoreflect.MessageDescriptor)
		if !ok {
			return nil, fmt.Errorf("protobuf schema (package %q) has no message %q", fd.Package(), message)
		}
		pc.msg = md
	}
	pc.indexes = messageIndexes(pc.msg)
	return pc, nil
}

// messageIndexes is the path of md from the file's top-level messages:
// [0] for the first message, [1, 0] for the first nested in the second.
func messageIndexes(md protoreflect.MessageDescriptor) []int {
	var idx []int
	var d protoreflect.Descriptor = md
	for {
		m, ok := d.(protoreflect.MessageDescriptor)
		if !ok {
			break
		}
		idx = append([]int{m.Index()}, idx...)
		d = m.Parent()
	}
	return idx
}

// encode appends the message indexes and the binary message built from
// the JSON payload (unknown fields refused) to dst.
func (c *protoCodec) encode(dst, payload []byte) ([]byte, error) {
	if !utf8.Valid(payload) { // protojson checks the rest, trailing data included
		_, err := decodeJSON(payload) // for its words and offset
		return nil, err
	}
	m := dynamicpb.NewMessage(c.msg)
	if err := protojson.Unmarshal(payload, m); err != nil {
		return nil, mismatchf("", "%s", strings.TrimPrefix(err.Error(), "proto: "))
	}
	dst = appendIndexes(dst, c.indexes)
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(dst, m)
	if err != nil {
		return nil, mismatchf("", "protobuf encoding: %v", err)
	}
	return b, nil
}

// appendIndexes writes Confluent's message-index array: a single 0 for the
// first message, else the count and each index as zig-zag varints.
func appendIndexes(dst []byte, idx []int) []byte {
	b, _ := new(sr.ConfluentHeader).AppendEncode(nil, 0, idx)
	return append(dst, b[5:]...)
}

// decode reads the message indexes and the message, and gives protojson.
func (c *protoCodec) decode(data []byte) ([]byte, error) {
	idx, rest, err := new(sr.ConfluentHeader).DecodeIndex(data, 64)
	if err != nil {
		return nil, fmt.Errorf("read protobuf message indexes: %w", err)
	}
	md, err := c.messageAt(idx)
	if err != nil {
		return nil, err
	}
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(rest, m); err != nil {
		return nil, fmt.Errorf("decode protobuf %s: %w", md.FullName(), err)
	}
	j, err := protojson.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("protobuf %s to JSON: %w", md.FullName(), err)
	}
	// protojson varies its whitespace on purpose; consumers get it compact.
	var b bytes.Buffer
	if err := json.Compact(&b, j); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func (c *protoCodec) messageAt(idx []int) (protoreflect.MessageDescriptor, error) {
	msgs := c.file.Messages()
	var md protoreflect.MessageDescriptor
	for _, i := range idx {
		if i < 0 || i >= msgs.Len() {
			return nil, fmt.Errorf("protobuf message index %v is not in the schema", idx)
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	if md == nil {
		return nil, fmt.Errorf("protobuf message index is empty")
	}
	return md, nil
}
