//! Which failures to open a session are the settings' fault, not an outage: the server's
//! refusal of the role, the password, the database or a startup setting, and the client's
//! own refusal to go on, each with what to check ([`DbError::Rejected`], exit 78). Every
//! other failure the server answered with is an outage, waited out.

use tokio_postgres::error::SqlState;

use super::{Cause, DbError};

/// What to check when the password was refused or missing. pgtaskd takes the password from
/// the connection string or `PGPASSWORD` only.
pub(super) const PASSWORD_ADVICE: &str =
    "check the user and password; pgtaskd does not read ~/.pgpass: \
    give the password in PGPASSWORD or in the connection string \
    (database.url or PGTASKD_DATABASE_URL)";
/// What to check when the role cannot connect (it does not exist, or `pg_hba.conf` has no
/// entry for it or rejects it).
const ROLE_ADVICE: &str = "check the user name (user= in the connection string, or PGUSER) \
    and that the server's pg_hba.conf lets it connect";
/// What to check when the database does not exist.
const DATABASE_ADVICE: &str = "check the database name (dbname= in the connection string, \
    or PGDATABASE), or create the database";
/// What to check when the client cannot authenticate the way the server asks.
const AUTH_METHOD_ADVICE: &str = "check the authentication method in the server's \
    pg_hba.conf and channel_binding in the connection string";
/// What to do when a connection pooler refused the startup options pgtaskd sends.
const POOLER_ADVICE: &str = "the connection leads to a connection pooler such as PgBouncer, \
    which refuses startup options: behind a pooler in transaction mode set \
    database.pooler = \"transaction\" (pgtaskd then sends none on database.url's sessions), and \
    point database.listen_url at PostgreSQL itself (docs/operations.md, \"Behind PgBouncer\")";
/// What to check when the connection settings contradict themselves.
const SETTINGS_ADVICE: &str = "check the connection string";

/// The refusal `err` is, when it is one: the server's invalid_password (28P01),
/// invalid_authorization_specification (28000: no such role, no `pg_hba.conf` entry) or
/// invalid_catalog_name (3D000: no such database), or the client's own refusal to go on
/// (a password the server asks for and that was not given, an authentication method it
/// cannot use). tokio-postgres tells its error kinds apart only by their fixed `Display`
/// label ("invalid configuration", "authentication error"): no SQLSTATE exists for them.
pub(super) fn rejection(err: &tokio_postgres::Error) -> Option<DbError> {
    if refused_startup_options(err) {
        return Some(DbError::Rejected {
            cause: Cause::from(err),
            advice: POOLER_ADVICE,
        });
    }
    let advice = match err.code() {
        Some(code) if *code == SqlState::INVALID_PASSWORD => PASSWORD_ADVICE,
        Some(code) if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => ROLE_ADVICE,
        Some(code) if *code == SqlState::INVALID_CATALOG_NAME => DATABASE_ADVICE,
        Some(_) => return None,
        None => {
            let (cause, advice) = match err.to_string().as_str() {
                "invalid configuration" => {
                    let missing_password = std::error::Error::source(err)
                        .is_some_and(|source| source.to_string() == "password missing");
                    if missing_password {
                        let cause =
                            Cause::message("the server asked for a password, and none was given");
                        (cause, PASSWORD_ADVICE)
                    } else {
                        (Cause::from(err), SETTINGS_ADVICE)
                    }
                }
                "authentication error" => (Cause::from(err), AUTH_METHOD_ADVICE),
                _ => return None,
            };
            return Some(DbError::Rejected { cause, advice });
        }
    };
    Some(DbError::Rejected {
        cause: Cause::from(err),
        advice,
    })
}

/// Whether a pooler refused the session for its startup options: PgBouncer answers
/// `unsupported startup parameter: options` (protocol_violation, 08P01) to a parameter its
/// `ignore_startup_parameters` does not list.
fn refused_startup_options(err: &tokio_postgres::Error) -> bool {
    err.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::PROTOCOL_VIOLATION
            && db.message().starts_with("unsupported startup parameter")
    })
}

/// Whether the database refused these settings because they lead to a pooler (the
/// startup options refused): the LISTEN session's check says so in its own words.
pub(crate) fn is_pooler_refusal(err: &DbError) -> bool {
    matches!(err, DbError::Rejected { advice, .. } if *advice == POOLER_ADVICE)
}

/// What to check when the server refused a setting sent at the session's start.
const OPTIONS_ADVICE: &str = "check the settings the connection string sends at the \
    session's start (options=-c name=value in database.url, or PGOPTIONS): the server \
    refused one";

/// A session that could not be opened, when the server answered: a rejection of the settings
/// ([`DbError::Rejected`]): the role, password or database, or a startup setting the server
/// does not know (undefined_object, 42704: `options=-c bogus=1`) or whose value it refuses
/// (invalid_parameter_value, 22023); else an outage whatever its SQLSTATE (a database not
/// accepting connections, a revoked `CONNECT`, a server starting up). `None` when no server
/// answered.
pub(super) fn refused(err: &tokio_postgres::Error) -> Option<DbError> {
    let bad_option = err.code().is_some_and(|code| {
        *code == SqlState::UNDEFINED_OBJECT || *code == SqlState::INVALID_PARAMETER_VALUE
    });
    if bad_option {
        return Some(DbError::Rejected {
            cause: Cause::from(err),
            advice: OPTIONS_ADVICE,
        });
    }
    rejection(err).or_else(|| {
        err.code()
            .is_some()
            .then(|| DbError::Unavailable(Cause::from(err)))
    })
}
