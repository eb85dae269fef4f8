//! The endpoint routes: registration once per key with a secret shown once, the account's own
//! endpoints only, and no URL into a private network.

use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::json;

use super::{local, post_endpoint};
use crate::support::helpers::{TestApp, TestResponse, new_key};

#[api_test]
async fn a_replayed_registration_returns_the_same_endpoint_and_secret_which_get_never_shows() {
    let app = TestApp::spawn_with(local("1s")).await;
    let key = new_key();
    let body = json!({
        "url": "http://127.0.0.1:9/hooks",
        "enabled_events": ["payment.succeeded", "refund.created"],
    });

    let first = post_endpoint(&app, &app.api_key, &key, &body).await;
    let again = post_endpoint(&app, &app.api_key, &key, &body).await;

    first.assert_status(201);
    assert_eq!(again.status, 201);
    assert!(!first.replayed());
    assert!(again.replayed());
    assert_eq!(first.body, again.body, "byte for byte, the secret included");
    let endpoint = first.json();
    let (id, secret) = (
        endpoint["id"].as_str().unwrap(),
        endpoint["secret"].as_str().unwrap(),
    );
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert_eq!(endpoint["object"], "webhook_endpoint");
    assert_eq!(endpoint["status"], "enabled");
    assert_eq!(
        endpoint["enabled_events"],
        json!(["payment.succeeded", "refund.created"])
    );
    assert_eq!(
        first.header("location"),
        Some(format!("/v1/webhook_endpoints/{id}").as_str())
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_endpoints")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(count, 1, "one endpoint for one key");
    let inspected = app.get(&format!("/v1/idempotency_keys/{key}")).await.json();
    assert_eq!(inspected["uses"][0]["route"], "POST /v1/webhook_endpoints");
    assert_eq!(inspected["uses"][0]["response_status"], 201);

    let read = app.get(&format!("/v1/webhook_endpoints/{id}")).await;
    let listed = app.get("/v1/webhook_endpoints").await;
    assert_eq!(read.status, 200);
    assert_eq!(listed.status, 200);
    for answer in [&read, &listed] {
        let text = String::from_utf8_lossy(&answer.body);
        assert!(!text.contains(secret), "{text}");
        assert!(!text.contains("\"secret\""), "{text}");
    }
    assert_eq!(read.json()["id"], id);
    assert_eq!(listed.json()["object"], "list");
    assert_eq!(listed.json()["data"][0]["id"], id);
}

#[api_test]
async fn another_account_s_endpoint_is_not_found_and_a_deleted_one_is_gone() {
    let app = TestApp::spawn_with(local("1s")).await;
    let (id, _) = super::endpoint_for_all(&app, "http://127.0.0.1:9/hooks").await;
    let (_, stranger) = app.create_account("stranger").await;
    let path = format!("/v1/webhook_endpoints/{id}");

    let as_stranger = |method: reqwest::Method| {
        app.client()
            .request(method, app.url(&path))
            .bearer_auth(&stranger)
    };
    app.send(as_stranger(reqwest::Method::GET))
        .await
        .assert_problem(404, "not-found");
    app.send(as_stranger(reqwest::Method::DELETE))
        .await
        .assert_problem(404, "not-found");
    let listed = app
        .send(
            app.client()
                .get(app.url("/v1/webhook_endpoints"))
                .bearer_auth(&stranger),
        )
        .await;
    assert_eq!(listed.json()["data"], json!([]));

    let deleted = app
        .send(
            app.client()
                .delete(app.url(&path))
                .bearer_auth(&app.api_key),
        )
        .await;
    assert_eq!(deleted.status, 200);
    assert_eq!(
        deleted.json(),
        json!({ "id": id, "object": "webhook_endpoint", "deleted": true })
    );
    app.get(&path).await.assert_problem(404, "not-found");
}

#[api_test]
async fn unknown_event_types_and_urls_that_are_not_http_are_refused() {
    let app = TestApp::spawn_with(local("1s")).await;
    for body in [
        json!({ "url": "https://example.com/", "enabled_events": ["charge.succeeded"] }),
        json!({ "url": "https://example.com/", "enabled_events": [] }),
        json!({ "url": "https://example.com/", "enabled_events": ["*", "payment.succeeded"] }),
        json!({ "url": "ftp://example.com/", "enabled_events": ["*"] }),
        json!({ "url": "https://user:pw@example.com/", "enabled_events": ["*"] }),
        json!({ "url": "/hooks", "enabled_events": ["*"] }),
        json!({ "url": "https://example.com/", "enabled_events": ["*"], "extra": 1 }),
    ] {
        post_endpoint(&app, &app.api_key, &new_key(), &body)
            .await
            .assert_problem(400, "invalid-request");
    }
}

/// Without `IDEMPAY_WEBHOOK_ALLOW_PRIVATE`, no URL whose host is or resolves to a non-public
/// address is accepted; with it, the same URLs are.
#[api_test]
async fn a_private_url_is_refused_unless_private_addresses_are_allowed() {
    let production = TestApp::spawn_with(Settings::default()).await;
    let development = production.another_instance(local("1s")).await;
    let private = [
        "http://127.0.0.1:8080/hooks",
        "http://10.1.2.3/hooks",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/hooks",
        "http://100.64.0.1/hooks",
        "http://localhost:8080/hooks",
        // IPv6 forms that wrap a non-public IPv4 address: 6to4 of 127.0.0.1, Teredo
        // of client 169.254.169.254, NAT64 of 10.0.0.1, NAT64 local-use, IPv4-mapped,
        // IPv4-compatible and IPv4-translated forms of 127.0.0.1.
        "http://[2002:7f00:1::]:18080/",
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/hooks",
        "http://[64:ff9b::a00:1]/hooks",
        "http://[64:ff9b:1::7f00:1]/hooks",
        "http://[::ffff:127.0.0.1]/hooks",
        "http://[::127.0.0.1]/hooks",
        "http://[::ffff:0:127.0.0.1]/hooks",
    ];
    for url in private {
        let body = json!({ "url": url, "enabled_events": ["*"] });
        let refused = post_endpoint(&production, &production.api_key, &new_key(), &body).await;
        assert_refused_as_not_public(&refused, url);
        let accepted = post_endpoint(&development, &development.api_key, &new_key(), &body).await;
        assert_eq!(accepted.status, 201, "{url}");
    }
}

/// The key is decided before the address is checked: an instance that refuses private addresses
/// replays, byte for byte with its secret, the registration of a loopback URL that an instance
/// allowing them completed under the same key (before, it checked the address first and answered
/// 400, and the secret, shown once, was lost). An address it refuses releases the key, as any
/// failure before an effect: the same key then registers where the address is allowed.
#[api_test]
async fn a_completed_registration_is_replayed_even_where_its_address_is_now_refused() {
    let development = TestApp::spawn_with(local("1s")).await;
    let production = development.another_instance(Settings::default()).await;
    let body = json!({ "url": "http://127.0.0.1:9/hooks", "enabled_events": ["*"] });
    let key = new_key();

    let first = post_endpoint(&development, &development.api_key, &key, &body).await;
    let replay = post_endpoint(&production, &production.api_key, &key, &body).await;

    first.assert_status(201);
    replay.assert_status(201);
    assert!(replay.replayed());
    assert_eq!(
        replay.body, first.body,
        "byte for byte, the secret included"
    );
    assert_eq!(replay.header("location"), first.header("location"));

    let other = new_key();
    let refused = post_endpoint(&production, &production.api_key, &other, &body).await;
    assert_refused_as_not_public(&refused, "http://127.0.0.1:9/hooks");
    let registered = post_endpoint(&development, &development.api_key, &other, &body).await;
    assert_eq!(registered.status, 201, "the refusal released the key");
    assert!(!registered.replayed());
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_endpoints")
        .fetch_one(&development.db)
        .await
        .unwrap();
    assert_eq!(count, 2, "one endpoint per key");
}

/// Asserts the registration of `url` was refused for its address: not a public one.
#[track_caller]
fn assert_refused_as_not_public(refused: &TestResponse, url: &str) {
    let problem = refused.assert_problem(400, "invalid-request");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("not a public address"),
        "{url}: {problem}"
    );
}

