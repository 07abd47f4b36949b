# outbox-relay. Quick start: `make demo`, `make test`.
GO      ?= go
BIN     := bin/outbox-relay
PKGS    := ./...

.PHONY: build test unit e2e chaos formats lint demo demo-test services-up services-down clean bench alerts matrix matrix-kafka compat bench-peer bench-curves

build:
	$(GO) build -o $(BIN) ./cmd/outbox-relay

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags e2e ./test/...
	$(GO) vet -tags 'e2e formats' ./test/e2e/

# Everything: lint, the alert rules (make alerts), unit tests with -race,
# then the end-to-end suite and the short fault-injection suite against a
# real PostgreSQL 15, a real Kafka 4.x and a real Schema Registry (Apicurio,
# Confluent API) that test/services.sh fetches (once, from Maven Central, into
# ~/.cache/outbox-relay), starts and stops (its cluster scenario on a three-node Kafka cluster), then the end-to-end smoke subset (delivery, SIGTERM restart,
# kill -9, broker down, idle slot advance, publication checks) on
# PostgreSQL 14, 16, 17 and 18 (server builds from Maven Central,
# test/pg-fetch.sh). Fails (never skips) when a service, a PostgreSQL
# version or promtool cannot start.
test: lint build
	bash test/run-tests.sh

# The whole end-to-end suite on every supported PostgreSQL: 15 (Debian's),
# then 14, 16, 17 and 18 in turn against the same Kafka; a table of the
# results at the end. OUTBOX_PG_MATRIX_VERSIONS="17 18" for fewer.
matrix: build
	bash test/run-matrix.sh

# The delivery, kill -9 and exactly-once end-to-end tests against every
# tested Kafka release: 3.9.1, 4.2.0 and 4.4.0 in turn, each on a fresh
# PostgreSQL 15 and a fresh broker of that release (jars from Maven Central,
# cached per release); once with the relay's defaults (direct producer,
# kafka.version 3.6.0), once with kafka.producer sarama and kafka.version set
# to the broker's release. A table of the results at the end; fails if a
# broker cannot start or any test fails. OUTBOX_KAFKA_MATRIX_VERSIONS="3.9.1"
# for fewer. Not part of `make test` (about 6.5 minutes).
matrix-kafka: build
	bash test/run-matrix-kafka.sh

# The long fault-injection suite (docs/chaos.md): 100k events per scenario
# under relay and broker kills, broker pauses, PostgreSQL restarts, network
# cuts, SIGTERM restarts, leader takeovers and a three-node Kafka cluster
# losing leaders (60k events), every scenario in both
# delivery modes; prints the tables (also in test/.run/chaos-table.md).
# Fails on any loss, order or partition violation, and in exactly-once mode
# on any duplicate or partial PostgreSQL transaction visible.
chaos: build
	bash test/run-chaos.sh

# The long suite of the Schema Registry formats and CloudEvents (issue 39,
# docs/testing.md "make formats"): Protobuf under the record_name strategy,
# schema_version headers picking versions, keys in the wire format, schema
# files auto-registered (and refused without), exactly-once with Avro,
# replay, the inbox decoding, the registry stopped for 20 s and restarted
# empty, CloudEvents of message events; every record read by an
# independent decoder with the schema fetched by id. On its own PostgreSQL,
# Kafka and registry (test/run-formats.sh); `make test` runs the short
# subset (test/e2e/formats_test.go). About 2 minutes.
formats: build
	bash test/run-formats.sh

# The alert rules alone: promtool check rules deploy/alerts.yaml and the
# promtool unit tests in test/alerts/ (promtool from Debian's prometheus
# package, fetched when missing). The first step of `make test`.
alerts:
	bash test/alerts.sh

# The relay's `compat: debezium` against Debezium 3.6.1.Final (PostgreSQL
# connector + Outbox Event Router on Kafka Connect 4.3.0 standalone, jars
# from Maven Central, test/compat/pom.xml) on the same 20,000-event backlog
# and broker, record by record: topic, partition, offset, key, value and
# headers (test/run-compat.sh, docs/migrating-from-debezium.md). Fails on
# any difference outside the documented allow-list, and (never skips) when
# a service, Kafka Connect or Debezium cannot start. About 3 minutes.
compat:
	bash test/run-compat.sh

unit:
	$(GO) test -race -count=1 $(PKGS)

