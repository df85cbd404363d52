# Targets match what CI runs (.ci/run). The repository is several Go
# modules tied by go.work (the core, each store, each integration, the
# binary; see README.md); PKGS names every package of all of them. Server-backed tests
# read IDEM_TEST_POSTGRES_URL, IDEM_TEST_MYSQL_DSN, IDEM_TEST_REDIS_ADDR and
# IDEM_TEST_REDIS_CLUSTER; without them they skip with a message, and fail
# under CI=true.

MODULES := $(shell go list -f '{{.Dir}}' -m)
PKGS := $(addsuffix /...,$(MODULES))
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test race vet lint tidy-check ci bench fuzz fault compat

# The README's test command (make race: with -race), then one line naming
# the tests skipped for want of a server or a tool.
test:
	@skips=$$(mktemp); status=0; \
	IDEM_TEST_SKIPS=$$skips go test $(TESTFLAGS) -timeout 30m $$(go list -f '{{.Dir}}/...' -m) || status=$$?; \
	go run ./internal/tools/skipsummary $$skips; rm -f $$skips; exit $$status

race:
	@$(MAKE) --no-print-directory test TESTFLAGS=-race

vet:
	go vet $(PKGS)

lint: vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt would change:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(STATICCHECK) $(PKGS)

# Every module's go.mod and go.sum are tidy on their own (without go.work).
tidy-check:
	@for d in $(MODULES); do (cd $$d && GOWORK=off go mod tidy -diff) || { echo "not tidy: $$d"; exit 1; }; done

# Starts the local services if they are down, then lint, tidy-check and the race tests.
ci:
	./.ci/run

# Ratios against the baseline of the same run; see BENCHMARKS.md.
bench:
	go test -run '^$$' -bench BenchmarkMiddleware -benchmem -count 5 . | go run ./internal/tools/benchratio

# A short run of every fuzz target.
fuzz:
	go test -run '^$$' -fuzz FuzzParse -fuzztime 20s ./internal/header/
	go test -run '^$$' -fuzz FuzzQuotedFastPath -fuzztime 20s ./internal/header/
	go test -run '^$$' -fuzz FuzzSum -fuzztime 20s ./internal/fingerprint/
	go test -run '^$$' -fuzz FuzzCanonicalJSON -fuzztime 20s ./internal/fingerprint/
	go test -run '^$$' -fuzz FuzzCanonicalNumber -fuzztime 20s ./internal/fingerprint/
	go test -run '^$$' -fuzz FuzzForm -fuzztime 20s ./internal/fingerprint/
	go test -run '^$$' -fuzz FuzzTarget -fuzztime 20s ./internal/fingerprint/
	go test -run '^$$' -fuzz FuzzFields -fuzztime 20s ./internal/fingerprint/
	go test -run '^$$' -fuzz FuzzRetryAfter -fuzztime 20s ./client/
	go test -run '^$$' -fuzz FuzzWebhookSignature -fuzztime 20s ./cmd/idem/internal/cli/

# The full fault test of the proxy (see docs/fault-test.md): several
# proxies, SIGKILLs, PostgreSQL crashes, concurrent duplicates. Minutes long;
# go test runs a reduced version of it.
fault:
	IDEM_FAULT_FULL=1 go test -count=1 -v -timeout 30m -run '^TestFault' ./cmd/idem/

# The full client compatibility run (see docs/library.md, "A client that retries
# safely"): stripe-go and Python requests through a relay that loses 10% of
# the answers, 2,000 calls per variant; go test runs a few hundred.
compat:
	IDEM_COMPAT_CALLS=2000 go test -count=1 -v -timeout 60m ./internal/compat/
