//! Two accounts on one service: a key, an id or a refund key of one account gives the other
//! nothing. Another account's objects answer exactly as ids that do not exist (404, never 403), a
//! key shared by two accounts is two keys even while one of them is in flight, and no answer ever
//! carries an API key.
//!
//! Already covered elsewhere: the same key from another account executes again (lifecycle), another
//! account's payment is not found (payments), cannot be refunded with a fresh key (refunds), is
//! not listed (listing), and missing or unknown API keys are refused (errors).

use std::time::Duration;

use idempay_test_macros::api_test;
use serde_json::{Value, json};

use crate::support::helpers::{
    TestApp, TestResponse, new_key, payment, send, slow_payment, with_slow_charge,
};
use crate::support::invariants::assert_exactly_once;

/// One account's view of the service. Every answer it receives is checked for API keys.
struct Caller<'a> {
    app: &'a TestApp,
    api_key: String,
    account_id: String,
    /// Every API key that must never appear in an answer.
    secrets: Vec<String>,
}

impl<'a> Caller<'a> {
    fn new(app: &'a TestApp, api_key: &str, secrets: &[&str]) -> Self {
        Self {
            app,
            api_key: api_key.to_owned(),
            account_id: String::new(),
            secrets: secrets.iter().map(|secret| (*secret).to_owned()).collect(),
        }
    }

    async fn get(&self, path: &str) -> TestResponse {
        self.checked(
            self.app
                .client()
                .get(self.app.url(path))
                .bearer_auth(&self.api_key),
        )
        .await
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> TestResponse {
        self.checked(
            self.app
                .client()
                .post(self.app.url(path))
                .bearer_auth(&self.api_key)
                .header("idempotency-key", key)
                .json(body),
        )
        .await
    }

    async fn pay(&self, key: &str, body: &Value) -> TestResponse {
        self.post("/v1/payments", key, body).await
    }

    async fn checked(&self, request: reqwest::RequestBuilder) -> TestResponse {
        let response = send(request).await;
        assert_no_secret(&response, &self.secrets);
        response
    }
}

fn assert_no_secret(response: &TestResponse, secrets: &[String]) {
    let body = String::from_utf8_lossy(&response.body);
    for secret in secrets {
        assert!(
            !body.contains(secret.as_str()),
            "an answer carries an API key: {body}"
        );
        for (name, value) in &response.headers {
            assert!(
                !String::from_utf8_lossy(value.as_bytes()).contains(secret.as_str()),
                "the {name} header carries an API key"
            );
        }
    }
}

/// Two accounts on a fresh service, each with its caller.
async fn two_accounts(app: &TestApp) -> (Caller<'_>, Caller<'_>) {
    let (other_account, other_api_key) = app.create_account("another merchant").await;
    let secrets = [app.api_key.as_str(), other_api_key.as_str()];
    let mut a = Caller::new(app, &app.api_key, &secrets);
    a.account_id.clone_from(&app.account_id);
    let mut b = Caller::new(app, &other_api_key, &secrets);
    b.account_id = other_account;
    (a, b)
}

#[api_test(citus)]
async fn another_account_is_not_blocked_by_a_key_in_flight_for_this_one() {
    // Long enough for another account to be made and to pay while A's charge runs, on a loaded
    // cluster too.
    let app = TestApp::spawn_with(with_slow_charge(Duration::from_secs(4))).await;
    let (a, b) = two_accounts(&app).await;
    let key = new_key();
    let slow = slow_payment(4200);

    let first = app.start_payment(&key, &slow).await;
    // The key is in flight for A: A's own retry is told to wait...
    a.pay(&key, &slow)
        .await
        .assert_problem(409, "idempotency-key-in-use");
    // ...but another account's request with the same key is its own, and executes at once...
    let (third_account, third_api_key) = app.create_account("a third merchant").await;
    let c = Caller::new(&app, &third_api_key, &[&app.api_key, &third_api_key]);
    let other_body = c.pay(&key, &payment(1)).await;
    assert_eq!(
        other_body.status, 201,
        "another body is no mismatch of A's key"
    );
    assert!(other_body.header("idempotent-replayed").is_none());
    let still_in_flight: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM idempotency_keys WHERE scope LIKE $1 || ':%' AND idem_key = $2",
    )
    .bind(&app.account_id)
    .bind(&key)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(
        still_in_flight,
        ["in_progress"],
        "A's request was still running"
    );
    // ...and with the same body too: it is charged for B, not told to wait for A.
    let theirs = b.pay(&key, &slow).await;
    theirs.assert_status(201);
    assert!(theirs.header("idempotent-replayed").is_none());

