// The checkout page: one Idempotency-Key per intent (this order), made when the order is, and
// sent again on every click and every retry. The API key is not here: the page's session cookie
// (HttpOnly, set with the page) lets its calls under /demo/api through as the demo account.
"use strict";

const AMOUNT = 4200;
const CURRENCY = "eur";
const DESCRIPTION = "Espresso machine, delivered";
// A 409 is retried after its Retry-After, a lost answer after a second; each click gives up after
// this many attempts, as any client must stop somewhere.
const MAX_ATTEMPTS = 10;
const LOST_ANSWER_RETRY_MS = 1000;
const LATEST_PAYMENTS = 8;

const $ = (id) => document.getElementById(id);

// { key, order, keys: [keys sent], clicks, answers: {key: [answer]}, routes: {key: route},
//   authorized: payment id once held, captureKey: the capture's own key, made when authorized }
let intent;
// Refreshes overlap when answers arrive together: only the latest one's result is shown.
let timelineRefreshes = 0;
let paymentRefreshes = 0;

// A UUID v4 from the browser's CSPRNG (crypto.randomUUID exists only in secure contexts, and the
// page may be opened over plain HTTP from another machine).
function uuid() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function newIntent() {
  intent = {
    key: uuid(),
    order: `ord_${uuid().slice(0, 8)}`,
    keys: [],
    clicks: 0,
    answers: {},
    routes: {},
    authorized: null,
    captureKey: null,
  };
  $("ship").hidden = true;
  $("capture-key-line").hidden = true;
  showKey();
  $("order-ref").textContent = intent.order;
  $("answers").replaceChildren();
  $("answers-empty").hidden = false;
  timelineRefreshes += 1;
  $("timeline").replaceChildren();
  $("timeline-empty").hidden = false;
  $("notice").textContent = "";
  refreshPayments();
}

function showKey() {
  $("key").textContent = $("naive").checked ? "a new one on every click" : intent.key;
}

function pay() {
  // The naive page makes a key per click: each click is a new intent to the server.
  const key = $("naive").checked ? uuid() : intent.key;
  if (!intent.keys.includes(key)) intent.keys.push(key);
  intent.routes[key] = "POST /v1/payments";
  intent.clicks += 1;
  const body = JSON.stringify({
    amount: AMOUNT,
    currency: CURRENCY,
    order: intent.order,
    description: DESCRIPTION,
    payment_method: $("card").value,
    capture_method: $("manual").checked ? "manual" : "automatic",
  });
  send({ key, body, click: intent.clicks, attempt: 1, order: intent.order, path: "/demo/api/payments" });
}

// Shipping captures what "Pay" authorized: an intent of its own, with the key made when the
// authorization came back, sent again on every click and retry, as the payment's is.
function ship() {
  if (!intent.authorized) return;
  const key = intent.captureKey;
  if (!intent.keys.includes(key)) intent.keys.push(key);
  intent.routes[key] = "POST /v1/payments/{id}/capture";
  intent.clicks += 1;
  send({
    key,
    body: "{}",
    click: intent.clicks,
    attempt: 1,
    order: intent.order,
    path: `/demo/api/payments/${intent.authorized}/capture`,
  });
}

async function send(request) {
  let response;
  try {
    response = await fetch(request.path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": request.key },
      body: request.body,
      credentials: "same-origin",
    });
  } catch (error) {
    // No answer: the payment may or may not have happened. Only the same key makes a retry safe.
    show(request, { status: null, replayed: false, text: `no answer (${error.message})` });
    retry(request, LOST_ANSWER_RETRY_MS);
    return;
  }
  const answer = await read(response);
  show(request, answer);
  if (answer.held && request.order === intent.order && !intent.authorized) {
    intent.authorized = answer.payment;
    intent.captureKey = uuid();
    $("capture-key").textContent = intent.captureKey;
    $("capture-key-line").hidden = false;
    $("ship").hidden = false;
  }
  if (response.status === 409 && answer.inFlight) {
    retry(request, 1000 * (Number(response.headers.get("Retry-After")) || 1));
  }
  if (response.status === 401) {
    $("notice").textContent = "The demo session ran out: reload the page to start another.";
  }
  if (request.order === intent.order) {
    refreshTimeline();
  }
  refreshPayments();
}

function retry(request, delayMs) {
  if (request.attempt >= MAX_ATTEMPTS) return;
  setTimeout(() => send({ ...request, attempt: request.attempt + 1 }), delayMs);
}

async function read(response) {
  const replayed = response.headers.get("Idempotent-Replayed") === "true";
  let body = {};
  try {
    body = await response.json();
  } catch {
    // A body that is not JSON is shown by its status alone.
  }
  const s = response.status;
  // A 409 is a request still in flight (retried), or a payment in another state (final).
  const inFlight = s === 409 && body.code !== "payment-unexpected-state";
  let text;
  if (s === 201 || s === 200) {
    const what = s === 200 ? `captured ${body.amount_captured}` : `created, ${body.status}`;
    text = replayed
      ? `the stored answer, replayed: ${body.id} (nothing charged again)`
      : `payment ${body.id} ${what}`;
  } else if (inFlight) {
    text = `another request with this key is still in flight; retrying after ${response.headers.get("Retry-After") || 1} s`;
  } else if (s === 402) {
    text = `${replayed ? "replayed: " : ""}declined (${body.decline_code || body.detail || "card declined"})`;
  } else {
    text = body.detail || body.title || response.statusText;
  }
  return { status: s, replayed, text, payment: body.id, held: body.status === "requires_capture", inFlight };
}

