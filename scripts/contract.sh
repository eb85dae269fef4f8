#!/usr/bin/env bash
# Contract checks against a live `idempay dev` (throwaway PostgreSQL, demo account):
#   1. schemathesis fuzzes every operation of the service's own /openapi.json, so the spec and
#      the server cannot drift apart (no 5xx; documented status codes, content types, headers
#      and bodies);
#   2. a headless chromium renders /docs with every host but 127.0.0.1 unresolvable, so the
#      Swagger UI must work from the binary's vendored assets alone;
#   3. the same chromium, driven by Selenium (scripts/checkout-browser.py), double-clicks "Pay" on
#      the checkout page (/demo/checkout) with the slow test card: one payment, the second click
#      answered from the same key; then, in the page's naive mode (a key per click), two;
#   4. openapi-python-client, at a pinned version in a venv of its own and with no network, generates
#      a Python client from the committed openapi/openapi.json (anew each run, into
#      target/contract/client) and must warn of nothing (ruff's formatting, run afterwards, may
#      fail with a warning only); scripts/client-tour.py then walks the API through it: a payment,
#      its replay, a mismatch (422), a declined card (402), the list, a partial and a body-less full
#      refund, the events, the key's inspection, a webhook endpoint for `*` and a dispute opened
#      at the processor as the banner shows, each step checked through the generated models;
#   5. OpenAPI Generator's typescript-fetch (PyPI's openapi-generator-cli, pinned, on the machine's
#      Java, with no network) generates a TypeScript client from the same file (into
#      target/contract/ts-tour/client), which `tsc --strict` (Debian's node-typescript) checks with
#      scripts/client-tour.ts and compiles; Node runs the tour: a manual payment, a partial capture
#      and its replay, a cancel and the 409 of a capture after it, a refund of the captured money,
#      a 422 with its mismatched_fields, the list, and a dispute won at the processor.
# The last line is `contract: N passed, M failed`; the exit status is non-zero when M > 0.
# Everything it writes (server output, reports, screenshots, the venvs of schemathesis and
# Selenium and of the client generators, the generated clients) is under target/contract/.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly OUT=$PWD/target/contract
# Pinned: a new schemathesis release can add checks or change its CLI and so break CI unasked.
readonly SCHEMATHESIS_VERSION=4.32.5
# Pinned too; newer releases want a certifi newer than some mirrors carry.
readonly SELENIUM_VERSION=4.38.0
readonly VENV=$OUT/venv
# Pinned, in a venv of its own (its pydantic and httpx need not agree with schemathesis's): the
# generated code changes with its releases. 0.29.1 reads x-enum-varnames on string enums.
readonly OPENAPI_PYTHON_CLIENT_VERSION=0.29.1
readonly CLIENT_VENV=$OUT/client-venv
readonly STARTUP_TIMEOUT=120
# Ceilings only: a normal run takes well under a minute for each.
readonly SCHEMATHESIS_TIMEOUT=600
readonly BROWSER_TIMEOUT=120
readonly CLIENT_TIMEOUT=120
# The TypeScript client's generator, pinned, in a venv of its own. npm's registry (openapi-typescript,
# openapi-fetch, TypeScript itself) cannot be reached from here, PyPI can: OpenAPI Generator's jar
# comes as a PyPI package. 7.5.0, as later releases narrow with `in` on an `object`, which needs
# TypeScript 4.9, and Debian's node-typescript is 4.8.
readonly OPENAPI_GENERATOR_VERSION=7.5.0
readonly TS_VENV=$OUT/ts-venv

log() { printf 'contract: %s\n' "$*" >&2; }

# --- bookkeeping: each check counts once in the summary line -----------------------------------
readonly CHECK_COUNT=5 # schemathesis, docs, checkout, client, typescript
passed=0
failed=0
pass() { passed=$((passed + 1)); log "PASS $1"; }
fail() { failed=$((failed + 1)); log "FAIL $1${2:+: $2}"; }

# A failure before the checks can finish (build, install, start-up, interrupt) counts every
# check not passed as failed, so the summary line is always printed and M > 0 exactly when the
# script fails.
die() {
  log "error: $*"
  failed=$((CHECK_COUNT - passed))
  exit 1
}

