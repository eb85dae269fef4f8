//! What each route answers a client: the payment, refund and dispute resources, their lists, the
//! events, webhook intake, the refusals of bad input, and the API's description of itself.

mod captures;
mod disputes;
mod docs;
mod errors;
mod events;
mod idempotency_keys;
mod listing;
mod payments;
mod refunds;
mod webhooks;
mod webhooks_effects;
mod webhooks_once;
mod webhooks_refusals;
mod webhooks_send_command;
