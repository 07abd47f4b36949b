package main

// The "formats" part (issue 39): what each record format costs the relay.
// One backlog of formatEvents outbox rows (100 per transaction, the drain's
// ~400-byte payload) behind one slot per leg and repeat, drained by the
// relay writing plain JSON, the Schema Registry's Avro, JSON Schema and
// Protobuf, and CloudEvents (binary and structured), legs interleaved in
// each repeat so drift hits them alike. The relay's CPU per event and its
// rate, each beside plain JSON's of the same repeat.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"
)

// formatEvents is the backlog of each formats leg.
var formatEvents = 100_000

// formatLeg is one way of writing the records.
type formatLeg struct {
	Name       string
	SchemaType string // AVRO, JSON, PROTOBUF: registered under <topic>-value first; "" none
	Schema     string
	Flags      []string // beside --schema-registry-url when SchemaType is set
}

var formatLegs = []formatLeg{
	{Name: "json"},
	{Name: "avro", SchemaType: "AVRO", Schema: benchAvro, Flags: []string{"--serialization", "avro"}},
	{Name: "json_schema", SchemaType: "JSON", Schema: benchJSONSchema, Flags: []string{"--serialization", "json_schema"}},
	{Name: "protobuf", SchemaType: "PROTOBUF", Schema: benchProto, Flags: []string{"--serialization", "protobuf"}},
	{Name: "cloudevents", Flags: []string{"--envelope", "cloudevents"}},
	{Name: "cloudevents_structured", Flags: []string{"--envelope", "cloudevents", "--cloudevents-mode", "structured"}},
}

// The schemas of the drain's payload (payloadSQL).
const benchAvro = `{"type":"record","name":"Order","namespace":"bench","fields":[
 {"name":"order_id","type":"string"},{"name":"seq","type":"long"},{"name":"customer_id","type":"string"},
 {"name":"status","type":"string"},{"name":"currency","type":"string"},{"name":"amount","type":"double"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
   {"name":"sku","type":"string"},{"name":"qty","type":"int"},{"name":"unit_price","type":"double"}]}}},
 {"name":"shipping","type":{"type":"record","name":"Shipping","fields":[
   {"name":"street","type":"string"},{"name":"city","type":"string"},{"name":"zip","type":"string"},{"name":"country","type":"string"}]}},
 {"name":"note","type":"string"}]}`

