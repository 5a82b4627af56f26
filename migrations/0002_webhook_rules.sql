-- Webhook subscriptions that keep to a pace and pause themselves when
-- their receiver stays down, and the relay's own events about them.


-- A subscription's pace: at most `max_per_second` attempts a second to its
-- receiver, whichever relays send them.
--
-- `paced_until` is the subscription's virtual schedule: the earliest time
-- its next attempt may start. Claiming a delivery moves it on by
-- 1/max_per_second from whichever is later, itself or now, in the same
-- statement as the claim, under the subscription row's lock; so claims
-- from every relay share one schedule, and an idle subscription builds up
-- no burst. Claims that race for the same slot both go (at most one per
-- claiming worker) and push the schedule on by one step each, so the rate
-- over any stretch longer than a few steps holds.
ALTER TABLE webhook_subscriptions
    ADD COLUMN max_per_second integer
        CONSTRAINT webhook_subscriptions_max_per_second_valid
        CHECK (max_per_second IS NULL OR max_per_second BETWEEN 1 AND 100000),
    ADD COLUMN paced_until timestamptz;


-- How a subscription's attempts are going, kept as each one settles: since
-- when every attempt has failed (NULL after a success), and how many have
-- failed since. A subscription failing for long enough, often enough, is
-- paused with the reason `failing` (an operator's pause has none).
ALTER TABLE webhook_subscriptions
    ADD COLUMN failing_since timestamptz,
    ADD COLUMN failures_since integer NOT NULL DEFAULT 0,
    ADD COLUMN paused_reason text
        CONSTRAINT webhook_subscriptions_paused_reason_valid
        CHECK (paused_reason IS NULL OR (paused_reason = 'failing' AND paused_at IS NOT NULL));


-- Events the relay writes itself, under the reserved `eventrelay.` prefix
-- that every other writer is refused: only a row marked `system` may carry
-- one, and only a type named here. emit(), emit_batch() and the publish API
-- never mark a row, and an emitting role cannot write the table otherwise;
-- the relay's role (which may write the outbox) marks its own.
ALTER TABLE outbox ADD COLUMN system boolean NOT NULL DEFAULT false;
ALTER TABLE outbox
    DROP CONSTRAINT outbox_type_not_reserved,
    ADD CONSTRAINT outbox_type_not_reserved
        CHECK (type NOT IN ('ready', 'open', 'error', 'reauth', 'revoked')
               AND (NOT starts_with(type, 'eventrelay.')
                    OR (system AND type IN ('eventrelay.subscription.paused'))))
        NOT VALID;


-- Ordered delivery, opt-in per subscription: `scope` orders each scope's
-- events, `resource` each event's first resource (its scope when it has
-- none). A key's deliveries go one at a time in seq order: a delivery is
-- claimed only when no pending delivery of its key has a lower seq (one
-- pending longer than `ordering_max_block_secs`, when set, no longer holds
-- the key back), and only once no transaction that could still commit a
-- lower seq of its key is running (`ordered_after`).
ALTER TABLE webhook_subscriptions
    ADD COLUMN ordering text NOT NULL DEFAULT 'none'
        CONSTRAINT webhook_subscriptions_ordering_valid
        CHECK (ordering IN ('none', 'scope', 'resource')),
    ADD COLUMN ordering_max_block_secs integer
        CONSTRAINT webhook_subscriptions_ordering_max_block_valid
        CHECK (ordering_max_block_secs IS NULL OR ordering_max_block_secs > 0);
ALTER TABLE webhook_deliveries
    -- The key an ordered subscription's delivery goes in order within;
    -- NULL for an unordered one, and for a redelivery, which is sent on
    -- its own, outside its key's order.
    ADD COLUMN ordering_key text,
    ADD COLUMN ordered_after xid8,
    -- Claimed while an older delivery of its key was still pending, past
    -- the subscription's ordering_max_block_secs.
    ADD COLUMN order_skipped boolean NOT NULL DEFAULT false;
