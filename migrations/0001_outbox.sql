-- The transactional outbox and the SQL side of emitting.
--
-- Applied by `eventrelay migrate` (and at service start) with `search_path`
-- set to the configured schema (default `eventrelay`), so every name below is
-- created in that schema. Functions capture that search_path, so they keep
-- working whatever the caller's search_path is.

-- Settings the SQL side needs; one row, written by the migration runner.
CREATE TABLE settings (
    singleton boolean PRIMARY KEY DEFAULT true CONSTRAINT settings_single_row CHECK (singleton),
    channel   text NOT NULL CONSTRAINT settings_channel_not_empty CHECK (channel <> '')
);

-- One row per durable event. `seq` is the replay watermark; it is assigned at
-- INSERT and becomes visible at COMMIT, so readers must tolerate a lower seq
-- appearing after a higher one.
CREATE TABLE outbox (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id          uuid        NOT NULL CONSTRAINT outbox_id_unique UNIQUE,
    type        text        NOT NULL
        CONSTRAINT outbox_type_valid
        CHECK (type <> '' AND octet_length(type) <= 200 AND type !~ '[\x01-\x1f\x7f-\x9f]'),
    scope_key   text        NOT NULL
        CONSTRAINT outbox_scope_key_valid
        CHECK (scope_key <> '' AND octet_length(scope_key) <= 200 AND scope_key !~ '[\x01-\x1f\x7f-\x9f]'),
    lane        text        NOT NULL DEFAULT 'durable'
        CONSTRAINT outbox_lane_durable CHECK (lane = 'durable'),
    data        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- Only the keys `users` (an array of strings) and `permission` (opaque):
    -- an audience rule the relay does not understand must never be stored.
    audience    jsonb
        CONSTRAINT outbox_audience_valid
        CHECK (audience IS NULL OR (
            jsonb_typeof(audience) = 'object'
            AND audience - 'users' - 'permission' = '{}'::jsonb
            AND (NOT audience ? 'users' OR jsonb_typeof(audience -> 'users') IN ('array', 'null'))
            AND NOT jsonb_path_exists(audience, '$.users[*] ? (@.type() != "string")')
        )),
    resources   text[]      NOT NULL DEFAULT '{}',
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Reading a scope after a seq (live relay and replay).
CREATE INDEX outbox_scope_seq_idx ON outbox (scope_key, seq);
-- Pruning by age.
CREATE INDEX outbox_occurred_at_idx ON outbox (occurred_at);

-- The channel notifications go out on; fails loudly when it was never set.
CREATE FUNCTION notify_channel() RETURNS text
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    configured text;
BEGIN
    SELECT channel INTO configured FROM settings;
    IF configured IS NULL THEN
        RAISE EXCEPTION 'eventrelay: no notification channel is configured; run `eventrelay migrate`';
    END IF;
    RETURN configured;
END
$$;

-- Every committed outbox row wakes the relays with a pointer
-- {"k":"ptr","s":<scope key>,"q":<seq>}. NOTIFY is transactional: it is sent
-- at COMMIT and discarded on ROLLBACK, together with the row.
CREATE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify(
        notify_channel(),
        format('{"k":"ptr","s":%s,"q":%s}', to_json(NEW.scope_key)::text, NEW.seq)
    );
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_notify();

-- Emits a durable event in the caller's transaction and returns its seq:
--   SELECT eventrelay.emit('order.created', 'org-1', '{"orderId": 42}');
-- A rolled-back transaction leaves neither the row nor the notification.
CREATE FUNCTION emit(
    event_type  text,
    scope_key   text,
    data        jsonb       DEFAULT '{}'::jsonb,
    audience    jsonb       DEFAULT NULL,
    resources   text[]      DEFAULT '{}',
    id          uuid        DEFAULT NULL,
    occurred_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    INSERT INTO outbox (id, type, scope_key, data, audience, resources, occurred_at)
    VALUES (
        coalesce($6, gen_random_uuid()),
        $1,
        $2,
        coalesce($3, '{}'::jsonb),
        CASE WHEN $4 IS NULL OR $4 = 'null'::jsonb OR $4 = '{}'::jsonb THEN NULL ELSE $4 END,
        coalesce($5, '{}'),
        coalesce($7, clock_timestamp())
    )
    RETURNING seq
$$;

-- Sends an already encoded notification (an inline ephemeral event) on the
-- configured channel; delivered at COMMIT when called in a transaction.
CREATE FUNCTION notify_inline(payload text) RETURNS void
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    SELECT pg_notify(notify_channel(), $1)
$$;
