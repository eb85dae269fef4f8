"""A tour of the API through a Python client generated from the committed openapi/openapi.json.

Run by scripts/contract.sh against a live `idempay dev`, once openapi-python-client has generated
the package `idempay_client` into CLIENT_DIR:

    python client-tour.py BASE_URL API_KEY CLIENT_DIR SERVER_OUT

It imports the generated package, authenticates with API_KEY as a Bearer token through its
AuthenticatedClient, and walks the API with the `sync_detailed` functions (they give the status and
the headers as well as the parsed body): a payment with an Idempotency-Key, its replay, the key with
another amount (422), a payment sent as a form (as Stripe's SDKs send it) replayed by its JSON twin,
a declined card (402), the list, one payment, a partial refund, a full refund
with no body, the events, the key's inspection, a webhook endpoint for every event type, and a
dispute opened at the processor with the route and key that the banner of `idempay dev` (the file
SERVER_OUT) shows, read back on the payment once the processor's event arrived. Each step checks
what it got through the generated models and prints one line; the first failure exits 1 with what
was expected and what came.
"""

import json
import re
import sys
import time
import urllib.request
import uuid


class StepFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise StepFailed(message)


def answer(response):
    """What a response was, for a failure message: its status and body, shortened."""
    body = response.content.decode("utf-8", "replace")
    return f"HTTP {int(response.status_code)} {body[:400]}"


def expect(response, status, model):
    """Checks the status and that the generated client parsed the body into `model`; returns it."""
    check(
        response.status_code == status,
        f"expected HTTP {status}, got {answer(response)}",
    )
    check(
        isinstance(response.parsed, model),
        f"expected a {model.__name__}, parsed {type(response.parsed).__name__}: {answer(response)}",
    )
    return response.parsed


def banner_dispute_command(server_out):
    """The processor's URL and API key, from the banner's dispute example."""
    with open(server_out, encoding="utf-8") as f:
        banner = f.read()
    # curl -s http://127.0.0.1:PORT/v1/charges/ch_…/disputes \
    #   -H 'Authorization: Bearer sk_dev_…' \
    found = re.search(
        r"^curl -s (?P<url>\S+)/v1/charges/ch_…/disputes \\\n"
        r"\s+-H 'Authorization: Bearer (?P<key>[^']+)'",
        banner,
        re.MULTILINE,
    )
    check(found, f"no dispute command with the processor's URL and key in the banner ({server_out})")
    return found["url"], found["key"]