#[api_test]
async fn endpoints_are_listed_by_created_seconds_and_a_malformed_bound_is_refused() {
    let app = TestApp::spawn_with(local("1s")).await;
    const T: i64 = 1_700_000_000;
    let mut ids = Vec::new();
    for (n, at) in [0.0, 1.4, 3.0].into_iter().enumerate() {
        let body = json!({ "url": format!("http://127.0.0.1:9/hooks/{n}"), "enabled_events": ["payment.succeeded"] });
        let created = post_endpoint(&app, &app.api_key, &new_key(), &body).await;
        created.assert_status(201);
        let id = created.json()["id"].as_str().unwrap().to_owned();
        sqlx::query("UPDATE webhook_endpoints SET created_at = to_timestamp($2) WHERE id = $1")
            .bind(&id)
            .bind(T as f64 + at)
            .execute(&app.db)
            .await
            .unwrap();
        ids.push(id);
    }
    let listed = |query: String| {
        let app = &app;
        async move {
            let page = app.get(&format!("/v1/webhook_endpoints?{query}")).await;
            assert_eq!(page.status, 200, "{query}: {}", page.json());
            page.json()["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|endpoint| endpoint["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };

    assert_eq!(listed(format!("created={}", T + 1)).await, [ids[1].clone()]);
    assert_eq!(
        listed(format!("created[gte]={T}&created[lt]={}", T + 3)).await,
        [ids[1].clone(), ids[0].clone()]
    );
    assert_eq!(
        listed(format!("created[gt]={T}&limit=1")).await,
        [ids[2].clone()]
    );
    assert_eq!(
        listed(format!("created[gt]={T}&limit=1&starting_after={}", ids[2])).await,
        [ids[1].clone()]
    );
    let refused = app.get("/v1/webhook_endpoints?created[gte]=soon").await;
    let problem = refused.assert_problem(400, "invalid-request");
    // The detail starts with a capital, the parameter's name or not.
    let detail = problem["detail"].as_str().unwrap().to_lowercase();
    assert!(detail.contains("created[gte]"), "{detail}");
}
