// A tour of the API through a TypeScript client generated from the committed openapi/openapi.json
// (OpenAPI Generator's typescript-fetch), type-checked with `tsc --strict` together with this file
// and run under Node. Run by scripts/contract.sh against a live `idempay dev`:
//
//     node client-tour.js BASE_URL API_KEY SERVER_OUT
//
// It walks the API with the generated classes only (raw `fetch` for the processor's test routes,
// which the description does not hold, as the Python tour does): a manual payment, a partial
// capture and its replay, a cancel of another and the 409 for a capture after it, a refund of the
// captured money, a 422 with its `mismatched_fields`, a payment sent as a form and replayed by its
// JSON twin, the list, and a dispute opened at the
// processor and won there, read back on idempay. Each step prints one line; the first failure
// exits 1 with what was expected and what came.

import {
  CapturePaymentRequest,
  Configuration,
  DisputesApi,
  NewPayment,
  NewPaymentCaptureMethodEnum,
  NewPaymentCurrencyEnum,
  Payment,
  PaymentsApi,
  Problem,
  ProblemFromJSON,
  RefundsApi,
  ResponseError,
} from "./client";

// Node's own, declared here: its type package comes from npm, which this machine cannot reach.
declare const process: { argv: string[]; exit(status: number): never };
declare function require(module: "fs"): { readFileSync(path: string, encoding: "utf8"): string };

const [base, apiKey, serverOut] = process.argv.slice(2);
const config = new Configuration({ basePath: base, accessToken: apiKey });
const payments = new PaymentsApi(config);
const refunds = new RefundsApi(config);
const disputes = new DisputesApi(config);

class StepFailed extends Error {}

function check(condition: boolean, message: string): asserts condition {
  if (!condition) throw new StepFailed(message);
}

function newKey(): string {
  return crypto.randomUUID();
}

/// The problem a call answered with, read through the generated model.
async function problemOf(call: Promise<unknown>): Promise<Problem> {
  try {
    await call;
  } catch (error) {
    if (error instanceof ResponseError) {
      return ProblemFromJSON(await error.response.json());
    }
    throw error;
  }
  throw new StepFailed("answered 2xx, where a problem was expected");
}

function manual(amount: number): NewPayment {
  return {
    amount,
    currency: NewPaymentCurrencyEnum.Eur,
    captureMethod: NewPaymentCaptureMethodEnum.Manual,
  };
}

/// What the tour keeps between steps.
const seen: { authorized?: Payment; captureKey?: string; capture?: CapturePaymentRequest } = {};

async function authorize(): Promise<string> {
  const payment = await payments.createPayment({ idempotencyKey: newKey(), newPayment: manual(5000) });
  check(payment.status === "requires_capture", `status ${payment.status}`);
  check(payment.amountCapturable === 5000 && payment.amountCaptured === 0, JSON.stringify(payment));
  seen.authorized = payment;
  return `${payment.id} requires_capture, 5000 capturable`;
}

async function partialCapture(): Promise<string> {
  const id = seen.authorized!.id;
  seen.capture = { id, idempotencyKey: newKey(), capturePayment: { amountToCapture: 3000 } };
  const payment = await payments.capturePayment(seen.capture);
  check(payment.status === "succeeded", `status ${payment.status}`);
  check(payment.amountCaptured === 3000 && payment.amountCapturable === 0, JSON.stringify(payment));
  return `${id} succeeded, 3000 captured`;
}

async function captureReplayed(): Promise<string> {
  const first = await payments.getPayment({ id: seen.authorized!.id });
  const replay = await payments.capturePaymentRaw(seen.capture!);
  check(replay.raw.headers.get("idempotent-replayed") === "true", "no Idempotent-Replayed: true");
  const payment = await replay.value();
  check(payment.amountCaptured === first.amountCaptured, JSON.stringify(payment));
  return "the same key answered from its stored response, Idempotent-Replayed: true";
}

async function cancelThenCapture(): Promise<string> {
  const other = await payments.createPayment({ idempotencyKey: newKey(), newPayment: manual(2500) });
  const canceled = await payments.cancelPayment({
    id: other.id,
    idempotencyKey: newKey(),
    cancelPayment: { cancellationReason: "requested_by_customer" },
  });
  check(canceled.status === "canceled", `status ${canceled.status}`);
  check(canceled.cancellationReason === "requested_by_customer", JSON.stringify(canceled));
  const problem = await problemOf(payments.capturePayment({ id: other.id, idempotencyKey: newKey() }));
  check(problem.status === 409 && problem.code === "payment-unexpected-state", JSON.stringify(problem));
  check(problem.detail.includes("`canceled`"), problem.detail);
  return `${other.id} canceled; a capture after it is 409 payment-unexpected-state`;
}

async function refundCaptured(): Promise<string> {
  const id = seen.authorized!.id;
  const refund = await refunds.createRefund({ id, idempotencyKey: newKey(), newRefund: {} });
  check(refund.amount === 3000, `refunded ${refund.amount}, where 3000 was captured`);
  const payment = await payments.getPayment({ id });
  check(payment.status === "refunded" && payment.amountRefunded === 3000, JSON.stringify(payment));
  return `${refund.id}: all 3000 captured refunded, the payment refunded`;
}

