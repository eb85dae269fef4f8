//! The problem catalogue: every kind of problem the API answers with, declared once with its
//! slug, status, title and explanation, from which the enum and its accessors are derived.

// The explanations name figures by placeholder (`{key_ttl}`, `{body_limit}`, `{body_read_timeout}`,
// `{webhook_tolerance}`): the page that shows one fills in the running service's own values.
service::problem_catalogue! {
    /// The kinds of problem the API answers with. Each has a stable `type` URI,
    /// `/problems/{slug}`, relative to the API's own address, and one HTTP status.
    pub enum ProblemKind {
        InvalidRequest {
            slug: "invalid-request",
            status: BAD_REQUEST,
            title: "The request is invalid",
            explanation: "The body is not valid JSON, or a field is missing, of the wrong type or out of \
                range, or an unknown field was sent. `detail` names it. Nothing was stored and the \
                Idempotency-Key was not used: fix the request and send it again with the same key.",
        }
        InvalidIdempotencyKey {
            slug: "invalid-idempotency-key",
            status: BAD_REQUEST,
            title: "The Idempotency-Key header is missing or invalid",
            explanation: "Mutating requests need one `Idempotency-Key` header of 1 to {max_key_len} \
                visible ASCII characters, bare or as an RFC 8941 quoted string. Generate one UUID v4 \
                per business intent and reuse it on every retry of that intent.",
        }
        Unauthorized {
            slug: "unauthorized",
            status: UNAUTHORIZED,
            title: "Authentication required",
            explanation: "Send the account's secret API key as `Authorization: Bearer sk_…`, or as \
                the user name of HTTP Basic authentication with an empty password (`curl -u sk_…:`). \
                `detail` says whether the key was missing, malformed, or is no account's (rotated, \
                revoked, or never issued).",
        }
        CardDeclined {
            slug: "card-declined",
            status: PAYMENT_REQUIRED,
            title: "The card was declined",
            explanation: "The processor declined the charge. The payment was recorded as `declined`; \
                `payment` names it and `decline_code` says why. This is a result: a retry with the \
                same key replays it. Use a new key for a new attempt.",
        }
        NotFound {
            slug: "not-found",
            status: NOT_FOUND,
            title: "Not found",
            explanation: "No such resource for this account. Another account's payments are not \
                visible.",
        }
        MethodNotAllowed {
            slug: "method-not-allowed",
            status: METHOD_NOT_ALLOWED,
            title: "Method not allowed",
            explanation: "The route exists but not with this method; the `Allow` header lists those \
                it takes.",
        }
        RequestTimeout {
            slug: "request-timeout",
            status: REQUEST_TIMEOUT,
            title: "The request body stopped arriving",
            explanation: "The request body stopped arriving: no data came for {body_read_timeout} \
                while the rest of the body announced by `Content-Length` was awaited, so the request \
                was given up. Nothing was recorded and the Idempotency-Key was not used: send the \
                whole request again, with the same key.",
        }
        IdempotencyKeyInUse {
            slug: "idempotency-key-in-use",
            status: CONFLICT,
            title: "A request with this Idempotency-Key is still in progress",
            explanation: "Another request with the same key is still being processed. Retry after \
                `Retry-After` seconds with the same key and body to receive its result. If the \
                process handling it died, a retry takes over once its lease runs out.",
        }
        IdempotencyKeyHeld {
            slug: "idempotency-key-held",
            status: CONFLICT,
            title: "This Idempotency-Key's request is held for an operator",
            explanation: "The request's call to the card processor never got a known outcome, and \
                the time within which idempay resumes such a call with the same key of its own \
                (`IDEMPAY_RECOVERY_WINDOW`, shorter than the processor remembers keys) passed. The \
                charge or refund may or may not have been made, so nothing resumes it by itself: an \
                operator settles it from the processor's ledger (`idempay keys settle`, \
                ops/runbooks.md), and this key then answers with the result, replayed: the payment or \
                refund the processor made, or `processor-made-nothing` if it made none. Do not retry \
                the intent under a new key, which could charge twice; there is no `Retry-After`, and \
                retrying this key later (minutes to hours) gets the result once it is settled.",
        }
        ProcessorMadeNothing {
            slug: "processor-made-nothing",
            status: CONFLICT,
            title: "The processor made nothing under this request",
            explanation: "The request's call to the card processor never got a known outcome, and it \
                was held for an operator (`idempotency-key-held`). The operator settled it from the \
                processor's ledger (`idempay keys settle`), which holds no charge or refund made under \
                this request: nothing was charged or refunded. This answer is final: it is stored \
                with the key and replayed. To try the intent again, send it with a new \
                Idempotency-Key.",
        }
        PayloadTooLarge {
            slug: "payload-too-large",
            status: PAYLOAD_TOO_LARGE,
            title: "The request body is too large",
            explanation: "Request bodies are limited to {body_limit}.",
        }
        UnsupportedMediaType {
            slug: "unsupported-media-type",
            status: UNSUPPORTED_MEDIA_TYPE,
            title: "The request body must be JSON or a form",
            explanation: "Send the body as JSON with `Content-Type: application/json`, or as a form \
                          with `Content-Type: application/x-www-form-urlencoded` (nested fields in \
                          brackets: `metadata[order_id]=6735`).",
        }
        IdempotencyKeyMismatch {
            slug: "idempotency-key-mismatch",
            status: UNPROCESSABLE_ENTITY,
            title: "The Idempotency-Key was already used with a different request",
            explanation: "The key was already used with a different request body. Keys bind to the \
                first request's payload for {key_ttl}; a different intent needs a new key.",
        }
        PaymentNotRefundable {
            slug: "payment-not-refundable",
            status: BAD_REQUEST,
            title: "The payment cannot be refunded",
            explanation: "Only a `succeeded` payment can be refunded: not a declined or failed one, \
                nor one already refunded in full. This refusal is stored with the key and replayed.",
        }
        RefundExceedsPayment {
            slug: "refund-exceeds-payment",
            status: BAD_REQUEST,
            title: "The refund exceeds what remains refundable",
            explanation: "The amount asked is more than remains refundable (the amount paid less what \
                was already refunded and what the cardholder disputes); `detail` says how much remains. This refusal is stored with the \
                key and replayed: use a new key for a smaller refund.",
        }
        PaymentUnexpectedState {
            slug: "payment-unexpected-state",
            status: CONFLICT,
            title: "The payment is not in a state that allows this",
            explanation: "A capture or a cancel applies to a payment that `requires_capture` only: \
                `detail` names the payment's state (`succeeded` after a capture, `canceled` after a \
                cancel or an authorization that expired). This refusal is stored with the key and \
                replayed; a new key is refused the same way while the state holds.",
        }
        CaptureExceedsAuthorization {
            slug: "capture-exceeds-authorization",
            status: BAD_REQUEST,
            title: "The capture exceeds the authorized amount",
            explanation: "`amount_to_capture` is more than the payment's `amount_capturable`; nothing \
                was captured. This refusal is stored with the key and replayed: use a new key for a \
                smaller capture.",
        }
        WebhookSignatureInvalid {
            slug: "webhook-signature-invalid",
            status: UNAUTHORIZED,
            title: "The webhook signature does not match",
            explanation: "No signature in `webhook-signature` is the HMAC-SHA256, with one of the \
                shared `whsec_` secrets, of `{webhook-id}.{webhook-timestamp}.{body}`. The delivery was not \
                processed.",
        }
        WebhookTimestampOutOfRange {
            slug: "webhook-timestamp-out-of-range",
            status: BAD_REQUEST,
            title: "The webhook timestamp is too far from now",
            explanation: "`webhook-timestamp` is more than {webhook_tolerance} away from the service's \
                clock, so the delivery could be a replay of a captured request. Send a fresh \
                delivery, signed now.",
        }
        WebhookObjectNotRecorded {
            slug: "webhook-object-not-recorded",
            status: CONFLICT,
            title: "The event names an object not recorded yet",
            explanation: "The processor's event names a charge or refund of its own that idempay has \
                not recorded yet (its answer to idempay's call may be late: the payment or refund was \
                answered 503 `processor-outcome-unknown`), and idempay already keeps as many such \
                events as it may ({max_parked} per account), to apply when their objects are \
                recorded. Nothing was applied and the event id was not recorded as processed: deliver \
                the same event again, with its `webhook-id`, after `Retry-After` seconds; it is kept \
                or applied then, once.",
        }
        WebhookEventTypeUnknown {
            slug: "webhook-event-type-unknown",
            status: SERVICE_UNAVAILABLE,
            title: "The event's type is unknown to this release",
            explanation: "The processor's event has a type this release of idempay does not know: \
                a newer release may (during a deploy the processor can send a type only the new \
                release applies). Nothing was applied and the event id was not recorded as \
                processed, so it is not lost: deliver the same event again, with its `webhook-id`, \
                after `Retry-After` seconds, until a release that knows the type applies it.",
        }
        WebhookEndpointLimit {
            slug: "webhook-endpoint-limit",
            status: CONFLICT,
            title: "The account has the most webhook endpoints it may have",
            explanation: "An account may have at most {max_webhook_endpoints} webhook endpoints, \
                enabled or disabled: every event is copied to each endpoint that subscribes to it, in \
                the transaction that writes it, and sent to each on the whole retry schedule. \
                Nothing was registered and the Idempotency-Key was released: delete an endpoint you \
                no longer need (`DELETE /v1/webhook_endpoints/we_…`), then retry with the same key. \
                One endpoint can receive every type (`enabled_events: [\"*\"]`).",
        }
        WebhookEndpointDisabled {
            slug: "webhook-endpoint-disabled",
            status: CONFLICT,
            title: "The webhook endpoint is disabled",
            explanation: "The endpoint was disabled, by its merchant or because it acknowledged no \
                delivery for the whole retry schedule: it is sent nothing more, and no delivery can \
                be queued for it. Nothing was queued and the Idempotency-Key was released. Enable it \
                again once it answers (its `status` set to `enabled` by \
                `POST /v1/webhook_endpoints/we_…`), then ask for the delivery with a new key.",
        }
        WebhookRetryPending {
            slug: "webhook-retry-pending",
            status: CONFLICT,
            title: "A delivery of this event to this endpoint is still pending",
            explanation: "A delivery of the event to the endpoint is queued or being retried on the \
                schedule, neither acknowledged nor given up: another one would only send the event \
                twice. Nothing was queued and the Idempotency-Key was released. Follow the pending \
                delivery at `GET /v1/events/evt_…/attempts`, and ask again once it is acknowledged or \
                given up.",
        }
        WebhookRetryLimit {
            slug: "webhook-retry-limit",
            status: CONFLICT,
            title: "This event was delivered again to this endpoint as often as it may be",
            explanation: "An event may be delivered again to one endpoint at most 5 times on request \
                (`POST /v1/events/evt_…/retry`), besides its own delivery and that delivery's retries: \
                every retry sends to a URL the account chose. Nothing was queued and the \
                Idempotency-Key was released. Read the event at `GET /v1/events/evt_…`, or list the \
                account's events at `GET /v1/events`, to apply it without a delivery.",
        }
        Internal {
            slug: "internal",
            status: INTERNAL_SERVER_ERROR,
            title: "Internal server error",
            explanation: "The request failed on our side. Nothing was recorded and the key was \
                released: retry with the same key.",
        }
        ProcessorOutcomeUnknown {
            slug: "processor-outcome-unknown",
            status: SERVICE_UNAVAILABLE,
            title: "The processor's answer is not known yet",
            explanation: "The call to the card processor timed out, its answer was lost, or it failed \
                after receiving the call: the card may or may not have been charged. Nothing is lost \
                and nothing will happen twice: the key is kept, and retrying with the same key and \
                body after `Retry-After` seconds asks the processor again with the same key of \
                idempay's own, which it answers with the charge it made, if any. A client that never \
                retries still gets its payment recorded by the recovery job.",
        }
        ProcessorUnavailable {
            slug: "processor-unavailable",
            status: SERVICE_UNAVAILABLE,
            title: "The processor refused the call; nothing was charged",
            explanation: "The card processor could not be reached, or refused the call before acting \
                on it, so nothing was charged or refunded and the key was released. Retry with the \
                same key after `Retry-After` seconds.",
        }
        RateLimited {
            slug: "rate-limited",
            status: TOO_MANY_REQUESTS,
            title: "Too many requests",
            explanation: "The account sent more requests than its rate limit allows ({rate_limit}). \
                Nothing was done, and an Idempotency-Key sent with the request was not used: retry \
                after `Retry-After` seconds with the same key, and the request runs as if for the \
                first time.",
        }
        ServiceUnavailable {
            slug: "service-unavailable",
            status: SERVICE_UNAVAILABLE,
            title: "Service temporarily unavailable",
            explanation: "The database is unreachable or busy, or the request did not finish in time, \
                or, during a deploy, the key was last written by another release of idempay in a \
                format this instance does not read (it was left as it is). Retry with the same key \
                after `Retry-After` seconds: if the first attempt went through meanwhile, the retry \
                receives its result; if not, it runs afresh.",
        }
    }
}