function show(request, answer) {
  if (request.order !== intent.order) return;
  (intent.answers[request.key] ||= []).push(answer);
  $("answers-empty").hidden = true;
  const item = document.createElement("li");
  item.dataset.status = answer.status ?? "none";
  item.dataset.replayed = answer.replayed;
  item.dataset.key = request.key;
  const who = document.createElement("span");
  who.className = "what";
  who.textContent = request.attempt === 1 ? `click ${request.click}` : `retry ${request.attempt - 1}`;
  const badge = document.createElement("span");
  badge.className = `status ${kind(answer)}`;
  badge.textContent = answer.status ?? "—";
  const text = document.createElement("span");
  text.textContent = (answer.replayed ? "Idempotent-Replayed: " : "") + answer.text;
  if (intent.keys.length > 1) text.textContent += ` · key ${request.key.slice(0, 8)}…`;
  item.append(who, badge, text);
  $("answers").append(item);
}

function kind(answer) {
  if (answer.status === null) return "bad";
  if (answer.replayed) return "replay";
  if (answer.inFlight) return "wait";
  if (answer.status < 300) return "ok";
  return "bad";
}

// The server's view of each key this order used, next to the answers the page received with it.
async function refreshTimeline() {
  const refresh = ++timelineRefreshes;
  const blocks = await Promise.all(intent.keys.map((key) => keyTimeline(key)));
  if (refresh !== timelineRefreshes) return;
  $("timeline").replaceChildren(...blocks);
  $("timeline-empty").hidden = blocks.length > 0;
}

async function keyTimeline(key) {
  const block = document.createElement("div");
  block.className = "key-block";
  block.dataset.key = key;
  const title = document.createElement("p");
  title.className = "timeline-key";
  title.textContent = `Idempotency-Key ${key}`;
  const list = document.createElement("ol");
  list.className = "timeline";
  block.append(title, list);

  const answers = intent.answers[key] || [];
  const summary = answers.map((a) => (a.status ?? "—") + (a.replayed ? " (replayed)" : "")).join(", ");
  entry(list, null, `${answers.length} answer${answers.length === 1 ? "" : "s"} to this page: ${summary}`, "client");

  const response = await fetch(`/demo/api/idempotency_keys/${encodeURIComponent(key)}`, { credentials: "same-origin" });
  if (!response.ok) {
    entry(list, null, response.status === 404 ? "not stored (yet)" : `inspection answered ${response.status}`, "server");
    block.dataset.state = "unknown";
    return block;
  }
  const inspection = await response.json();
  const use = inspection.uses.find((u) => u.route === intent.routes[key]) || inspection.uses[0];
  title.textContent = `Idempotency-Key ${key} · ${use.route}`;
  block.dataset.state = use.state;
  block.dataset.responseStatus = use.response_status ?? "";
  entry(list, use.created_at, "reserved by the first request: in progress", "server");
  if (use.recovery_point) {
    entry(list, null, `recovery point ${use.recovery_point}, processor called with downstream key ${use.downstream_key}`, "server");
  }
  if (use.takeovers > 0) {
    entry(list, null, `taken over ${use.takeovers} time${use.takeovers === 1 ? "" : "s"} after a lease ran out`, "server");
  }
  if (use.state === "in_progress") {
    entry(list, use.locked_until, "lease held until then: a repeat now is answered 409", "server");
  } else {
    const where = use.response_location ? ` (${use.response_location})` : "";
    entry(list, use.completed_at, `completed: ${use.response_status}${where} stored; every repeat gets it replayed`, "server");
    entry(list, use.expires_at, "expires: the key is forgotten and new again", "server");
  }
  return block;
}

function entry(list, at, text, source) {
  const item = document.createElement("li");
  item.className = source;
  if (at) {
    const time = document.createElement("time");
    time.dateTime = at;
    time.textContent = moment(at);
    item.append(time);
  }
  item.append(document.createTextNode(text));
  list.append(item);
}

// The server's times to the millisecond, as the local clock shows them; the day too when it is
// not today (a key expires a day later).
function moment(at) {
  const date = new Date(at);
  const clock = date.toLocaleTimeString([], {
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    fractionalSecondDigits: 3,
    hour12: false,
  });
  const today = date.toDateString() === new Date().toDateString();
  return today ? clock : `${date.toLocaleDateString()} ${clock}`;
}

async function refreshPayments() {
  const refresh = ++paymentRefreshes;
  const response = await fetch(`/demo/api/payments?limit=${LATEST_PAYMENTS}`, { credentials: "same-origin" });
  if (!response.ok) return;
  const list = await response.json();
  if (refresh !== paymentRefreshes) return;
  const rows = list.data.map((payment) => {
    const row = document.createElement("tr");
    row.dataset.order = payment.order ?? "";
    row.dataset.id = payment.id;
    if (payment.order === intent.order) row.className = "this-order";
    const created = new Date(payment.created_at).toLocaleTimeString([], { hour12: false });
    const amount = `${(payment.amount / 100).toFixed(2)} ${payment.currency.toUpperCase()}`;
    for (const [text, className] of [
      [payment.id, ""],
      [payment.order ?? "—", ""],
      [amount, "num"],
      [payment.status, ""],
      [created, ""],
    ]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      if (className) cell.className = className;
      row.append(cell);
    }
    return row;
  });
  $("payments").replaceChildren(...rows);
}

document.addEventListener("DOMContentLoaded", () => {
  $("pay").addEventListener("click", pay);
  $("ship").addEventListener("click", ship);
  $("new-order").addEventListener("click", newIntent);
  $("naive").addEventListener("change", () => {
    document.body.classList.toggle("naive", $("naive").checked);
    showKey();
  });
  newIntent();
});