    let mine = first.await.unwrap();
    assert_eq!(mine.status, 201);
    assert!(mine.header("idempotent-replayed").is_none());
    assert_ne!(mine.id(), theirs.id());
    let owners: Vec<(String, String)> = sqlx::query_as("SELECT id, account_id FROM payments")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert!(owners.contains(&(mine.id(), app.account_id.clone())));
    assert!(owners.contains(&(theirs.id(), b.account_id.clone())));
    assert!(owners.contains(&(other_body.id(), third_account)));
    // Each account reads its own payment and not the other's.
    assert_eq!(
        a.get(&format!("/v1/payments/{}", mine.id())).await.status,
        200
    );
    assert_eq!(
        b.get(&format!("/v1/payments/{}", theirs.id())).await.status,
        200
    );
    b.get(&format!("/v1/payments/{}", mine.id()))
        .await
        .assert_problem(404, "not-found");
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_shared_key_replays_each_account_its_own_answer_only() {
    let app = TestApp::spawn().await;
    let (a, b) = two_accounts(&app).await;
    let key = new_key();
    let mine = a.pay(&key, &payment(4200)).await;
    assert_eq!(mine.status, 201);

    let theirs = b.pay(&key, &payment(4200)).await;
    assert_eq!(theirs.status, 201);
    assert!(
        theirs.header("idempotent-replayed").is_none(),
        "B's first request executed: no replay header at all"
    );
    assert_ne!(theirs.header("location"), mine.header("location"));
    // Each account's retry replays its own answer, byte for byte, never the other's.
    let their_retry = b.pay(&key, &payment(4200)).await;
    assert!(their_retry.replayed());
    assert_eq!(their_retry.body, theirs.body);
    let my_retry = a.pay(&key, &payment(4200)).await;
    assert!(my_retry.replayed());
    assert_eq!(my_retry.body, mine.body);
    // A mismatch in B's scope is B's alone: A's key still replays.
    b.pay(&key, &payment(1))
        .await
        .assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(a.pay(&key, &payment(4200)).await.body, mine.body);

    // A stored refusal is not shared either: A's declined card does not answer B.
    let declined_key = new_key();
    let declined =
        json!({ "amount": 500, "currency": "eur", "payment_method": "pm_card_chargeDeclined" });
    a.pay(&declined_key, &declined)
        .await
        .assert_problem(402, "card-declined");
    let b_declined = b.pay(&declined_key, &declined).await;
    let problem = b_declined.assert_problem(402, "card-declined");
    assert!(b_declined.header("idempotent-replayed").is_none());
    let b_payment = problem["payment"].as_str().unwrap();
    assert_eq!(
        b.get(&format!("/v1/payments/{b_payment}")).await.status,
        200,
        "B's decline names B's own payment"
    );
    assert_eq!(app.payment_count().await, 4);
    assert_exactly_once(&app.db).await;
}

#[api_test]
async fn another_accounts_objects_answer_as_ids_that_do_not_exist() {
    let app = TestApp::spawn().await;
    let (a, b) = two_accounts(&app).await;
    let paid = app.paid(5000).await;
    let refund = a
        .post(
            &format!("/v1/payments/{paid}/refunds"),
            &new_key(),
            &json!({ "amount": 100 }),
        )
        .await;
    assert_eq!(refund.status, 201);
    let refund = refund.id();
    let unknown_payment = "pay_000000000000000000000000";
    let unknown_refund = "re_000000000000000000000000";

    // Each of A's objects, read by B, and the same read of an id that exists nowhere.
    let reads = [
        (
            format!("/v1/payments/{paid}"),
            format!("/v1/payments/{unknown_payment}"),
        ),
        (
            format!("/v1/payments/{paid}/refunds"),
            format!("/v1/payments/{unknown_payment}/refunds"),
        ),
        (
            format!("/v1/refunds/{refund}"),
            format!("/v1/refunds/{unknown_refund}"),
        ),
        (
            format!("/v1/payments/{paid}/refunds?starting_after={refund}"),
            format!("/v1/payments/{unknown_payment}/refunds?starting_after={unknown_refund}"),
        ),
        (
            format!("/v1/payments?ending_before={paid}"),
            format!("/v1/payments?ending_before={unknown_payment}"),
        ),
    ];
    for (foreign, missing) in &reads {
        let foreign_answer = b.get(foreign).await;
        let missing_answer = b.get(missing).await;
        let foreign_problem = foreign_answer.assert_problem(404, "not-found");
        let missing_problem = missing_answer.assert_problem(404, "not-found");
        // Nothing tells the two apart but the id each names.
        let scrub = |problem: &Value| {
            problem
                .to_string()
                .replace(&paid, "ID")
                .replace(&refund, "ID")
                .replace(unknown_payment, "ID")
                .replace(unknown_refund, "ID")
        };
        assert_eq!(
            scrub(&foreign_problem),
            scrub(&missing_problem),
            "{foreign}"
        );
        let names = |response: &TestResponse| {
            let mut names: Vec<String> = response
                .headers
                .keys()
                .map(|name| name.as_str().to_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(&foreign_answer), names(&missing_answer), "{foreign}");
    }
    // B's listing holds none of A's payments, and A still reads everything.
    let listed = b.get("/v1/payments?limit=100").await.json();
    assert_eq!(listed["data"], json!([]), "{listed}");
    assert_eq!(a.get(&format!("/v1/refunds/{refund}")).await.status, 200);
    assert_eq!(
        a.get(&format!("/v1/payments/{paid}/refunds")).await.json()["data"][0]["id"],
        refund.as_str()
    );
}

#[api_test]
async fn another_account_with_this_accounts_refund_key_touches_nothing() {
    let app = TestApp::spawn().await;
    let (a, b) = two_accounts(&app).await;
    let paid = app.paid(5000).await;
    let refunds = format!("/v1/payments/{paid}/refunds");
    let key = new_key();
    let body = json!({ "amount": 1200 });
    let mine = a.post(&refunds, &key, &body).await;
    assert_eq!(mine.status, 201);
    let before = a.get(&format!("/v1/payments/{paid}")).await;
    assert_eq!(before.json()["amount_refunded"], 1200);

    // B sends A's refund request as it is, with A's key: not A's answer, and nothing refunded.
    let theirs = b.post(&refunds, &key, &body).await;
    theirs.assert_problem(404, "not-found");
    assert!(theirs.header("idempotent-replayed").is_none());
    // B's retry replays B's own refusal, never A's refund.
    let their_retry = b.post(&refunds, &key, &body).await;
    assert_eq!(their_retry.body, theirs.body);
    assert_ne!(their_retry.body, mine.body);
    // Other bodies under the key in B's scope: refused, as a mismatch of B's own request.
    for other in [json!({}), json!({ "amount": 3800 })] {
        let answer = b.post(&refunds, &key, &other).await;
        answer.assert_problem(422, "idempotency-key-mismatch");
    }
    // And with a fresh key of B's: still not found.
    b.post(&refunds, &new_key(), &json!({}))
        .await
        .assert_problem(404, "not-found");
    let refund_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM refunds")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(refund_rows, 1);
    let after = a.get(&format!("/v1/payments/{paid}")).await;
    assert_eq!(after.body, before.body, "A's payment is untouched");

    // A's key still replays A's refund, and still refunds nothing more.
    let replay = a.post(&refunds, &key, &json!({ "amount": 1200 })).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, mine.body);
    assert_eq!(
        a.get(&format!("/v1/payments/{paid}")).await.json()["amount_refunded"],
        1200
    );
}

#[api_test]
async fn api_keys_never_appear_in_an_answer_and_near_misses_are_refused() {
    let app = TestApp::spawn().await;
    let (a, b) = two_accounts(&app).await;
    let secrets = a.secrets.clone();
    let paid = app.paid(100).await;
    let mine = &app.api_key;
    let last = mine.chars().last().unwrap();
    let flipped = format!(
        "{}{}",
        &mine[..mine.len() - 1],
        if last == 'a' { 'b' } else { 'a' }
    );
    // Keys that are almost A's: one character off, another case, cut short, one longer.
    let near_misses = [
        flipped,
        mine.to_uppercase(),
        mine.to_lowercase(),
        mine[..mine.len() - 1].to_owned(),
        format!("{mine}0"),
        mine.replacen("sk_", "pk_", 1),
    ];
    for near_miss in near_misses.iter().filter(|key| *key != mine) {
        let caller = Caller::new(&app, near_miss, &[]);
        for response in [
            caller.get("/v1/payments").await,
            caller.get(&format!("/v1/payments/{paid}")).await,
            caller.pay(&new_key(), &payment(100)).await,
        ] {
            response.assert_problem(401, "unauthorized");
            assert_no_secret(&response, std::slice::from_ref(near_miss));
            assert_no_secret(&response, &secrets);
        }
    }
    // The scheme and the header's shape are checked too, and the key is not echoed back.
    for authorization in [
        format!("Basic {mine}"),
        format!("Token {mine}"),
        mine.clone(),
        format!("Bearer {mine}, Bearer {}", b.api_key),
    ] {
        let response = send(
            app.client()
                .get(app.url("/v1/payments"))
                .header("authorization", authorization),
        )
        .await;
        response.assert_problem(401, "unauthorized");
        assert_no_secret(&response, &secrets);
    }
    // RFC 9110 (11.4) puts one or more spaces after the scheme: two are still the key.
    let spaced = send(
        app.client()
            .get(app.url("/v1/payments"))
            .header("authorization", format!("Bearer  {mine}")),
    )
    .await;
    assert_eq!(spaced.status, 200);

    // Every kind of answer the accounts can get, success or not, carries no key.
    let refund = a
        .post(
            &format!("/v1/payments/{paid}/refunds"),
            &new_key(),
            &json!({}),
        )
        .await;
    assert_eq!(refund.status, 201);
    for caller in [&a, &b] {
        caller.get("/v1/payments").await;
        caller.get(&format!("/v1/payments/{paid}")).await;
        caller.get(&format!("/v1/payments/{paid}/refunds")).await;
        caller.get(&format!("/v1/refunds/{}", refund.id())).await;
        caller.get("/v1/nothing").await;
        caller.pay("", &payment(100)).await;
        caller.pay(&new_key(), &json!({ "amount": 0 })).await;
        caller.pay(&new_key(), &payment(100)).await;
        caller
            .post(
                &format!("/v1/payments/{paid}/refunds"),
                &new_key(),
                &json!({}),
            )
            .await;
    }
}
