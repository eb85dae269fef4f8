# The two commands a new user needs are `make run` and `make test`; the rest serve development.
# Builds use the committed query data in .sqlx/, so no database is needed to compile.

export SQLX_OFFLINE := true
CARGO ?= cargo
# Integration tests mostly wait on the network and the database, so more threads than cores help;
# but at 8, two clean-clone runs on 2 cores each had 3 or 4 of 352 tests overrun a timeout (a pool
# acquire or a request past its limit: 503), and at 6 one (retention's window), all of which pass
# alone and in a quiet run: 4 leaves them their margin.
TEST_THREADS ?= 4

.PHONY: run test explore deploy-test model mutants test-citus contract openapi fmt lint check pg-image sqlx-prepare clean-containers bench bench-compare bench-pools bench-expiry bench-citus bench-stalls bench-delivery profile

## Start the service with a throwaway PostgreSQL, a demo account and curl examples (Ctrl-C stops).
run:
	$(CARGO) run --bin idempay -- dev

## Unit and integration tests, the client crate's included; PostgreSQL runs in a container started
## by the tests; Debian's prometheus package (promtool, the server) is installed for the alert rules'
## tests where it is missing (scripts/install-prometheus.sh). The examples are built first as the
## programs they are: the mechanism's example service is run by a test (tools/adoption.rs). Then
## the documentation's examples (`--all-targets` leaves doctests out): the mechanism's runnable
## ones are compiled and run as a reader would copy them.
test:
	bash scripts/install-prometheus.sh
	$(CARGO) build --workspace --examples --features failpoints
	$(CARGO) test --workspace --all-targets --features failpoints -- --test-threads $(TEST_THREADS)
	$(CARGO) test --workspace --doc --features failpoints

## The fault-schedule explorer (tests/explore/): seeded schedules of faults on real processes, each
## ending with the ledgers' invariants; the regression seeds first, then SCHEDULES seeds drawn from
## the clock, within about nine minutes (a run that runs out of time before its last seed fails).
## SEED=S runs seeds S… only: `make explore SEED=S SCHEDULES=1` replays a failure (with
## EXPLORE_PAUSES=0 for a seed found before pauses existed, as the failure's command says). The
## same features as `make test`, so it reuses that build.
SCHEDULES ?= 5
SEED ?=
explore:
	EXPLORE_SCHEDULES=$(SCHEDULES) EXPLORE_SEED=$(SEED) $(CARGO) test --features failpoints --test explore

## A rolling deploy under faults (tests/explore/deploy.rs): the previous release (the commit in
## scripts/previous-release, built under target/previous/) migrates and serves, then the processor
## and each instance are replaced by this build one by one while the explorer's intents and faults
## go on; once rolled out, and once rolled back. DEPLOY_SEED=S picks the schedule.
deploy-test:
	bash scripts/deploy-test.sh

## The key lifecycle as a model (crates/model/), checked exhaustively by stateright: every
## interleaving of two clients, two instances, the processor, the recovery job, network faults and
## crashes at the full size (about 16 million states, minutes), then a manual payment captured and
## canceled by two racing keys (the capture size, 10.7 million states; exits non-zero when a property fails
## or an example is never found), then the model's tests: the small size and each defect's
## counterexample. The full size is checked once: its ignored test repeats what the run above did.
model:
	$(CARGO) run --release -p model
	$(CARGO) run --release -p model -- --size capture
	$(CARGO) test --release -p model

## Mutants of the mechanism crate's modules that its unit tests cover (cargo-mutants, installed on
## the way): each built and tested, caught, missed or timed out counted, in about 10 minutes.
## SHARD=k/n runs one of n shards. The modules and the mutants explained are in scripts/mutants.toml;
## the score is in tests/README.md.
SHARD ?=
mutants:
	SHARD=$(SHARD) bash scripts/mutants.sh

## The cluster suite: the tests marked #[api_test(citus)] on a Citus coordinator and two workers
## (scripts/citus-cluster.sh), started for the run and removed after it. Two tests at a time: the
## three nodes share this machine's two cores with every test's instances, and with four at a time
## requests waited past their timeouts.
CITUS_TEST_THREADS ?= 2
## Then one short schedule of the explorer on a cluster of its own (tests/explore/, EXPLORE_CITUS):
## seed 52: three instances, a slow and lossy processor killed, an instance paused and the
## coordinator restarted, in about a minute with the cluster's start.
CITUS_EXPLORE_SEED ?= 52
test-citus:
	IDEMPAY_TEST_CITUS=1 $(CARGO) test --features failpoints --test api -- --test-threads $(CITUS_TEST_THREADS)
	EXPLORE_CITUS=1 EXPLORE_SEED=$(CITUS_EXPLORE_SEED) EXPLORE_SCHEDULES=1 $(CARGO) test --features failpoints --test explore

