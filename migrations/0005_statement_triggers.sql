-- The outbox's two triggers run once per statement instead of once per
-- row. A batch insert (the publish API's groups, `emit_batch`) used to run
-- both trigger functions for every row; now each runs one set-based query
-- over the statement's new rows, which costs less than one row's worth of
-- per-row calls, and even a one-row insert is cheaper. Behaviour is
-- unchanged: one pointer per scope per transaction, naming the lowest seq
-- the first statement wrote there, and one webhook delivery per matching
-- subscription and event, written in the event's transaction.

DROP TRIGGER outbox_notify ON outbox;
DROP TRIGGER outbox_enqueue_webhooks ON outbox;
DROP FUNCTION outbox_notify();
DROP FUNCTION outbox_enqueue_webhooks();

-- Pointers for the scopes this statement wrote that the transaction has
-- not announced yet, in seq order. The announced scopes are still kept in
-- the transaction-local setting (rolled back with a savepoint), capped at a
-- few kilobytes past which every further scope notifies.
CREATE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    announced text := coalesce(current_setting('eventrelay.announced_scopes', true), '');
    grew boolean := false;
    written record;
    key text;
BEGIN
    FOR written IN
        SELECT scope_key, min(seq) AS seq FROM new_rows GROUP BY scope_key ORDER BY 2
    LOOP
        key := TG_TABLE_SCHEMA || '/' || md5(written.scope_key) || ';';
        CONTINUE WHEN position(key IN announced) > 0;
        IF length(announced) < 8192 THEN
            announced := announced || key;
            grew := true;
        END IF;
        PERFORM pg_notify(
            notify_channel(),
            format('{"k":"ptr","s":%s,"q":%s}', to_json(written.scope_key)::text, written.seq)
        );
    END LOOP;
    IF grew THEN
        PERFORM set_config('eventrelay.announced_scopes', announced, true);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

CREATE FUNCTION outbox_enqueue_webhooks() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_deliveries (subscription_id, event_seq, event_id, event_type, scope_key, payload)
    SELECT s.id, n.seq, n.id, n.type, n.scope_key,
           jsonb_build_object(
               'id', n.id,
               'type', n.type,
               'scopeKey', n.scope_key,
               'lane', 'durable',
               'seq', n.seq,
               'data', n.data,
               'resources', to_jsonb(n.resources),
               'occurredAt', to_char(n.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
           )
    FROM new_rows n
    JOIN webhook_subscriptions s
      ON (s.scope_key IS NULL OR s.scope_key = n.scope_key)
     AND webhook_type_matches(s.types, n.type)
    ORDER BY n.seq, s.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_enqueue_webhooks AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_enqueue_webhooks();