# --- cleanup on every exit path ---------------------------------------------------------------
# The server is stopped with SIGTERM and waited for: `idempay dev` then removes its PostgreSQL
# container, which a SIGKILL would leak.
server_pid=
step_pid=
on_exit() {
  local status=$?
  trap - INT TERM HUP
  if [[ -n $step_pid ]]; then
    kill -TERM "$step_pid" 2>/dev/null || true
    wait "$step_pid" 2>/dev/null || true
  fi
  if [[ -n $server_pid ]]; then
    log "stopping the server (pid $server_pid)"
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  printf 'contract: %d passed, %d failed\n' "$passed" "$failed"
  ((failed == 0)) || ((status != 0)) || status=1
  exit "$status"
}
trap on_exit EXIT
# Signals become an ordinary exit, so the EXIT trap above still runs.
trap 'die interrupted' INT TERM HUP

# run_step OUT ERR COMMAND...: runs a long step in the background, its stdout and stderr
# appended to the files OUT and ERR, and waits for it. bash handles a signal only once its
# foreground command ends, whereas `wait` returns at once and lets on_exit end the step. (Given
# to the caller, the redirections would also swallow what the traps print.)
run_step() {
  local out=$1 err=$2
  shift 2
  "$@" >>"$out" 2>>"$err" &
  step_pid=$!
  local status=0
  wait "$step_pid" || status=$?
  step_pid=
  return "$status"
}

mkdir -p "$OUT"

log "building"
SQLX_OFFLINE=true cargo build --quiet --bin idempay || die "cargo build failed"

# A port free right now; another process taking it before the server binds is unlikely enough.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port

log "starting idempay dev on $base (banner in $OUT/server.out, logs in $OUT/server.log)"
IDEMPAY_SLOW_CHARGE=50ms "${CARGO_TARGET_DIR:-target}/debug/idempay" dev --listen "127.0.0.1:$port" \
  >"$OUT/server.out" 2>"$OUT/server.log" &
server_pid=$!

# The banner shows the demo account's key on a line of its own, indented by two spaces.
key=
deadline=$((SECONDS + STARTUP_TIMEOUT))
while :; do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    tail -n 20 "$OUT/server.log" >&2
    die "the server exited during start-up"
  fi
  [[ -n $key ]] || key=$(sed -nE 's/^  (sk_[A-Za-z0-9]{40})$/\1/p' "$OUT/server.out" | head -n 1)
  if [[ -n $key && $(curl -s -o /dev/null -w '%{http_code}' "$base/readyz") == 200 ]]; then
    break
  fi
  if ((SECONDS >= deadline)); then
    tail -n 20 "$OUT/server.log" >&2
    die "no API key and ready database after ${STARTUP_TIMEOUT}s"
  fi
  sleep 0.5
done
# A refused key would turn the whole fuzzing run into 401s that pass unnoticed; an unknown
# payment must be a 404.
auth_status=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" "$base/v1/payments/pay_unknown")
[[ $auth_status == 404 ]] || die "GET /v1/payments/pay_unknown with the demo key answered $auth_status, not 404"
log "ready"

# --- 1. schemathesis ---------------------------------------------------------------------------
if [[ $("$VENV/bin/schemathesis" --version 2>/dev/null) != *" $SCHEMATHESIS_VERSION" ]]; then
  log "installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "could not create $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION" ||
    die "could not install schemathesis"
fi

# Every check runs (`enabled = true`, the config file's `--checks all`; on the command line that
# would override the per-operation exception below). positive_data_acceptance ("a schema-valid
# request is accepted") is tuned where this API makes it inapplicable:
# - it also accepts 402, the documented answer for the declining test card, and 422, an
#   Idempotency-Key the fuzzer already sent with another body (it cannot know which keys it
#   used); a valid request refused with 400 still fails it;
# - it is off for the processor's webhook: a delivery is only valid with a timestamp within 5
#   minutes and an HMAC signature made with the webhook secret, which no schema can express, so
#   every generated delivery is rightly refused. The other checks still run there;
# - a list refuses `starting_after` and `ending_before` together with 400: OpenAPI cannot say
#   that two query parameters exclude each other;
# - a webhook endpoint's URL is refused with 400 unless it is an absolute http(s) URL without
#   credentials whose host resolves (even with private addresses allowed, as `idempay dev`
#   allows them), and `*` must stand alone in `enabled_events`: rules no schema expresses;
#   The same holds for an endpoint's update (`updateWebhookEndpoint`), whose body, as a roll's
#   (`rollWebhookEndpointSecret`), is optional like a capture's (below);
# - a registration replayed under a key the fuzzer used before answers the endpoint it created
#   then, as every replay does, even when that endpoint was deleted since: the check that a
#   created resource can be read or deleted right away does not apply to the endpoints;
# - a capture or a cancel takes an optional body, and the mechanism reads a body of `null` as no
#   body (crates/idempotency/src/request.rs), as generated clients send it for an optional body
#   left out; the description cannot say so without the `oneOf` with `null` that code generators
#   misread, so the check that an invalid body is refused is off for them (their invalid bodies
#   are refused in the suite: `bad_captures_and_cancels_are_refused_before_anything_is_reserved`),
#   and a capture beyond the authorization is a stored 400, which no schema expresses;
# - a refund may also be refused with 400 when the payment's state forbids it (declined, already
#   refunded, less left than asked): a stored business outcome that depends on earlier requests,
#   which no schema can express. Refund bodies are also checked by the integration suite's
#   contract test.
cat >"$OUT/schemathesis.toml" <<'EOF'
[checks]
enabled = true

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "402", "403", "404", "409", "422", "429", "5xx"]