## Fuzz the live service from its OpenAPI description (schemathesis), render /docs in Chromium,
## double-click "Pay" on the checkout page there (Selenium), and tour the API through a Python client
## generated from the committed description (openapi-python-client, scripts/client-tour.py).
contract:
	bash scripts/contract.sh

## Regenerate openapi/openapi.json from the code (a test fails while it is stale).
openapi:
	$(CARGO) run --quiet --bin idempay -- openapi > openapi/openapi.json

## Format the code.
fmt:
	$(CARGO) fmt --all

## Formatting, the migrations (squawk, scripts/lint-migrations.sh), clippy and the API docs
## (no broken link), as CI checks them.
lint:
	$(CARGO) fmt --all --check
	bash scripts/lint-migrations.sh
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

## Everything CI runs.
check: lint test contract

## Find or build the PostgreSQL image (IDEMPAY_PG_IMAGE chooses another).
pg-image:
	@bash scripts/pg-image.sh

## Regenerate .sqlx/ after changing a query or a migration (starts a throwaway PostgreSQL).
sqlx-prepare:
	bash scripts/sqlx-prepare.sh

## Remove PostgreSQL containers left behind by interrupted test runs.
clean-containers:
	docker ps -aq --filter label=org.testcontainers.managed-by=testcontainers | xargs -r docker rm -f

## Throughput and latency of idempay over HTTP against two limits, each a payment's SQL through
## pgbench: idempay's own statements done the straightforward way, and the seed's design (one key
## table, four statements a hop); with the CPU per request of each process, the rows and WAL written
## per payment, and a picture. About 25 minutes; BENCH_QUICK=1 for a try in about seven. Results in
## target/bench/bench.{json,md,svg}; bench/README.md lists the knobs.
bench:
	bash bench/bench.sh

## The working tree against another revision, side by side in one run: REV is built in a temporary
## worktree (release, its target directory kept in target/bench-compare for the next run), then both
## are measured alternately, round after round (BENCH_ROUNDS, 5), new keys and replays at c=16 and
## c=64 (BENCH_WORKLOADS, BENCH_CONCURRENCY), 10 s each (BENCH_SECONDS); each round and the median
## ratio, working tree / REV, in target/bench/compare/compare.md. About 9 minutes with the defaults,
## plus a first build of REV (10-20 minutes on two cores).
REV ?=
bench-compare:
	@test -n "$(REV)" || { echo "usage: make bench-compare REV=<commit>" >&2; exit 2; }
	bash bench/compare.sh "$(REV)"

## New keys with durable commits at c=1, 16, 64 for each pool size (BENCH_POOLS="4 8 16 32"): the
## curve the default pool size is chosen from. Results in target/bench/pools.md.
bench-pools:
	bash bench/pools.sh

## The expiry job draining 2.5 million expired keys under load, against the same load without it.
## Results in target/bench/expiry.{json,md}.
bench-expiry:
	bash bench/expiry.sh

## The same build on a Citus cluster (a coordinator, two workers) against one server, side by side.
## Results in target/bench/citus.{json,md}.
bench-citus:
	bash bench/citus.sh

## The limit alone (pgbench, no build) for 60 s at c=16, each second's worst latency beside WAL
## flushes, segments, checkpoints, autovacuum and the disk (STALLS_RUNS, STALLS_PG_OPTS,
## STALLS_PREPARE). Results in target/bench/stalls/.
bench-stalls:
	bash bench/stalls.sh

## The delivery loop's throughput to 1, 10 and 100 loopback endpoints, 6,000 deliveries each
## (BENCH_DELIVERIES), with the ratio to 1 endpoint; about a minute. Results in target/bench/delivery.txt.
bench-delivery:
	bash bench/delivery.sh

## Where a new-key request's CPU goes: perf samples of idempay under load, in target/bench/profile.md.
profile:
	bash bench/profile.sh
