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
