-- Writers that already hold the envelopes announce their rows themselves.
-- The outbox trigger builds each row's envelope in SQL (a JSON object of
-- nine fields and a formatted timestamp per row), about a third of what an
-- INSERT of a few dozen rows costs the database. The publish API and the
-- publisher crate's batch emit built those envelopes already, before
-- writing; all they lack is the seq the INSERT assigns. So their INSERT is
-- wrapped in a statement that hands each row's envelope over in two parts,
-- around its seq, and outbox_announce_rows joins the parts to the seqs and
-- sends the same carrying pointers the trigger would, in the same order,
-- under the same size limit.
--
-- The function marks the transaction for this schema; the trigger, which
-- fires when the statement ends, sees the mark, clears it and sends
-- nothing. Any other statement is announced by the trigger as before.

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
    -- The statement announced its rows itself (see outbox_announce_rows):
    -- nothing left to send. The mark is spent here, so the transaction's
    -- next statement is announced by this trigger again.
    IF current_setting('eventrelay.rows_announced', true) = TG_TABLE_SCHEMA THEN
        PERFORM set_config('eventrelay.rows_announced', '', true);
        RETURN NULL;
    END IF;
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


-- Sends the carrying pointers for rows a statement wrote and whose
-- envelopes it built itself: `ids`/`seqs` are what the INSERT returned;
-- for each row (by id) the caller gives its scope, the pointer it goes in
-- (`chunks`, numbered in order of the pointers' lowest seqs, each small
-- enough for a notification), and its envelope's text before and after
-- the seq. Scopes this transaction already announced with a bare pointer
-- are skipped, as the trigger skips them. In the logical wake-up mode
-- nothing is sent and the trigger is left alone (it is disabled there).
CREATE FUNCTION outbox_announce_rows(
    ids uuid[], seqs bigint[],
    row_ids uuid[], scopes text[], chunks int[], heads text[], tails text[]
) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    channel text := notify_channel();
    announced text := coalesce(current_setting('eventrelay.announced_scopes', true), '');
    here text := current_schema();
BEGIN
    IF (SELECT wakeup FROM settings) <> 'notify' THEN
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
