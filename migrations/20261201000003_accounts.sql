-- API keys can be rotated and revoked. An account whose key was revoked has none (NULL) until a new
-- one is issued; its payments stay.
ALTER TABLE accounts ALTER COLUMN api_key_hash DROP NOT NULL;

-- Every instance keeps the accounts of the keys it saw in memory, and the hashes of keys it did not
-- find. Each change of a key tells them, on the channel `idempay_api_keys`, with the hex of every
-- hash whose answer changed: the old one (it no longer authenticates) and the new one (it does
-- now). A trigger rather than the commands: a key changed by hand, or an account deleted, is told
-- too. pg_notify in the changing transaction is delivered at its commit, and never if it rolls back.
CREATE FUNCTION accounts_api_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.api_key_hash IS NOT NULL THEN
            PERFORM pg_notify('idempay_api_keys', encode(OLD.api_key_hash, 'hex'));
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF NEW.api_key_hash IS NOT NULL THEN
            PERFORM pg_notify('idempay_api_keys', encode(NEW.api_key_hash, 'hex'));
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER accounts_api_key_changed
    AFTER INSERT OR UPDATE OF api_key_hash OR DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION accounts_api_key_changed();