[[operations]]
include-operation-id = "receiveProcessorEvent"
checks.positive_data_acceptance.enabled = false

[[operations]]
include-operation-id = "createRefund"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "402", "403", "404", "409", "422", "429", "5xx"]

[[operations]]
include-operation-id = "capturePayment"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "402", "403", "404", "409", "422", "429", "5xx"]
checks.negative_data_rejection.enabled = false

[[operations]]
include-operation-id = "cancelPayment"
checks.negative_data_rejection.enabled = false

[[operations]]
include-operation-id = "listPayments"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "429", "5xx"]

[[operations]]
include-operation-id = "listRefunds"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "429", "5xx"]

[[operations]]
include-operation-id = "listAccountRefunds"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "429", "5xx"]

[[operations]]
include-operation-id = "listEvents"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "429", "5xx"]

[[operations]]
include-operation-id = "listDisputes"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "429", "5xx"]

[[operations]]
include-operation-id = "listWebhookEndpoints"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "429", "5xx"]

[[operations]]
include-operation-id = "createWebhookEndpoint"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "422", "429", "5xx"]

[[operations]]
include-operation-id = "updateWebhookEndpoint"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "422", "429", "5xx"]
checks.negative_data_rejection.enabled = false

[[operations]]
include-operation-id = "rollWebhookEndpointSecret"
checks.negative_data_rejection.enabled = false

[[operations]]
include-operation-id = "getWebhookEndpoint"
checks.ensure_resource_availability.enabled = false

[[operations]]
include-operation-id = "deleteWebhookEndpoint"
checks.ensure_resource_availability.enabled = false
EOF

log "schemathesis against $base/openapi.json (output in $OUT/schemathesis.txt)"
rm -rf "$OUT/schemathesis"
: >"$OUT/schemathesis.txt"
st_status=0
# It runs in $OUT: it keeps its example database (.hypothesis/, which replays earlier failures
# first) and its replay store (.schemathesis/) in the working directory, not to be the repository.
run_step "$OUT/schemathesis.txt" "$OUT/schemathesis.txt" \
  timeout --foreground --kill-after=30 "$SCHEMATHESIS_TIMEOUT" \
  env -C "$OUT" "$VENV/bin/schemathesis" --config-file schemathesis.toml \
  run "$base/openapi.json" \
  --header "Authorization: Bearer $key" \
  --phases examples,coverage,fuzzing,stateful \
  --max-examples 50 \
  --request-timeout 10 \
  --report junit --report-dir schemathesis \
  --no-color || st_status=$?
# Its totals: the summary block at the end, or the tail when it stopped before one.
if grep -q ' SUMMARY ' "$OUT/schemathesis.txt"; then
  sed -n '/ SUMMARY /,$p' "$OUT/schemathesis.txt" >&2
else
  tail -n 15 "$OUT/schemathesis.txt" >&2
fi
# Ctrl-C reaches the whole process group: schemathesis and the server stop by themselves, and
# bash, its child having exited normally, runs no INT trap. Stop here as well.
((st_status != 130)) || die interrupted
if ((st_status == 0)); then
  pass schemathesis
elif ((st_status == 124)); then
  fail schemathesis "no result within ${SCHEMATHESIS_TIMEOUT}s (see $OUT/schemathesis.txt)"
else
  fail schemathesis "exit status $st_status (failures in $OUT/schemathesis.txt)"
fi

