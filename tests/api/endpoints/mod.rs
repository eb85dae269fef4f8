//! What each route answers a client: the payment and refund resources, their lists, the events,
//! webhook intake, the refusals of bad input, and the API's description of itself.

mod docs;
mod errors;
mod events;
mod idempotency_keys;
mod listing;
mod payments;
mod refunds;
mod webhooks;
