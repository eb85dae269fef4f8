-- The ledgers' money rules, held by the database, so that no code path can break one silently:
-- a statement that would is refused, and its request answers 500 with the constraint's name in
-- the log (src/payments/README.md, "Money rules", states them once).
--
-- idempay's payments:
--   * `payments_money_held`: refunds and disputes hold at most what was captured. What was
--     captured is `amount_captured`, or, where a release before manual capture left it NULL, the
--     whole amount (nothing for a decline). `amount_disputed` is derived from the disputes
--     (src/payments/disputed.rs): the disputes not won, at most what was captured and not refunded.
--   * `payments_capturable`: only an authorization still held can be captured, all of it, and
--     nothing was taken yet; every other payment has nothing capturable.
--   * `payments_canceled`: a canceled payment took nothing and says when it was canceled; no
--     other payment has a cancellation.
-- The processor's charges:
--   * `processor_charges_money_held`: refunds, and disputes, each at most what was captured (the
--     cardholder's bank claims what it claims, so the two together may exceed it: idempay flags
--     such a dispute `needs_review`).
--   * `processor_charges_released`: an authorization held, voided or expired took nothing.
-- Non-negative amounts were CHECKs already (`payments_amount_refunded_check`,
-- `payments_amount_disputed_check`, `payments_amount_captured`, `processor_charges_refunded`,
-- `processor_charges_disputed`, `processor_charges_amount_captured`).
--
-- Expand only (migrations/README.md): NOT VALID here, so adding them reads no row and blocks no
-- write for long; validated by the next migration. The previous release's writes keep every one:
-- it caps a dispute at what remains, squeezes disputes beside a refund, and gives a won dispute
-- back at most down to 0.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE payments
    ADD CONSTRAINT payments_money_held
        CHECK (amount_refunded + amount_disputed
               <= COALESCE(amount_captured, CASE WHEN status = 'declined' THEN 0 ELSE amount END))
        NOT VALID,
    ADD CONSTRAINT payments_capturable
        CHECK (CASE WHEN status = 'requires_capture'
                    THEN amount_capturable = amount AND amount_captured = 0
                    ELSE amount_capturable = 0 END)
        NOT VALID,
    ADD CONSTRAINT payments_canceled
        CHECK (CASE WHEN status = 'canceled'
                    THEN amount_captured = 0 AND canceled_at IS NOT NULL
                    ELSE canceled_at IS NULL AND cancellation_reason IS NULL END)
        NOT VALID;

ALTER TABLE processor_charges
    ADD CONSTRAINT processor_charges_money_held
        CHECK (GREATEST(amount_refunded, amount_disputed)
               <= COALESCE(amount_captured, CASE WHEN status = 'declined' THEN 0 ELSE amount END))
        NOT VALID,
    ADD CONSTRAINT processor_charges_released
        CHECK (capture_state = 'captured' OR amount_captured = 0)
        NOT VALID;
