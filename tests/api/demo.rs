//! The client half: intents through a lossy network end in exactly one payment each, and every
//! intent's final answer is the response the server stored for its key.

use idempay::demo::{self, Faults, Options};
use libtest_mimic::Trial;

use crate::helpers::TestApp;
use crate::trials;

pub fn trials() -> Vec<Trial> {
    trials![demo;
        two_hundred_intents_through_30_percent_lost_answers_make_exactly_two_hundred_payments,
        a_new_key_per_attempt_charges_twice,
    ]
}

async fn two_hundred_intents_through_30_percent_lost_answers_make_exactly_two_hundred_payments() {
    let app = TestApp::spawn().await;
    let options = Options {
        intents: 200,
        faults: Faults {
            lost_responses: 0.3,
            resets: 0.05,
        },
        naive: false,
        concurrency: 8,
    };

    let tally = demo::run(&app.address, &app.api_key, &options, |_| {})
        .await
        .unwrap();

    println!("{tally}");
    assert!(
        tally.lost_responses > 20,
        "the network did lose answers: {tally}"
    );
    assert_eq!(tally.unanswered, 0);
    assert_eq!(tally.payments_in_ledger, 200);
    assert_eq!(tally.duplicates, 0);
    assert_eq!(app.payment_count().await, 200);
    assert!(tally.replays > 0, "lost answers were recovered by replays");
    crate::invariants::assert_exactly_once(&app.db).await;
    for outcome in &tally.outcomes {
        let key = outcome
            .idempotency_key
            .as_deref()
            .expect("a key per intent");
        let (code, body): (i16, Vec<u8>) = sqlx::query_as(
            "SELECT response_code, response_body FROM idempotency_keys WHERE idem_key = $1",
        )
        .bind(key)
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!(
            outcome.status,
            Some(code.unsigned_abs()),
            "{}",
            outcome.order
        );
        assert_eq!(
            outcome.raw.as_deref(),
            Some(body.as_slice()),
            "{}",
            outcome.order
        );
    }
}

async fn a_new_key_per_attempt_charges_twice() {
    let app = TestApp::spawn().await;
    let options = Options {
        intents: 50,
        faults: Faults {
            lost_responses: 0.3,
            resets: 0.0,
        },
        naive: true,
        concurrency: 8,
    };

    let tally = demo::run(&app.address, &app.api_key, &options, |_| {})
        .await
        .unwrap();

    println!("{tally}");
    assert!(tally.duplicates > 0, "{tally}");
    assert_eq!(tally.payments_in_ledger, 50 + tally.duplicates);
    assert_eq!(app.payment_count().await as usize, tally.payments_in_ledger);
}
