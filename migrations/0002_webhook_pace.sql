-- A webhook subscription's pace: at most `max_per_second` attempts a
-- second to its receiver, whichever relays send them.
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