def main(base, api_key, client_dir, server_out):
    sys.path.insert(0, client_dir)
    from idempay_client import AuthenticatedClient
    from idempay_client.api.disputes import get_dispute, list_disputes
    from idempay_client.api.events import list_events
    from idempay_client.api.idempotency import get_idempotency_key
    from idempay_client.api.payments import create_payment, get_payment, list_payments
    from idempay_client.api.refunds import create_refund
    from idempay_client.api.webhook_endpoints import create_webhook_endpoint, delete_webhook_endpoint
    from idempay_client.models import (
        DeletedWebhookEndpoint,
        Dispute,
        ListDispute,
        EventType,
        KeyInspection,
        KeyUseState,
        ListEvent,
        ListPayment,
        Metadata,
        NewPayment,
        NewPaymentCurrency,
        NewPaymentPaymentMethod,
        NewRefund,
        NewWebhookEndpoint,
        NewWebhookEndpointEnabledEventsItem,
        Payment,
        PaymentStatus,
        Problem,
        Refund,
        WebhookEndpoint,
    )

    # Every request the client sends, to check what went on the wire (the body-less refund).
    sent = []
    client = AuthenticatedClient(
        base_url=base,
        token=api_key,
        raise_on_unexpected_status=True,
        httpx_args={"event_hooks": {"request": [sent.append]}},
    )
    key = f"tour-{uuid.uuid4()}"

    def new_payment(amount, **fields):
        return NewPayment(amount=amount, currency=NewPaymentCurrency.EUR, **fields)

    def tagged():
        return Metadata.from_dict({"order_id": "6735"})

    steps = []

    def step(name):
        def register(function):
            steps.append((name, function))
            return function

        return register

    state = {}

    @step("create a payment")
    def _():
        r = create_payment.sync_detailed(
            client=client, body=new_payment(4200, order="tour_1", metadata=tagged()), idempotency_key=key
        )
        payment = expect(r, 201, Payment)
        check(payment.amount == 4200, f"amount {payment.amount}, not 4200")
        check(payment.status == PaymentStatus.SUCCEEDED, f"status {payment.status}, not succeeded")
        metadata = payment.metadata.to_dict()
        check(metadata == {"order_id": "6735"}, f"metadata {metadata}, not the one sent")
        replayed = r.headers.get("Idempotent-Replayed")
        check(replayed != "true", "the first request was answered as a replay")
        state["payment"] = payment.id
        return f"{payment.id}, 4200 eur, {payment.status} (Idempotent-Replayed: {replayed})"

    @step("the same request again is a replay")
    def _():
        r = create_payment.sync_detailed(
            client=client, body=new_payment(4200, order="tour_1", metadata=tagged()), idempotency_key=key
        )
        payment = expect(r, 201, Payment)
        replayed = r.headers.get("Idempotent-Replayed")
        check(replayed == "true", f"Idempotent-Replayed: {replayed!r}, not 'true'")
        check(payment.id == state["payment"], f"the replay answered {payment.id}, not {state['payment']}")
        return f"{payment.id} again, Idempotent-Replayed: {replayed}"

    @step("the same key with another amount is refused")
    def _():
        r = create_payment.sync_detailed(
            client=client, body=new_payment(4300, order="tour_1", metadata=tagged()), idempotency_key=key
        )
        problem = expect(r, 422, Problem)
        check(
            problem.code == "idempotency-key-mismatch",
            f"code {problem.code!r}, not 'idempotency-key-mismatch'",
        )
        fields = problem.mismatched_fields
        check(
            isinstance(fields, list) and "/amount" in fields,
            f"mismatched_fields {fields!r} lacks /amount",
        )
        return f"422 {problem.code}, mismatched_fields {fields}"

    @step("a form-encoded payment, replayed as JSON")
    def _():
        # As Stripe's SDKs and `curl -d` send it: the client's own HTTP connection, a form body.
        form_key = f"tour-form-{uuid.uuid4()}"
        sent_form = client.get_httpx_client().post(
            "/v1/payments",
            data={"amount": "1500", "currency": "eur", "metadata[order_id]": "6736"},
            headers={"Idempotency-Key": form_key},
        )
        check(sent_form.status_code == 201, f"expected HTTP 201, got {answer(sent_form)}")
        made = sent_form.json()
        check(made["metadata"] == {"order_id": "6736"}, f"metadata {made['metadata']}, not the one sent")
        twin = new_payment(1500, metadata=Metadata.from_dict({"order_id": "6736"}))
        r = create_payment.sync_detailed(client=client, body=twin, idempotency_key=form_key)
        payment = expect(r, 201, Payment)
        replayed = r.headers.get("Idempotent-Replayed")
        check(replayed == "true", f"the JSON twin: Idempotent-Replayed {replayed!r}, not 'true'")
        check(payment.id == made["id"], f"the JSON twin answered {payment.id}, not {made['id']}")
        return f"{payment.id} by form, its JSON twin a replay"

    @step("a declined card")
    def _():
        r = create_payment.sync_detailed(
            client=client,
            body=new_payment(1500, payment_method=NewPaymentPaymentMethod.PM_CARD_CHARGEDECLINED),
            idempotency_key=f"tour-{uuid.uuid4()}",
        )
        problem = expect(r, 402, Problem)
        check(problem.code == "card-declined", f"code {problem.code!r}, not 'card-declined'")
        check(isinstance(problem.payment, str), f"no declined payment in {answer(r)}")
        state["declined"] = problem.payment
        return f"402 {problem.code}, payment {problem.payment}, decline_code {problem.decline_code}"

    @step("list payments")
    def _():
        page = expect(list_payments.sync_detailed(client=client, limit=10), 200, ListPayment)
        kinds = {type(item).__name__ for item in page.data}
        check(
            all(isinstance(item, Payment) for item in page.data),
            f"the items are {kinds}, not the generated Payment model",
        )
        ids = [item.id for item in page.data]
        check(state["payment"] in ids, f"{state['payment']} is not in the first page: {ids}")
        return f"{len(page.data)} items, each a {Payment.__module__}.Payment"

    @step("get the payment")
    def _():
        payment = expect(get_payment.sync_detailed(state["payment"], client=client), 200, Payment)
        check(payment.amount == 4200, f"amount {payment.amount}, not 4200")
        return f"{payment.id}: {payment.amount} {payment.currency}, {payment.status}"

    @step("a partial refund")
    def _():
        r = create_refund.sync_detailed(
            state["payment"],
            client=client,
            body=NewRefund(amount=1000, reason="tour"),
            idempotency_key=f"tour-{uuid.uuid4()}",
        )
        refund = expect(r, 201, Refund)
        check(refund.amount == 1000, f"refunded {refund.amount}, not 1000")
        check(refund.payment == state["payment"], f"refund of {refund.payment}, not {state['payment']}")
        return f"{refund.id}: {refund.amount}, {refund.status}"

    @step("a full refund with no body")
    def _():
        sent.clear()
        r = create_refund.sync_detailed(
            state["payment"], client=client, idempotency_key=f"tour-{uuid.uuid4()}"
        )
        refund = expect(r, 201, Refund)
        check(len(sent) == 1, f"{len(sent)} requests sent, not one")
        check(sent[0].content == b"", f"the request had a body: {sent[0].content!r}")
        check(refund.amount == 3200, f"refunded {refund.amount}, not the 3200 left")
        payment = expect(get_payment.sync_detailed(state["payment"], client=client), 200, Payment)
        check(
            payment.amount_refunded == 4200 and payment.status == PaymentStatus.REFUNDED,
            f"the payment shows {payment.amount_refunded} refunded, {payment.status}",
        )
        return f"{refund.id}: the {refund.amount} left; the payment is {payment.status}"

    @step("list events")
    def _():
        wanted = [
            (state["payment"], EventType.PAYMENT_SUCCEEDED),
            (state["payment"], EventType.REFUND_CREATED),
            (state["payment"], EventType.PAYMENT_REFUNDED),
            (state["declined"], EventType.PAYMENT_DECLINED),
        ]
        # An event is listed once every transaction older than its own has ended: a few tries.
        deadline = time.monotonic() + 5
        while True:
            page = expect(list_events.sync_detailed(client=client, limit=100), 200, ListEvent)
            seen = []
            for event in page.data:
                # The event's object is the generated Payment, Refund or WebhookEndpoint (the
                # spec's oneOf; an endpoint's, for its `webhook_endpoint.updated`).
                thing = event.data.object_
                check(
                    isinstance(thing, (Payment, Refund, WebhookEndpoint)),
                    f"{event.id}'s object is a {type(thing).__name__}, not a Payment, a Refund or an endpoint",
                )
                if isinstance(thing, WebhookEndpoint):
                    continue
                seen.append((thing.id if isinstance(thing, Payment) else thing.payment, event.type_))
            missing = [f"{kind} of {payment}" for payment, kind in wanted if (payment, kind) not in seen]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        check(not missing, f"no event {', '.join(missing)} among the {len(page.data)} listed")
        ours = [str(kind) for payment, kind in reversed(seen) if payment == state["payment"]]
        return f"{len(page.data)} events; {state['payment']}'s, oldest first: {', '.join(ours)}"

    @step("inspect the idempotency key")
    def _():
        inspection = expect(get_idempotency_key.sync_detailed(key, client=client), 200, KeyInspection)
        check(inspection.key == key, f"inspected {inspection.key!r}, not {key!r}")
        check(len(inspection.uses) == 1, f"{len(inspection.uses)} uses, not one")
        use = inspection.uses[0]
        check(use.state == KeyUseState.COMPLETED, f"state {use.state}, not completed")
        check(use.response_status == 201, f"stored status {use.response_status}, not 201")
        return f"{use.route}: {use.state}, stored {use.response_status}, {use.takeovers} takeovers"

    @step("register a webhook endpoint for every event")
    def _():
        # `*` is named ALL through the spec's x-enum-varnames.
        every = NewWebhookEndpointEnabledEventsItem.ALL
        r = create_webhook_endpoint.sync_detailed(
            client=client,
            body=NewWebhookEndpoint(url="http://127.0.0.1:9/tour", enabled_events=[every]),
            idempotency_key=f"tour-{uuid.uuid4()}",
        )
        endpoint = expect(r, 201, WebhookEndpoint)
        check(endpoint.enabled_events == ["*"], f"enabled_events {endpoint.enabled_events}, not ['*']")
        check(
            isinstance(endpoint.secret, str) and endpoint.secret.startswith("whsec_"),
            f"secret {endpoint.secret!r}",
        )
        # Nothing listens there: remove it before the next events are delivered to it in vain.
        expect(delete_webhook_endpoint.sync_detailed(endpoint.id, client=client), 200, DeletedWebhookEndpoint)
        return f"{endpoint.id} with enabled_events [{every.name} = {every.value!r}] (then deleted)"

    @step("a dispute from the processor, read back")
    def _():
        r = create_payment.sync_detailed(
            client=client, body=new_payment(4200, order="tour_2"), idempotency_key=f"tour-{uuid.uuid4()}"
        )
        payment = expect(r, 201, Payment)
        url, processor_key = banner_dispute_command(server_out)
        opened = urllib.request.Request(
            f"{url}/v1/charges/{payment.charge}/disputes",
            data=b'{"amount": 500}',
            headers={"Authorization": f"Bearer {processor_key}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(opened, timeout=30) as response:
            check(response.status == 201, f"the processor answered {response.status} to the dispute")
            dispute = json.loads(response.read())["id"]
        # The processor delivers its event on its own: a few tries until the payment shows it.
        deadline = time.monotonic() + 30
        while True:
            read = expect(get_payment.sync_detailed(payment.id, client=client), 200, Payment)
            if read.amount_disputed == 500 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        check(read.amount_disputed == 500, f"amount_disputed {read.amount_disputed}, not 500")
        # The disputes API: the payment's disputes, and the one by its id.
        page = expect(list_disputes.sync_detailed(client=client, payment=payment.id), 200, ListDispute)
        ids = [listed.id for listed in page.data]
        check(ids == [dispute], f"the payment's disputes are {ids}, not [{dispute}]")
        one = expect(get_dispute.sync_detailed(dispute, client=client), 200, Dispute)
        check(
            (one.payment, one.amount) == (payment.id, 500),
            f"dispute {one.id} names {one.payment} for {one.amount}, not {payment.id} for 500",
        )
        return f"{dispute} on {payment.id}: amount_disputed {read.amount_disputed}, {one.status}"

    for number, (name, function) in enumerate(steps, 1):
        try:
            said = function()
        except StepFailed as failure:
            print(f"client tour: {number}. {name}: FAILED: {failure}")
            return 1
        except Exception as error:  # noqa: BLE001 (the generated client raising, a connection refused, …)
            print(f"client tour: {number}. {name}: FAILED: {type(error).__name__}: {error}")
            return 1
        print(f"client tour: {number}. {name}: {said}")
    print(f"client tour: all {len(steps)} steps passed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL API_KEY CLIENT_DIR SERVER_OUT")
    sys.exit(main(*sys.argv[1:]))
