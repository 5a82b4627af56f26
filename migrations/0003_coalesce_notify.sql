-- One wake-up per scope per transaction. A transaction that emits many
-- events into one scope used to send one pointer per row; relays read the
-- whole scope from the lowest seq a pointer names, so the first pointer of
-- each scope in a transaction is enough. The scopes already announced are
-- kept in a transaction-local setting, which Postgres also rolls back with
-- a savepoint, so an event whose pointer was discarded with a rolled-back
-- savepoint gets a fresh one. Past a few kilobytes of scopes the list stops
-- growing and every further row notifies, which is correct, only not
-- coalesced.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    announced text := coalesce(current_setting('eventrelay.announced_scopes', true), '');
    -- Keyed by the outbox's schema, which names its channel, so a coalesced
    -- row costs no lookup of the channel setting.
    key text := TG_TABLE_SCHEMA || '/' || md5(NEW.scope_key) || ';';
BEGIN
    IF position(key IN announced) > 0 THEN
        RETURN NULL;
    END IF;
    IF length(announced) < 8192 THEN
        PERFORM set_config('eventrelay.announced_scopes', announced || key, true);
    END IF;
    PERFORM pg_notify(
        notify_channel(),
        format('{"k":"ptr","s":%s,"q":%s}', to_json(NEW.scope_key)::text, NEW.seq)
    );
    RETURN NULL;
END
$$;