-- Due deliveries are claimed oldest event first among those due together,
-- so each key's head comes before the rest of its key.
DROP INDEX webhook_deliveries_due_idx;
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at, event_seq)
    WHERE status = 'pending';
-- A key's pending deliveries by seq: is this one the key's head?
CREATE INDEX webhook_deliveries_ordering_idx
    ON webhook_deliveries (subscription_id, ordering_key, event_seq)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;

-- The seq order of a key holds only if a transaction takes its id before
-- its seq: then a transaction holding a lower seq than a delivery's event
-- already had its id when that delivery was written, below the delivery's
-- `ordered_after`. An INSERT takes the seq (the identity's default) before
-- the id (`txid`'s default), so the emitting functions take the id first.
-- The publish API's statement does the same; a plain INSERT into the
-- outbox keeps the order when its transaction wrote anything before it.
CREATE OR REPLACE FUNCTION emit(
    event_type  text,
    scope_key   text,
    data        jsonb       DEFAULT '{}'::jsonb,
    audience    jsonb       DEFAULT NULL,
    resources   text[]      DEFAULT '{}',
    id          uuid        DEFAULT NULL,
    occurred_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pg_current_xact_id();
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

CREATE OR REPLACE FUNCTION emit_batch(
    ids            uuid[],
    event_types    text[],
    scope_keys     text[],
    datas          jsonb[],
    audiences      jsonb[],
    resource_lists jsonb[],
    occurred_ats   timestamptz[]
) RETURNS TABLE (id uuid, seq bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pg_current_xact_id();
    INSERT INTO outbox AS o (id, type, scope_key, data, audience, resources, occurred_at)
    SELECT coalesce(e.id, gen_random_uuid()), e.type, e.scope_key, coalesce(e.data, '{}'::jsonb),
           CASE WHEN e.audience IS NULL OR e.audience = 'null'::jsonb OR e.audience = '{}'::jsonb
                THEN NULL ELSE e.audience END,
           ARRAY(SELECT jsonb_array_elements_text(coalesce(e.resources, '[]'::jsonb))),
           coalesce(e.occurred_at, clock_timestamp())
    FROM unnest($1, $2, $3, $4, $5, $6, $7)
         WITH ORDINALITY AS e(id, type, scope_key, data, audience, resources, occurred_at, n)
    ORDER BY e.n
    RETURNING o.id, o.seq
$$;

CREATE OR REPLACE FUNCTION outbox_enqueue_webhooks() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions) THEN
        RETURN NULL;
    END IF;
    -- An ordered subscription's delivery records its key, and the first
    -- transaction id not yet handed out now, after the rows were written:
    -- every transaction that took a lower seq held its id before (see
    -- above), so once none below this one is running, no lower seq of the
    -- key can still commit.
    INSERT INTO webhook_deliveries
        (subscription_id, event_seq, event_id, event_type, scope_key, payload,
         ordering_key, ordered_after)
    SELECT s.id, n.seq, n.id, n.type, n.scope_key, outbox_envelope(n)::jsonb - 'audience',
           CASE s.ordering
               WHEN 'scope' THEN 's:' || n.scope_key
               WHEN 'resource' THEN coalesce('r:' || n.resources[1], 's:' || n.scope_key)
           END,
           CASE WHEN s.ordering <> 'none' THEN pg_snapshot_xmax(pg_current_snapshot()) END
    FROM new_rows n
    JOIN webhook_subscriptions s
      ON (s.scope_key IS NULL OR s.scope_key = n.scope_key)
     AND webhook_type_matches(s.types, n.type)
    ORDER BY n.seq, s.id;
    -- Sealed, no two `due` payloads are equal, so Postgres does not fold a
    -- transaction's into one; the dispatcher folds the wake-ups instead.
    IF FOUND AND (SELECT wakeup FROM settings) = 'notify' THEN
        PERFORM pg_notify(notify_channel(), seal('P', '{"k":"due"}'));
    END IF;
    RETURN NULL;
END
$$;
