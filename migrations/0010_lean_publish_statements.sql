-- Leaner statements for the publish path. Every statement that writes the
-- outbox fires two statement triggers, and the publish API's statement
-- also calls outbox_announce_rows; together they were about a fifth of
-- the database's work per group of published events. Three changes, none
-- to what is sent:
--
-- * outbox_notify looks up the channel only once it knows it has rows to
--   announce: a statement that announced its own rows returns at once.
-- * outbox_enqueue_webhooks returns at once while there is no webhook
--   subscription, instead of preparing an INSERT into webhook_deliveries
--   (and its six indexes) that joins the new rows with nothing.
-- * outbox_announce_rows reads the wake-up mode and the channel from the
--   settings row in one query instead of two.

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    -- Room for the pointer's own fields around the rows: the kind, `q`
    -- and `x` at their longest, and the brackets.
    overhead constant int := 80;
    max_payload constant int := 7999;
    channel text;
    announced text;
    grew boolean := false;
    scope record;
    written record;
    scope_json text;
    key text;
    carried text;
    first_seq bigint;
    carried_txid xid8;
BEGIN
    -- The statement announced its rows itself (see outbox_announce_rows):
    -- nothing left to send. The mark is spent here, so the transaction's
    -- next statement is announced by this trigger again.
    IF current_setting('eventrelay.rows_announced', true) = TG_TABLE_SCHEMA THEN
        PERFORM set_config('eventrelay.rows_announced', '', true);
        RETURN NULL;
    END IF;
    channel := notify_channel();
    announced := coalesce(current_setting('eventrelay.announced_scopes', true), '');
    -- Most statements write few small rows per scope: one query builds
    -- each scope's whole pointer, and only a scope whose rows do not fit
    -- in one payload is walked row by row.
    FOR scope IN
        SELECT n.scope_key,
               min(n.seq) AS first_seq,
               (array_agg(n.txid ORDER BY n.seq))[1] AS txid,
               bool_and(n.txid IS NOT NULL) AS every_txid,
               string_agg(outbox_envelope(n), ',' ORDER BY n.seq) AS carried
        FROM new_rows n
        GROUP BY n.scope_key
        ORDER BY 2
    LOOP
        key := TG_TABLE_SCHEMA || '/' || md5(scope.scope_key) || ';';
        CONTINUE WHEN position(key IN announced) > 0;
        scope_json := to_json(scope.scope_key)::text;
        IF scope.every_txid
           AND octet_length(scope.carried) + octet_length(scope_json) + overhead <= max_payload THEN
            PERFORM pg_notify(channel, outbox_carrying_pointer(scope_json, scope.first_seq, scope.txid, scope.carried));
            CONTINUE;
        END IF;
        carried := '';
        FOR written IN
            SELECT n.seq, n.txid, outbox_envelope(n) AS envelope
            FROM new_rows n
            WHERE n.scope_key = scope.scope_key
            ORDER BY n.seq
        LOOP
            IF written.txid IS NULL
               OR octet_length(written.envelope) + octet_length(scope_json) + overhead > max_payload THEN
                -- This row cannot travel: a bare pointer, as before, and
                -- the read it causes finds the rest of this scope's rows.
                IF carried <> '' THEN
                    PERFORM pg_notify(channel, outbox_carrying_pointer(scope_json, first_seq, carried_txid, carried));
                    carried := '';
                END IF;
                PERFORM pg_notify(channel, format('{"k":"ptr","s":%s,"q":%s}', scope_json, written.seq));
                IF length(announced) < 8192 THEN
                    announced := announced || key;
                    grew := true;
                END IF;
                EXIT;
            END IF;
            IF carried <> '' AND octet_length(carried) + 1 + octet_length(written.envelope)
                                 + octet_length(scope_json) + overhead > max_payload THEN
                PERFORM pg_notify(channel, outbox_carrying_pointer(scope_json, first_seq, carried_txid, carried));
                carried := '';
            END IF;
            IF carried = '' THEN
                carried := written.envelope;
                first_seq := written.seq;
                carried_txid := written.txid;
            ELSE
                carried := carried || ',' || written.envelope;
            END IF;
        END LOOP;
        IF carried <> '' THEN
            PERFORM pg_notify(channel, outbox_carrying_pointer(scope_json, first_seq, carried_txid, carried));
        END IF;
    END LOOP;
    IF grew THEN
        PERFORM set_config('eventrelay.announced_scopes', announced, true);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION outbox_enqueue_webhooks() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions) THEN
        RETURN NULL;
    END IF;
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
    IF FOUND AND (SELECT wakeup FROM settings) = 'notify' THEN
        PERFORM pg_notify(notify_channel(), '{"k":"due"}');
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION outbox_announce_rows(
    ids uuid[], seqs bigint[],
    row_ids uuid[], scopes text[], chunks int[], heads text[], tails text[]
) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    channel text;
    mode text;
    announced text := coalesce(current_setting('eventrelay.announced_scopes', true), '');
    here text := current_schema();
BEGIN
    SELECT s.channel, s.wakeup INTO channel, mode FROM settings s;
    IF NOT FOUND THEN
        -- Raises the error that names the missing setting.
        channel := notify_channel();
    END IF;
    IF mode <> 'notify' THEN
        RETURN;
    END IF;
    PERFORM set_config('eventrelay.rows_announced', here, true);
    PERFORM pg_notify(channel, p.payload)
    FROM (
        SELECT r.chunk,
               outbox_carrying_pointer(
                   to_json(min(r.scope))::text, min(w.seq), pg_current_xact_id(),
                   string_agg(r.head || w.seq || r.tail, ',' ORDER BY w.seq)
               ) AS payload
        FROM unnest(ids, seqs) AS w(id, seq)
        JOIN unnest(row_ids, scopes, chunks, heads, tails) AS r(id, scope, chunk, head, tail)
          USING (id)
        WHERE announced = ''
           OR position(here || '/' || md5(r.scope) || ';' IN announced) = 0
        GROUP BY r.chunk
        ORDER BY r.chunk
    ) AS p;
END
$$;