async function mismatch(): Promise<string> {
  const key = newKey();
  await payments.createPayment({ idempotencyKey: key, newPayment: { amount: 1200, currency: "eur" } });
  const problem = await problemOf(
    payments.createPayment({ idempotencyKey: key, newPayment: { amount: 1300, currency: "eur" } }),
  );
  check(problem.status === 422 && problem.code === "idempotency-key-mismatch", JSON.stringify(problem));
  check(JSON.stringify(problem.mismatchedFields) === '["/amount"]', JSON.stringify(problem));
  return "the same key with another amount: 422, mismatched_fields [/amount]";
}

async function list(): Promise<string> {
  const page = await payments.listPayments({ limit: 10 });
  check(page.data.some((p) => p.id === seen.authorized!.id), "the manual payment is not listed");
  return `${page.data.length} payments on the first page, the manual one among them`;
}

/// The processor's route and key, as the banner of `idempay dev` prints them.
function processor(): { url: string; key: string } {
  const banner = require("fs").readFileSync(serverOut, "utf8");
  const url = /curl -s (\S+)\/v1\/charges\/ch_…\/disputes/.exec(banner)?.[1];
  const key = /Authorization: Bearer (\S+?)'[^\n]*\n[^\n]*\{"amount": 500\}/.exec(banner)?.[1]
    ?? /The card processor runs at \S+; idempay authenticates to it with\n\n {2}(\S+)/.exec(banner)?.[1];
  check(url !== undefined && key !== undefined, "the banner names no processor route and key");
  return { url, key };
}

async function atProcessor(path: string, body: object): Promise<{ id: string; status: string }> {
  const { url, key } = processor();
  const response = await fetch(`${url}${path}`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  check(response.ok, `the processor answered ${response.status} to ${path}`);
  return (await response.json()) as { id: string; status: string };
}

async function until<T>(what: string, read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    check(Date.now() < deadline, `${what}: not within 30 s (${JSON.stringify(value)})`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/// A manual payment sent as a form, as Stripe's SDKs send it (raw `fetch`: the generated client
/// sends JSON), then its JSON twin under the same key through the generated client: a replay.
async function formThenJson(): Promise<string> {
  const key = newKey();
  const response = await fetch(`${base}/v1/payments`, {
    method: "POST",
    headers: { Authorization: `Bearer ${apiKey}`, "Idempotency-Key": key },
    body: new URLSearchParams({ amount: "2500", currency: "eur", capture_method: "manual", "metadata[cart]": "7" }),
  });
  const text = await response.text();
  check(response.status === 201, `the form answered ${response.status}: ${text}`);
  const made = JSON.parse(text) as { id: string };
  const twin = await payments.createPaymentRaw({
    idempotencyKey: key,
    newPayment: { ...manual(2500), metadata: { cart: "7" } },
  });
  const replayed = twin.raw.headers.get("Idempotent-Replayed");
  const payment = await twin.value();
  check(replayed === "true", `the JSON twin: Idempotent-Replayed ${replayed}`);
  check(payment.id === made.id, `the JSON twin answered ${payment.id}, not ${made.id}`);
  return `${payment.id} by form, its JSON twin a replay`;
}

async function disputeWon(): Promise<string> {
  const paid = await payments.createPayment({
    idempotencyKey: newKey(),
    newPayment: { amount: 4000, currency: "eur" },
  });
  const opened = await atProcessor(`/v1/charges/${paid.charge}/disputes`, { amount: 1500 });
  await until("idempay records the dispute", () => payments.getPayment({ id: paid.id }), (p) => p.amountDisputed === 1500);
  await atProcessor(`/v1/disputes/${opened.id}/close`, { outcome: "won" });
  const dispute = await until(
    "idempay applies charge.dispute.closed",
    () => disputes.getDispute({ id: opened.id }),
    (d) => d.status === "won",
  );
  const payment = await payments.getPayment({ id: paid.id });
  check(payment.amountDisputed === 0, `amount_disputed ${payment.amountDisputed} after a won dispute`);
  return `${dispute.id} won at the processor: idempay's dispute won, the payment's amount_disputed back to 0`;
}

const steps: Array<[string, () => Promise<string>]> = [
  ["a manual payment", authorize],
  ["a partial capture", partialCapture],
  ["its replay", captureReplayed],
  ["a cancel of another, then a capture of it", cancelThenCapture],
  ["a refund of the captured money", refundCaptured],
  ["a key reused with another body", mismatch],
  ["a form, then its JSON twin", formThenJson],
  ["the list", list],
  ["a dispute won", disputeWon],
];

async function main(): Promise<number> {
  const started = Date.now();
  for (const [name, step] of steps) {
    try {
      console.log(`tour: ${name}: ${await step()}`);
    } catch (error) {
      const why = error instanceof ResponseError ? `HTTP ${error.response.status} ${await error.response.text()}` : String(error);
      console.log(`tour: FAILED at ${name}: ${why}`);
      return 1;
    }
  }
  console.log(`tour: ${steps.length} steps passed in ${Date.now() - started} ms`);
  return 0;
}

main().then((status) => process.exit(status));