# --- 2. the docs in a real browser, offline ----------------------------------------------------
# chromium-driver lets Selenium drive the same chromium in check 3; Debian's matches its version.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  log "installing chromium and chromium-driver"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver; } >"$OUT/apt.log" 2>&1 ||
    { tail -n 20 "$OUT/apt.log" >&2; die "could not install chromium"; }
fi

# Every host name resolves to nothing, so an asset fetched from a CDN would fail to load (the
# server is reached by IP literal and needs no resolving). A profile of its own leaves the user's
# chromium untouched; the virtual time budget lets the page's scripts fetch the spec and render.
# browser OUT ARGS...: chromium's stdout goes to the file OUT.
browser() {
  local out=$1
  shift
  run_step "$out" "$OUT/chromium.log" \
    timeout --foreground --kill-after=10 "$BROWSER_TIMEOUT" chromium \
    --headless --no-sandbox --disable-gpu --disable-background-networking \
    --no-first-run --user-data-dir="$OUT/chromium-profile" \
    --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
    --virtual-time-budget=15000 --window-size=1280,2000 \
    "$@"
}
: >"$OUT/chromium.log"

kill -0 "$server_pid" 2>/dev/null || die "the server stopped (see $OUT/server.log)"
log "rendering $base/docs/ (DOM in $OUT/docs.html, screenshot in $OUT/docs.png)"
rm -f "$OUT/docs.html" "$OUT/docs.png"
problems=()
browser "$OUT/docs.html" --dump-dom "$base/docs/" || problems+=("chromium --dump-dom failed (see $OUT/chromium.log)")
# What Swagger UI renders for each operation, whatever its tag: the path in a data-path
# attribute and an element id ending in the operationId.
for needle in 'data-path="/v1/payments"' 'data-path="/v1/payments/{id}"' '-createPayment"' '-getPayment"'; do
  grep -qF -- "$needle" "$OUT/docs.html" || problems+=("the rendered page lacks $needle")
