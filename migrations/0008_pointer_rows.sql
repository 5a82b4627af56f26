-- Pointers carry the rows they point at. A relay used to read every
-- pointer's rows back from the outbox: a pool checkout and a query per
-- commit and scope, on the path from commit to browser. Now, in notify
-- mode, the statement trigger puts the rows it announces into the pointer
-- itself, `{"k":"ptr","s":scope,"q":lowest seq,"x":txid,"r":[envelope, ...]}`,
-- split over as many pointers as keep each payload under NOTIFY's
-- 8000-byte limit. A relay hands those rows on as they are, as it does
-- with rows decoded in logical mode; a relay that predates the fields
-- ignores them and reads back, as before.
--
-- Each statement now announces its own rows, so a transaction that writes
-- a scope in several statements sends a pointer per statement. A row too
-- large to travel sends a bare pointer instead; after that the scope is
-- marked as announced for the rest of the transaction (the read that bare
-- pointer causes, after COMMIT, finds every row the transaction wrote
-- there), exactly as every pointer did before.

-- One outbox row as the envelope relays and webhooks see.
CREATE FUNCTION outbox_envelope(n outbox) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
               'id', n.id,
               'type', n.type,
               'scopeKey', n.scope_key,
               'lane', 'durable',
               'seq', n.seq,
               'data', n.data,
               'audience', n.audience,
               'resources', n.resources,
               'occurredAt', to_char(n.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
           )::text
$$;

-- STABLE, as `format` is: a function declared IMMUTABLE around a STABLE
-- body is not inlined, and a SQL function that is not inlined is parsed
-- and planned again on every call.
CREATE FUNCTION outbox_carrying_pointer(scope_json text, seq bigint, txid xid8, carried text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT format('{"k":"ptr","s":%s,"q":%s,"x":%s,"r":[%s]}', scope_json, seq, txid, carried)
$$;

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    -- Room for the pointer's own fields around the rows: the kind, `q`
    -- and `x` at their longest, and the brackets.
    overhead constant int := 80;
    max_payload constant int := 7999;
    channel text := notify_channel();
    announced text := coalesce(current_setting('eventrelay.announced_scopes', true), '');
    grew boolean := false;
    scope record;
    written record;
    scope_json text;
    key text;
    carried text;
    first_seq bigint;
    carried_txid xid8;
BEGIN
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
