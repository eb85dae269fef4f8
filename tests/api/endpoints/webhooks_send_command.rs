//! `idempay webhook send`: it delivers what the intake accepts, and refuses what cannot apply.

use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::helpers::TestApp;
use crate::support::instance::idempay;

#[api_test]
async fn the_send_command_delivers_what_the_service_accepts() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let url = app.url("/v1/webhooks/processor");
    let data = json!({ "payment": paid, "dispute": "dp_cli", "amount": 250 });

    let (status, body) =
        idempay::webhooks::send(&url, &secret, "evt_cli", "dispute.created", data.clone())
            .await
            .unwrap();
    let (again, _) = idempay::webhooks::send(&url, &secret, "evt_cli", "dispute.created", data)
        .await
        .unwrap();

    assert_eq!((status, again), (200, 200));
    assert!(body.contains("applied"), "{body}");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 250);
}

/// A dispute's data without its dispute id would be acknowledged `ignored` and spend the event id
/// while the command exited 0: it is refused before it is sent, saying why,
/// and the same id with the data the intake needs is then applied; an event the service
/// acknowledges `ignored` all the same (a payment that does not exist) fails the command.
#[api_test]
async fn the_send_command_refuses_data_that_cannot_apply_before_sending_and_fails_on_ignored() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let url = app.url("/v1/webhooks/processor");
    let exposed = secret.expose();
    let env = [("IDEMPAY_WEBHOOK_SECRET", exposed.as_str())];
    let send = |data: String| {
        let url = url.clone();
        async move {
            let args = [
                "webhook",
                "send",
                "--url",
                &url,
                "--id",
                "evt_demo_1",
                "--type",
                "dispute.created",
                "--data",
                &data,
            ];
            idempay(&args, &env).await
        }
    };

    let old_banner = send(format!(r#"{{"payment": "{paid}", "amount": 500}}"#)).await;
    let banner = send(format!(
        r#"{{"payment": "{paid}", "dispute": "dp_demo1", "amount": 500}}"#
    ))
    .await;
    let nowhere = idempay(
        &[
            "webhook",
            "send",
            "--url",
            &url,
            "--type",
            "dispute.created",
            "--data",
            r#"{"payment": "pay_U5PgTqA02dYsv3cLANIGkqIs", "dispute": "dp_x", "amount": 5}"#,
        ],
        &env,
    )
    .await;

    let stderr = String::from_utf8_lossy(&old_banner.stderr);
    assert!(!old_banner.status.success(), "{old_banner:?}");
    assert!(
        stderr.contains("not sent") && stderr.contains("missing field `dispute`"),
        "{stderr}"
    );
    assert!(banner.status.success(), "{banner:?}");
    assert!(
        String::from_utf8_lossy(&banner.stdout).contains("\"applied\""),
        "{banner:?}"
    );
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 500);
    assert!(!nowhere.status.success(), "{nowhere:?}");
    let stderr = String::from_utf8_lossy(&nowhere.stderr);
    assert!(stderr.contains("`ignored`"), "{stderr}");
}