done
browser /dev/null --screenshot="$OUT/docs.png" "$base/docs/" || true
[[ -s $OUT/docs.png ]] || problems+=("no screenshot")
if ((${#problems[@]} == 0)); then
  pass "docs (both payment operations render with no host but 127.0.0.1 reachable)"
else
  fail docs "$(IFS=';'; echo "${problems[*]}")"
fi

# --- 3. the checkout page in a real browser: a double click charges once ----------------------
if [[ $("$VENV/bin/python" -c 'import selenium; print(selenium.__version__)' 2>/dev/null) != "$SELENIUM_VERSION" ]]; then
  log "installing selenium $SELENIUM_VERSION into $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "selenium==$SELENIUM_VERSION" ||
    die "could not install selenium"
fi

kill -0 "$server_pid" 2>/dev/null || die "the server stopped (see $OUT/server.log)"
log "double-clicking Pay on $base/demo/checkout (output in $OUT/checkout.txt, screenshots in $OUT/checkout.png and $OUT/checkout-naive.png)"
rm -f "$OUT"/checkout*.png
: >"$OUT/checkout.txt"
checkout_status=0
run_step "$OUT/checkout.txt" "$OUT/checkout.txt" \
  timeout --foreground --kill-after=10 "$BROWSER_TIMEOUT" \
  "$VENV/bin/python" scripts/checkout-browser.py "$base" "$key" "$OUT" || checkout_status=$?
cat "$OUT/checkout.txt" >&2
((checkout_status != 130)) || die interrupted
if ((checkout_status == 0)); then
  pass "checkout (a double click pays once with one key; the naive page, a key per click, twice)"
elif ((checkout_status == 124)); then
  fail checkout "no result within ${BROWSER_TIMEOUT}s (see $OUT/checkout.txt)"
else
  fail checkout "exit status $checkout_status (see $OUT/checkout.txt)"
fi

# --- 4. a generated Python client, on a tour of the API ---------------------------------------
if [[ $("$CLIENT_VENV/bin/openapi-python-client" --version 2>/dev/null) != *" $OPENAPI_PYTHON_CLIENT_VERSION" ]]; then
  log "installing openapi-python-client $OPENAPI_PYTHON_CLIENT_VERSION into $CLIENT_VENV"
  rm -rf "$CLIENT_VENV"
  python3 -m venv "$CLIENT_VENV" || die "could not create $CLIENT_VENV"
  "$CLIENT_VENV/bin/pip" install --quiet --disable-pip-version-check \
    "openapi-python-client==$OPENAPI_PYTHON_CLIENT_VERSION" || die "could not install openapi-python-client"
fi

# The generator reads only what is made here from the committed file: it runs in a network
# namespace of its own, with no interface but loopback, where unshare can make one (root, as here
# and in CI).
offline=()
if unshare --net true 2>/dev/null; then
  offline=(unshare --net --)
else
  log "unshare --net is not available: generating with the network reachable"
fi
# Its post hooks are ruff's fix and format; they run below, apart, so that --fail-on-warning fails
# on the generator's own warnings (a schema it skipped or read otherwise than written) only.
printf 'post_hooks: []\n' >"$OUT/client-config.yaml"
# openapi-python-client 0.29.1 (the newest) writes a client that does not import for a body of two
# media types (`body: NewPayment | NewPayment | Unset = UNSET`, `Unset` never imported): it
# generates from the committed description with each body's JSON alone, every other member as
# committed. The tour sends its form with the client's own connection.
python3 - openapi/openapi.json "$OUT/openapi-json-bodies.json" <<'PY' || die "could not write the JSON-bodies view"
import json, sys

description = json.load(open(sys.argv[1], encoding="utf-8"))
for item in description["paths"].values():
    for operation in item.values():
        if isinstance(operation, dict):
            content = operation.get("requestBody", {}).get("content", {})
            content.pop("application/x-www-form-urlencoded", None)
json.dump(description, open(sys.argv[2], "w", encoding="utf-8"), indent=2)
PY
log "generating a Python client from openapi/openapi.json (its JSON bodies) into $OUT/client (output in $OUT/client.txt)"
rm -rf "$OUT/client"
: >"$OUT/client.txt"
problems=()
gen_status=0
run_step "$OUT/client.txt" "$OUT/client.txt" \
  timeout --foreground --kill-after=10 "$CLIENT_TIMEOUT" "${offline[@]}" \
  "$CLIENT_VENV/bin/openapi-python-client" generate \
  --path "$OUT/openapi-json-bodies.json" --output-path "$OUT/client" \
  --config "$OUT/client-config.yaml" --fail-on-warning || gen_status=$?
((gen_status != 130)) || die interrupted
if ((gen_status != 0)); then
  cat "$OUT/client.txt" >&2
  problems+=("openapi-python-client exit status $gen_status (see $OUT/client.txt)")
elif grep -q 'encountered while generating' "$OUT/client.txt"; then
  cat "$OUT/client.txt" >&2
  problems+=("openapi-python-client warned (see $OUT/client.txt)")
else
  # The formatter's warnings are the only ones let pass: the code is as good unformatted.
  # ruff comes with the generator, as its dependency.
  { run_step "$OUT/client.txt" "$OUT/client.txt" env -C "$OUT/client" "$CLIENT_VENV/bin/ruff" check --fix-only . &&
    run_step "$OUT/client.txt" "$OUT/client.txt" env -C "$OUT/client" "$CLIENT_VENV/bin/ruff" format .; } ||
    log "warning: ruff failed on the generated client (see $OUT/client.txt); going on unformatted"
fi

if ((${#problems[@]} == 0)); then
  kill -0 "$server_pid" 2>/dev/null || die "the server stopped (see $OUT/server.log)"
  log "touring the API through the generated client (output in $OUT/client-tour.txt)"
  : >"$OUT/client-tour.txt"
  tour_status=0
  run_step "$OUT/client-tour.txt" "$OUT/client-tour.txt" \
    timeout --foreground --kill-after=10 "$CLIENT_TIMEOUT" \
    "$CLIENT_VENV/bin/python" scripts/client-tour.py "$base" "$key" "$OUT/client" "$OUT/server.out" ||
    tour_status=$?
  cat "$OUT/client-tour.txt" >&2
  ((tour_status != 130)) || die interrupted
  if ((tour_status == 124)); then
    problems+=("the tour gave no result within ${CLIENT_TIMEOUT}s (see $OUT/client-tour.txt)")
  elif ((tour_status != 0)); then
    problems+=("the tour's exit status $tour_status (see $OUT/client-tour.txt)")
  fi
fi
if ((${#problems[@]} == 0)); then
  pass "client (openapi-python-client $OPENAPI_PYTHON_CLIENT_VERSION generates without a warning; the tour passes through it)"
else
  fail client "$(IFS=';'; echo "${problems[*]}")"
fi

# --- 5. a generated TypeScript client, type-checked and on a tour under Node --------------------
if [[ $("$TS_VENV/bin/openapi-generator-cli" version 2>/dev/null) != "$OPENAPI_GENERATOR_VERSION" ]]; then
  log "installing openapi-generator-cli $OPENAPI_GENERATOR_VERSION into $TS_VENV"
  rm -rf "$TS_VENV"
  python3 -m venv "$TS_VENV" || die "could not create $TS_VENV"
  "$TS_VENV/bin/pip" install --quiet --disable-pip-version-check \
    "openapi-generator-cli==$OPENAPI_GENERATOR_VERSION" || die "could not install openapi-generator-cli"
fi
command -v java >/dev/null || die "the TypeScript client's generator needs Java, which is not installed"
if ! command -v tsc >/dev/null; then
  log "installing Debian's node-typescript (tsc)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends node-typescript; } >"$OUT/apt-ts.log" 2>&1 ||
    { tail -n 20 "$OUT/apt-ts.log" >&2; die "could not install node-typescript"; }
fi

readonly TS=$OUT/ts-tour
rm -rf "$TS"
mkdir -p "$TS"
: >"$OUT/ts.txt"
problems=()
millis() { date +%s%3N; }
# Generated anew each run from the committed file alone, offline where unshare can make it so. The
# generator validates the description first (a dangling $ref or a required field it lacks fails
# here); `tsc --strict` then checks the client and the tour together, so a description whose types
# no longer carry what the tour reads fails before anything runs.
started=$(millis)
log "generating a TypeScript client from openapi/openapi.json into $TS/client (output in $OUT/ts.txt)"
gen_status=0
run_step "$OUT/ts.txt" "$OUT/ts.txt" \
  timeout --foreground --kill-after=10 "$CLIENT_TIMEOUT" "${offline[@]}" \
  "$TS_VENV/bin/openapi-generator-cli" generate --input-spec openapi/openapi.json \
  --generator-name typescript-fetch --output "$TS/client" || gen_status=$?
((gen_status != 130)) || die interrupted
generated=$(millis)
tsc_status=0
if ((gen_status != 0)); then
  tail -n 20 "$OUT/ts.txt" >&2
  problems+=("openapi-generator-cli exit status $gen_status (see $OUT/ts.txt)")
elif grep -q '\] ERROR ' "$OUT/ts.txt"; then
  # Some errors (a $ref that resolves to nothing) are logged, and the exit status is still 0.
  grep -m 5 '\] ERROR ' "$OUT/ts.txt" >&2
  problems+=("openapi-generator-cli logged errors (see $OUT/ts.txt)")
else
  cp scripts/client-tour.ts "$TS/client-tour.ts"
  run_step "$OUT/ts.txt" "$OUT/ts.txt" \
    timeout --foreground --kill-after=10 "$CLIENT_TIMEOUT" \
    tsc --strict --target es2020 --module commonjs --lib es2020,dom --noEmitOnError \
    --rootDir "$TS" --outDir "$TS/out" "$TS/client-tour.ts" || tsc_status=$?
  ((tsc_status != 130)) || die interrupted
  if ((tsc_status != 0)); then
    grep -m 20 'error TS' "$OUT/ts.txt" >&2 || true
    problems+=("tsc --strict: exit status $tsc_status (see $OUT/ts.txt)")
  fi
fi
checked=$(millis)
if ((${#problems[@]} == 0)); then
  kill -0 "$server_pid" 2>/dev/null || die "the server stopped (see $OUT/server.log)"
  log "touring the API through the TypeScript client under Node (output in $OUT/ts-tour.txt)"
  : >"$OUT/ts-tour.txt"
  tour_status=0
  run_step "$OUT/ts-tour.txt" "$OUT/ts-tour.txt" \
    timeout --foreground --kill-after=10 "$CLIENT_TIMEOUT" \
    node "$TS/out/client-tour.js" "$base" "$key" "$OUT/server.out" || tour_status=$?
  cat "$OUT/ts-tour.txt" >&2
  ((tour_status != 130)) || die interrupted
  if ((tour_status != 0)); then
    problems+=("the TypeScript tour's exit status $tour_status (see $OUT/ts-tour.txt)")
  fi
fi
toured=$(millis)
if ((${#problems[@]} == 0)); then
  pass "typescript (openapi-generator $OPENAPI_GENERATOR_VERSION, tsc --strict $(tsc --version | cut -d' ' -f2), the tour under Node: generated in $((generated - started)) ms, checked in $((checked - generated)) ms, toured in $((toured - checked)) ms)"
else
  fail typescript "$(IFS=';'; echo "${problems[*]}")"
fi
