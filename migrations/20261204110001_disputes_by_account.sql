-- `GET /v1/disputes` lists an account's disputes newest first, a page at a time by the keyset
-- (created_at, id): this index is that order behind the account every query names, so a page is
-- an index range scan (on Citus, on the shard of the account). Filtered by payment, the list uses
-- `disputes_payment_id`: a payment has a few disputes at most.
CREATE INDEX disputes_account_created ON disputes (account_id, created_at DESC, id DESC);
