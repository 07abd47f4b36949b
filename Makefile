# outbox-relay. Quick start: `make demo`, `make test`.
GO      ?= go
BIN     := bin/outbox-relay
PKGS    := ./...

.PHONY: build test unit e2e lint demo services-up services-down clean

build:
	$(GO) build -o $(BIN) ./cmd/outbox-relay

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags e2e ./test/...

# Everything: lint, unit tests with -race, then the end-to-end suite against
# a real PostgreSQL 15 and a real Kafka 4.x that test/services.sh starts and
# stops. Fails (never skips) when a service cannot start.
test: lint build
	bash test/run-tests.sh

unit:
	$(GO) test -race -count=1 $(PKGS)

# Starts local PostgreSQL + Kafka, migrates, runs the relay and a sample
# order service, and shows events arriving in Kafka with the slot lag.
demo: build
	bash test/demo.sh

services-up:
	bash test/services.sh start

services-down:
	bash test/services.sh stop

clean:
	rm -rf bin test/.run
