-- Webhooks: subscriptions, and deliveries written in the event's own
-- transaction. The deliveries table is also the dispatch queue.

CREATE TABLE webhook_subscriptions (
    id          text PRIMARY KEY
        CONSTRAINT webhook_subscriptions_id_valid CHECK (id ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    url         text NOT NULL
        CONSTRAINT webhook_subscriptions_url_valid CHECK (url ~ '^https?://'),
    -- The signing secret, and the one it replaced while a rotation's grace
    -- window lasts. Never copied into a delivery.
    secret      text NOT NULL CONSTRAINT webhook_subscriptions_secret_not_empty CHECK (secret <> ''),
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    -- Event type patterns: an exact type, `prefix.*`, or `*`.
    types       text[] NOT NULL DEFAULT '{*}'
        CONSTRAINT webhook_subscriptions_types_not_empty CHECK (cardinality(types) > 0),
    -- Only events of this scope, when set.
    scope_key   text,
    -- `config` subscriptions are kept in step with the service configuration.
    source      text NOT NULL DEFAULT 'api'
        CONSTRAINT webhook_subscriptions_source_valid CHECK (source IN ('config', 'api')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE webhook_deliveries (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- No foreign key: a delivery whose subscription vanished gives up.
    subscription_id   text        NOT NULL,
    event_seq         bigint      NOT NULL,
    event_id          uuid        NOT NULL,
    event_type        text        NOT NULL,
    scope_key         text        NOT NULL,
    -- The body to send: the envelope without its audience. Kept here so a
    -- delivery outlives the outbox row's retention.
    payload           jsonb       NOT NULL,
    -- pending: waiting for an attempt; delivered: a 2xx; dead: the retry
    -- schedule ran out; gone: 410, or the subscription no longer exists.
    status            text        NOT NULL DEFAULT 'pending'
        CONSTRAINT webhook_deliveries_status_valid CHECK (status IN ('pending', 'delivered', 'dead', 'gone')),
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    lease_expires_at  timestamptz,
    last_status       integer,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- Claiming due work.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
-- Listing the log.
CREATE INDEX webhook_deliveries_scope_idx ON webhook_deliveries (scope_key, id);
CREATE INDEX webhook_deliveries_status_idx ON webhook_deliveries (status, id);
CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);
CREATE INDEX webhook_deliveries_subscription_idx ON webhook_deliveries (subscription_id, id);
-- Pruning finished deliveries by age.
CREATE INDEX webhook_deliveries_finished_idx ON webhook_deliveries (updated_at) WHERE status <> 'pending';

CREATE TABLE webhook_attempts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id    bigint      NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt        integer     NOT NULL,
    started_at     timestamptz NOT NULL,
    duration_ms    integer     NOT NULL,
    status_code    integer,
    error          text,
    outcome        text        NOT NULL
);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id, attempt);

-- Whether a subscription's patterns take an event type.
CREATE FUNCTION webhook_type_matches(patterns text[], event_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM unnest(patterns) AS p
        WHERE p = '*'
           OR p = event_type
           OR (right(p, 2) = '.*' AND starts_with(event_type, left(p, -1)))
    )
$$;

-- Every durable event writes one delivery per matching subscription, in the
-- event's own transaction: a rolled-back write leaves neither.
CREATE FUNCTION outbox_enqueue_webhooks() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_deliveries (subscription_id, event_seq, event_id, event_type, scope_key, payload)
    SELECT s.id, NEW.seq, NEW.id, NEW.type, NEW.scope_key,
           jsonb_build_object(
               'id', NEW.id,
               'type', NEW.type,
               'scopeKey', NEW.scope_key,
               'lane', 'durable',
               'seq', NEW.seq,
               'data', NEW.data,
               'resources', to_jsonb(NEW.resources),
               'occurredAt', to_char(NEW.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
           )
    FROM webhook_subscriptions s
    WHERE (s.scope_key IS NULL OR s.scope_key = NEW.scope_key)
      AND webhook_type_matches(s.types, NEW.type);
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_enqueue_webhooks AFTER INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_enqueue_webhooks();
