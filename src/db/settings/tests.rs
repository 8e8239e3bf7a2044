//! Unit tests of the connection settings (`mod.rs`).

use super::*;

#[test]
fn verify_full_in_the_string_requires_tls() {
    let database = DatabaseConfig {
        url_source: crate::config::UrlSource::File,
        url: Some("host=localhost user=u dbname=d sslmode=verify-full".into()),
        pool_size: 1,
        connect_timeout: Duration::from_secs(1),
        statement_timeout: Duration::ZERO,
        listen_url: None,
        pooler: crate::config::Pooler::None,
    };
    let settings = ConnectSettings::new(&database, "x").unwrap();
    assert_eq!(settings.ssl_mode(), SslMode::VerifyFull);
    assert_eq!(
        settings.config().get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );
}

#[test]
fn an_unknown_sslmode_is_an_error() {
    let database = DatabaseConfig {
        url_source: crate::config::UrlSource::File,
        url: Some("host=localhost sslmode=sometimes".into()),
        pool_size: 1,
        connect_timeout: Duration::from_secs(1),
        statement_timeout: Duration::ZERO,
        listen_url: None,
        pooler: crate::config::Pooler::None,
    };
    let err = ConnectSettings::new(&database, "x").unwrap_err();
    assert!(err.to_string().contains("sometimes"), "{err}");
}

#[test]
fn settings_carry_application_name_and_session_timeouts() {
    let database = DatabaseConfig {
        url_source: crate::config::UrlSource::File,
        url: Some("host=localhost user=u dbname=d".into()),
        pool_size: 3,
        connect_timeout: Duration::from_secs(2),
        statement_timeout: Duration::from_millis(1500),
        listen_url: None,
        pooler: crate::config::Pooler::None,
    };
    let settings = ConnectSettings::new(&database, "host:1:ab").unwrap();
    let config = settings.config();
    assert_eq!(config.get_application_name(), Some("pgtaskd/host:1:ab"));
    assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(2)));
    let options = config.get_options().unwrap();
    assert!(options.contains("-c statement_timeout=1500"), "{options}");
    assert!(options.contains("-c lock_timeout=1500"), "{options}");
    assert!(
        options.contains("-c idle_in_transaction_session_timeout=60000"),
        "{options}"
    );
    assert!(
        options.ends_with(
            "-c default_transaction_isolation=read\\ committed \
             -c default_transaction_read_only=off -c default_transaction_deferrable=off"
        ),
        "{options}"
    );
}

fn database(url: &str) -> DatabaseConfig {
    DatabaseConfig {
        url_source: crate::config::UrlSource::File,
        url: Some(url.into()),
        pool_size: 1,
        connect_timeout: Duration::from_secs(2),
        statement_timeout: Duration::ZERO,
        listen_url: None,
        pooler: crate::config::Pooler::None,
    }
}

#[test]
fn a_host_list_survives_with_its_ports_and_read_write() {
    use tokio_postgres::config::Host;
    for url in [
        "host=a.example,b.example port=5432,5433 user=u dbname=d \
         sslmode=disable target_session_attrs=read-write",
        "postgresql://u@a.example:5432,b.example:5433/d?sslmode=disable&target_session_attrs=read-write",
    ] {
        let settings = ConnectSettings::new(&database(url), "x").unwrap();
        let config = settings.config();
        assert_eq!(
            config.get_hosts(),
            &[Host::Tcp("a.example".into()), Host::Tcp("b.example".into())],
            "{url}"
        );
        assert_eq!(config.get_ports(), &[5432, 5433], "{url}");
        assert_eq!(
            config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        assert!(settings.requires_writes());
        assert_eq!(settings.ssl_mode(), SslMode::Disable);
        assert_eq!(
            settings.connect_deadline,
            Duration::from_secs(4),
            "the connect timeout holds for each host"
        );
    }
}

#[test]
fn target_session_attrs_is_any_unless_given() {
    let settings = ConnectSettings::new(&database("host=a.example,b.example user=u"), "x").unwrap();
    assert_eq!(
        settings.config().get_target_session_attrs(),
        TargetSessionAttrs::Any
    );
    assert!(!settings.requires_writes());
}

#[test]
fn a_target_session_attrs_the_daemon_cannot_use_is_refused_with_a_reason() {
    for value in ["standby", "read-only", "primary", "sometimes"] {
        let url = format!("host=a.example user=u target_session_attrs={value}");
        let err = ConnectSettings::new(&database(&url), "x").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(value) && text.contains("read-write"),
            "{text}"
        );
    }
}

#[test]
fn ports_that_do_not_match_the_hosts_are_refused() {
    let err = ConnectSettings::new(
        &database("host=a.example,b.example,c.example port=5432,5433 user=u"),
        "x",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "could not match 2 port numbers to 3 hosts: give one port for all, or one per host"
    );
    let one_port_for_all = database("host=a.example,b.example port=6543 user=u");
    assert!(ConnectSettings::new(&one_port_for_all, "x").is_ok());
}

#[test]
fn a_url_of_another_scheme_says_what_is_expected() {
    let err = ConnectSettings::new(&database("mysql://u@db/app"), "x").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("mysql://") && text.contains("postgresql://") && text.contains("key=value"),
        "{text}"
    );
    assert!(ConnectSettings::new(&database("postgresql://u@db/app"), "x").is_ok());
    assert!(ConnectSettings::new(&database("host=db application_name=a://b"), "x").is_ok());
}

#[test]
fn a_bad_connection_string_is_an_error() {
    let database = DatabaseConfig {
        url_source: crate::config::UrlSource::File,
        url: Some("postgres://[broken".into()),
        pool_size: 1,
        connect_timeout: Duration::from_secs(1),
        statement_timeout: Duration::ZERO,
        listen_url: None,
        pooler: crate::config::Pooler::None,
    };
    assert!(ConnectSettings::new(&database, "x").is_err());
}

#[test]
fn a_bad_listen_url_is_named_as_such() {
    let database = DatabaseConfig {
        url_source: crate::config::UrlSource::File,
        url: Some("host=localhost dbname=d".into()),
        pool_size: 1,
        connect_timeout: Duration::from_secs(1),
        statement_timeout: Duration::ZERO,
        listen_url: Some("host=localhost port=abc".into()),
        pooler: crate::config::Pooler::None,
    };
    assert!(ConnectSettings::new(&database, "x").is_ok());
    let err = ConnectSettings::listen(&database, "x").unwrap_err();
    assert_eq!(err.to_string(), "database.listen_url");
    let chain = crate::error_chain(&err);
    assert!(
        chain.starts_with("database.listen_url: invalid database connection string"),
        "{chain}"
    );
}
