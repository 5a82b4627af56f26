//! Postgres as the relay meets it: migrations, database roles and the sealed channel, outbox reads, TLS, poolers, dead connections, prepared statements, the embedded database.

mod dead_connections;
mod embedded;
mod migrations;
mod outbox_reads;
mod pointer_plans;
mod pooler;
mod prepared_statements;
mod roles;
mod tls;