const benchJSONSchema = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","additionalProperties":false,
 "required":["order_id","seq","amount","items"],
 "properties":{"order_id":{"type":"string"},"seq":{"type":"integer"},"customer_id":{"type":"string"},"status":{"type":"string"},
  "currency":{"type":"string","minLength":3,"maxLength":3},"amount":{"type":"number","minimum":0},
  "items":{"type":"array","items":{"type":"object","additionalProperties":false,
    "properties":{"sku":{"type":"string"},"qty":{"type":"integer","minimum":1},"unit_price":{"type":"number"}}}},
  "shipping":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string"},"country":{"type":"string"}}},
  "note":{"type":"string"}}}`

const benchProto = `syntax = "proto3";
package bench;
message Order {
  string order_id = 1; int64 seq = 2; string customer_id = 3; string status = 4; string currency = 5; double amount = 6;
  repeated Item items = 7; Shipping shipping = 8; string note = 9;
  message Item { string sku = 1; int32 qty = 2; double unit_price = 3; }
  message Shipping { string street = 1; string city = 2; string zip = 3; string country = 4; }
}`

// formatRun is one drain of one leg.
type formatRun struct {
	Leg        string
	Rep        int
	EventsPerS float64
	CPUPerEv   float64 // relay CPU us per event
	Err        string
}

type formatsResult struct {
	Events, PerTxn int
	Runs           []formatRun
}

// runFormats fills one backlog behind a slot per leg and repeat, then
// drains them leg by leg, the legs' order rotating per repeat.
func (b *bench) runFormats(ctx context.Context) *formatsResult {
	reps := b.sc.Repeats
	events := formatEvents
	if b.sc.Name == "small" {
		events = 20_000
	}
	res := &formatsResult{Events: events, PerTxn: 100}
	if b.env["OUTBOX_TEST_SCHEMA_REGISTRY_URL"] == "" {
		res.Runs = append(res.Runs, formatRun{Err: "no schema registry in the services' env file (OUTBOX_TEST_SCHEMA_REGISTRY_URL)"})
		return res
	}
	slots := map[string]string{}
	for rep := range reps {
		for _, l := range formatLegs {
			slot := fmt.Sprintf("%s_fmt%d_%d", b.pg.schema, rep, len(slots))
			if _, err := b.pg.createSlot(ctx, slot); err != nil {
				res.Runs = append(res.Runs, formatRun{Leg: l.Name, Rep: rep, Err: err.Error()})
				return res
			}
			defer b.pg.dropSlot(context.WithoutCancel(ctx), slot)
			slots[fmt.Sprint(rep, l.Name)] = slot
		}
	}
	end, err := b.pg.fill(ctx, res.Events, res.PerTxn, b.fillSessions, "order")
	if err != nil {
		res.Runs = append(res.Runs, formatRun{Err: err.Error()})
		return res
	}
	for rep := range reps {
		for i := range formatLegs {
			l := formatLegs[(i+rep)%len(formatLegs)]
			if ctx.Err() != nil {
				return res
			}
			tag := fmt.Sprintf("fmt-%s-%d", strings.ReplaceAll(l.Name, "_", "-"), rep)
			flags := l.Flags
			if l.SchemaType != "" {
				subject := b.topicPrefix + tag + ".order-value"
				if err := registerSchema(ctx, b.env["OUTBOX_TEST_SCHEMA_REGISTRY_URL"], subject, l.SchemaType, l.Schema); err != nil {
					res.Runs = append(res.Runs, formatRun{Leg: l.Name, Rep: rep, Err: err.Error()})
					continue
				}
				flags = append([]string{"--schema-registry-url", b.env["OUTBOX_TEST_SCHEMA_REGISTRY_URL"]}, flags...)
			}
			d := b.drainRelay(ctx, b.relayBin, slots[fmt.Sprint(rep, l.Name)], end, res.Events, tag, nil, flags...)
			r := formatRun{Leg: l.Name, Rep: rep, EventsPerS: d.EventsPerS, CPUPerEv: d.ToolCPU / float64(res.Events) * 1e6, Err: d.Err}
			logf("formats %s rep %d: %.0f events/s, relay CPU %.2f us/event %s", l.Name, rep, r.EventsPerS, r.CPUPerEv, r.Err)
			res.Runs = append(res.Runs, r)
		}
	}
	return res
}

// registerSchema registers schema under subject (Confluent's API).
func registerSchema(ctx context.Context, base, subject, schemaType, schema string) error {
	body, _ := json.Marshal(map[string]string{"schema": schema, "schemaType": schemaType})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+"/subjects/"+subject+"/versions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("register %s: %w", subject, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("register %s: HTTP %d: %s", subject, resp.StatusCode, msg)
	}
	return nil
}

// legMedians are the medians over the repeats of one leg, and of its CPU
// per event over plain JSON's of the same repeat.
func (f *formatsResult) legMedians(leg string) (rate, cpu, vsJSON float64, n int) {
	var rates, cpus, ratios []float64
	json := map[int]float64{}
	for _, r := range f.Runs {
		if r.Leg == "json" && r.Err == "" {
			json[r.Rep] = r.CPUPerEv
		}
	}
	for _, r := range f.Runs {
		if r.Leg != leg || r.Err != "" {
			continue
		}
		rates, cpus = append(rates, r.EventsPerS), append(cpus, r.CPUPerEv)
		if j, ok := json[r.Rep]; ok && j > 0 {
			ratios = append(ratios, r.CPUPerEv/j)
		}
	}
	if len(rates) == 0 {
		return math.NaN(), math.NaN(), math.NaN(), 0
	}
	vsJSON = math.NaN()
	if len(ratios) > 0 {
		vsJSON = summarize(ratios).Med
	}
	return summarize(rates).Med, summarize(cpus).Med, vsJSON, len(rates)
}

func (f *formatsResult) markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "One backlog of %d outbox rows in transactions of %d (the drain's ~400-byte payload) behind a slot per leg and repeat, drained by the relay in each record format, legs interleaved (order rotating per repeat); medians over the repeats. CPU from `/proc/<pid>/stat`, start to the slot confirmed; the extra CPU per event of a format is its cost over plain JSON's.\n\n", f.Events, f.PerTxn)
	sb.WriteString("| format | repeats | events/s | relay CPU us/event | vs plain JSON (CPU, same repeat) | extra us/event |\n|---|---:|---:|---:|---:|---:|\n")
	_, jsonCPU, _, _ := f.legMedians("json")
	for _, l := range formatLegs {
		rate, cpu, ratio, n := f.legMedians(l.Name)
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s |\n", l.Name, n, f0(rate), f2(cpu), f2(ratio), f2(cpu-jsonCPU))
	}
	for _, r := range f.Runs {
		if r.Err != "" {
			fmt.Fprintf(&sb, "\nerror: %s repeat %d: %s\n", r.Leg, r.Rep, r.Err)
		}
	}
	sb.WriteString("\n")
	return sb.String()
}