# Benchmarks, not part of `make test` (bench/README.md): backlog drain against
# pg_recvlogical, steady-state latency, relay profiles, cost curves, the exactly-once
# relay next to the at-least-once one (OUTBOX_BENCH_DELIVERY), on a private
# PostgreSQL + Kafka (test/services.sh with run dir BENCH_RUN_DIR); writes
# bench/results/. OUTBOX_BENCH_SCALE=small for a quick run, OUTBOX_BENCH_RELAY
# to use another relay binary (default: ./cmd/outbox-relay built here),
# OUTBOX_BENCH_LAT_MODE=together to run the latency legs at the same time
# (default turns: each leg alone, one after the other, per phase).
BENCH_RUN_DIR ?= $(CURDIR)/bench/.run

bench:
	@mkdir -p "$(BENCH_RUN_DIR)"
	$(GO) build -o "$(BENCH_RUN_DIR)/outbox-bench" ./bench
	@if [ -z "$$OUTBOX_BENCH_RELAY" ]; then \
	  echo "$(GO) build -o $(BENCH_RUN_DIR)/outbox-relay ./cmd/outbox-relay"; \
	  $(GO) build -o "$(BENCH_RUN_DIR)/outbox-relay" ./cmd/outbox-relay || exit 1; fi
	@export OUTBOX_TEST_RUN_DIR="$(BENCH_RUN_DIR)"; \
	  trap 'bash test/services.sh stop' INT TERM; \
	  rc=0; \
	  bash test/services.sh start && \
	    "$(BENCH_RUN_DIR)/outbox-bench" -env "$(BENCH_RUN_DIR)/env" $(BENCH_ARGS) \
	      -relay "$${OUTBOX_BENCH_RELAY:-$(BENCH_RUN_DIR)/outbox-relay}" || rc=$$?; \
	  bash test/services.sh stop; \
	  exit $$rc

# Cost curves alone (issue 16, bench/README.md part 5; also the last part of
# `make bench`): payload size, topics, aggregates, one large transaction,
# +1 ms round trip to Kafka and to PostgreSQL through test/proxy; about 6
# minutes at full scale. The same services handling as bench; writes
# bench/results/*-curves.* (latest-curves.* at full scale), which the main
# report links.
bench-curves:
	$(MAKE) bench BENCH_ARGS="-parts curves -delivery at_least_once"

# Starts local PostgreSQL + Kafka (+ the tests' Schema Registry: test/services.sh
# start fetches and starts all three), migrates, runs the relay, the sample
# order service (examples/orders, package outbox) and billing consumer
# (examples/billing, package inbox), and shows service -> outbox -> relay ->
# Kafka -> consumer, with re-published records skipped as duplicates, the
# relay's lag and a footer of experiments. Until Ctrl-C (DEMO_DURATION=30s:
# by itself); stops everything it started and exits 0 however it is stopped.
demo: build
	bash test/demo.sh

# The demo's own test (test/demotest, about 2 min, not part of `make test`):
# Ctrl-C on `make demo | tee` in a pseudo-terminal, SIGTERM to the process
# group, the terminal closing, DEMO_DURATION; each must leave no process, temp
# dir or temporary run-dir file, and exit 0 where make is not signalled.
demo-test: build
	$(GO) test -count=1 -tags e2e -v ./test/demotest/

# Debezium in the bench (issue 16, bench/README.md "make bench-peer"):
# Debezium 3.6.1.Final + Outbox Event Router on Kafka Connect 4.3.0 (tuned;
# every setting written to the report) and the relay (compat: debezium)
# drain the same 1M-event backlog (written once; a slot per contender and
# repeat) into the same broker, one after the other, OUTBOX_PEER_REPEATS (3)
# times, who goes first alternating; every output verified by a real
# consumer (every event once, in order per key); min/median/max of events/s
# with and without startup, CPU per event and peak RSS, relay/Debezium per
# repeat, a plot (test/run-bench-peer.sh; bench/.run/peer/peer.{md,png};
# bench/results/*-peer.* and latest-peer.* for a 1M-event run).
# OUTBOX_PEER_EVENTS for a smaller backlog.
bench-peer:
	bash test/run-bench-peer.sh

services-up:
	bash test/services.sh start

services-down:
	bash test/services.sh stop

clean:
	rm -rf bin test/.run
