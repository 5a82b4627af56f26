//! The database roles eventrelay expects, as the SQL that grants them
//! (`eventrelay migrate --print-grants`).
//!
//! Three roles: the schema's owner, which runs the migrations and owns the
//! SECURITY DEFINER functions; the relay's role, which reads the outbox and
//! the notification key, writes the publish API's events and runs
//! webhooks; and the emitter role, granted to applications, which may only
//! call the emit functions. The migrations grant nothing to PUBLIC, so a
//! role that is none of these can read nothing, and learns nothing from
//! the channel either: its notifications are sealed.

use eventrelay_publisher::Identifier;

/// The two roles the grants name; the owner is whoever runs them.
#[derive(Debug, Clone)]
pub struct RoleNames {
    pub relay: Identifier,
    pub emitter: Identifier,
}

/// The SQL that creates the relay and emitter roles (as NOLOGIN group
/// roles, when missing) and grants them what they need in `schema`. Run it
/// as the schema's owner after `eventrelay migrate`; grant the roles to
/// the login roles that use them.
pub fn grants_sql(schema: &Identifier, roles: &RoleNames) -> String {
    let RoleNames { relay, emitter } = roles;
    let create = |role: &Identifier| {
        format!(
            "DO $create$ BEGIN CREATE ROLE {role} NOLOGIN; \
             EXCEPTION WHEN duplicate_object THEN NULL; END $create$;"
        )
    };
    let relay_role = create(relay);
    let emitter_role = create(emitter);
    format!(
        "-- eventrelay's database roles for schema {schema}. Run as the schema's owner
-- (the role `eventrelay migrate` runs as), after migrating. Then grant each
-- role to the login roles that use it, for example
--   GRANT {relay} TO relay_login;   GRANT {emitter} TO app_login;
-- In the logical wake-up mode the relay's login role also needs the
-- REPLICATION attribute (ALTER ROLE relay_login REPLICATION), which is not
-- inherited through a grant.

-- The relay: reads the outbox and the notification key, writes the publish
-- API's events and prunes old ones, runs webhooks. Whoever holds it can
-- read every event and send notifications relays trust.
{relay_role}
GRANT USAGE ON SCHEMA {schema} TO {relay};
GRANT SELECT ON {schema}.schema_migrations, {schema}.settings, {schema}.notify_key TO {relay};
GRANT UPDATE (pruned_through, pruned_txid) ON {schema}.settings TO {relay};
GRANT SELECT, INSERT, DELETE ON {schema}.outbox TO {relay};
GRANT SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {relay};
GRANT SELECT, INSERT, UPDATE, DELETE
    ON {schema}.webhook_subscriptions, {schema}.webhook_deliveries, {schema}.webhook_attempts
    TO {relay};
GRANT SELECT, INSERT, DELETE ON {schema}.subscriber_disconnections TO {relay};
GRANT SELECT, UPDATE (code_hash, token_hash), DELETE ON {schema}.portal_sessions TO {relay};
GRANT SELECT, INSERT, UPDATE, DELETE
    ON {schema}.presence_relays, {schema}.presence_members
    TO {relay};
GRANT USAGE ON SEQUENCE {schema}.presence_version TO {relay};
GRANT EXECUTE ON FUNCTION
    {schema}.outbox_announce_rows(uuid[], bigint[], uuid[], text[], integer[], text[], text[]),
    {schema}.notify_inline(text),
    {schema}.emit(text, text, jsonb, jsonb, text[], uuid, timestamptz, text),
    {schema}.emit_batch(uuid[], text[], text[], jsonb[], jsonb[], jsonb[], timestamptz[], text[]),
    {schema}.portal_session(text, integer, jsonb)
    TO {relay};

-- Emitters: applications that emit events in their own transactions. They
-- may call the emit functions (which run as the owner), and mint portal
-- sessions for their customers, and nothing else: no
-- table, no webhook secret, no notification key.
{emitter_role}
GRANT USAGE ON SCHEMA {schema} TO {emitter};
GRANT EXECUTE ON FUNCTION
    {schema}.emit(text, text, jsonb, jsonb, text[], uuid, timestamptz, text),
    {schema}.emit_batch(uuid[], text[], text[], jsonb[], jsonb[], jsonb[], timestamptz[], text[]),
    {schema}.notify_inline(text),
    {schema}.portal_session(text, integer, jsonb)
    TO {emitter};
"
    )
}
