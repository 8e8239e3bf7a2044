//! pgtaskd's integration tests: one binary, a module per area, all against a real PostgreSQL
//! (see `support` for where it comes from). None is skipped without a database: they fail and
//! say how to get one.

mod support;

mod analyze;
mod bench;
mod bench_soak;
mod cancel;
mod cancel_rules;
mod chaos;
mod claim;
mod claim_bytes;
mod cli;
mod config_and_connection;
mod credentials;
mod database_defaults;
mod doc_links;
mod end_to_end;
mod enqueue_file;
mod failover;
mod faults;
mod finish;
mod handler_exec;
mod http;
mod http_limits;
mod http_parse_errors;
mod http_payload_budget;
mod idempotency;
mod idle_flags;
mod idle_notify;
mod intake;
mod leases;
mod list_and_stats;
mod locks;
mod log_pipe;
mod migrate;
mod notifications;
mod outages;
mod payload_limits;
mod queues;
mod retention;
mod retry;
mod roles;
mod schema_file;
mod shutdown;
mod signals;
mod systemd;
mod tls;
mod trigger_rights;
mod ui;
mod upgrades;
mod vacuum_health;
mod vacuum_health_roles;
mod wait;
mod worker;
