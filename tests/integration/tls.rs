//! TLS to PostgreSQL with libpq's sslmode meanings, against a throwaway cluster that serves a
//! certificate signed by a CA the test makes.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::support::daemon::{pgtaskd, tempfile_path::TempPath};
use crate::support::{enqueue, wait_count, Cluster, GatedAnalyzer, InProcessDaemon, TestDb};

struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
}

/// A CA, and a server certificate it signed for the name "localhost" only.
fn make_pki(common_name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server_params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    Pki {
        ca: ca_cert.pem(),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
    }
}

fn tls_cluster(pki: &Pki) -> Cluster {
    Cluster::start_with(
        &[
            ("ssl", "on"),
            ("ssl_cert_file", "server.crt"),
            ("ssl_key_file", "server.key"),
        ],
        &[
            ("server.crt", &pki.server_cert),
            ("server.key", &pki.server_key),
        ],
    )
}

/// `status` of a missing task through `url`: exit 3 proves the session was established.
async fn status_exit(url: &str) -> (Option<i32>, String) {
    let (status, _, stderr) = pgtaskd(Some(url), &["status", "424242"]).await;
    (status.code(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmodes_verify_the_server_as_libpq_does() {
    let pki = make_pki("pgtaskd test CA");
    let other = make_pki("some other CA");
    let cluster = tls_cluster(&pki);
    let db = TestDb::on(&cluster).await;
    let ca = TempPath::write(&pki.ca);
    let wrong_ca = TempPath::write(&other.ca);
    let base = |host: &str| {
        format!(
            "host={host} port={} user=postgres dbname={} connect_timeout=5",
            cluster.port, db.name
        )
    };
    let ca_path = ca.path().display().to_string();
    let wrong_path = wrong_ca.path().display().to_string();

    let cases = [
        (format!("{} sslmode=disable", base("localhost")), 3),
        (format!("{} sslmode=prefer", base("localhost")), 3),
        (format!("{} sslmode=require", base("127.0.0.1")), 3),
        (
            format!(
                "{} sslmode=verify-full sslrootcert={ca_path}",
                base("localhost")
            ),
            3,
        ),
        // The certificate names localhost, not 127.0.0.1: the chain is good, the name is not.
        (
            format!(
                "{} sslmode=verify-ca sslrootcert={ca_path}",
                base("127.0.0.1")
            ),
            3,
        ),
        (
            format!(
                "{} sslmode=verify-full sslrootcert={ca_path}",
                base("127.0.0.1")
            ),
            69,
        ),
        (
            format!(
                "{} sslmode=verify-ca sslrootcert={wrong_path}",
                base("localhost")
            ),
            69,
        ),
        (
            format!(
                "{} sslmode=require sslrootcert={wrong_path}",
                base("localhost")
            ),
            69,
        ),
        (
            format!(
                "postgres://postgres@localhost:{}/{}?sslmode=verify-full&sslrootcert={ca_path}",
                cluster.port, db.name
            ),
            3,
        ),
    ];
    for (url, want) in cases {
        let (code, stderr) = status_exit(&url).await;
        assert_eq!(code, Some(want), "{url}: {stderr}");
    }
    let (code, stderr) = status_exit(&format!(
        "{} sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
        base("localhost")
    ))
    .await;
    assert_eq!(
        code,
        Some(78),
        "an unreadable root file is a configuration error: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_fails_against_a_server_without_tls() {
    let cluster = Cluster::start();
    let db = TestDb::on(&cluster).await;
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} sslmode=require",
        cluster.port, db.name
    );
    let (code, stderr) = status_exit(&url).await;
    assert_eq!(code, Some(69), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_works_over_verify_full_and_every_session_is_encrypted() {
    let pki = make_pki("pgtaskd test CA");
    let cluster = tls_cluster(&pki);
    let db = TestDb::on(&cluster).await;
    let ca = TempPath::write(&pki.ca);
    let mut config = db.config("");
    config.database.url = Some(format!(
        "host=localhost port={} user=postgres dbname={} sslmode=verify-full sslrootcert={}",
        cluster.port,
        db.name,
        ca.path().display()
    ));
    let daemon = InProcessDaemon::start(&db, config, GatedAnalyzer::counting()).await;
    let client = db.client().await;
    for i in 0..20 {
        enqueue(&client, &format!("over tls {i}")).await;
    }
    wait_count(
        &client,
        "SELECT count(*) FROM pgtaskd.task_view WHERE status = 'SUCCEEDED'",
        20,
        "tasks over TLS",
    )
    .await;
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.datname = current_database() AND a.application_name LIKE 'pgtaskd/%'",
            &[],
        )
        .await
        .unwrap();
    let (encrypted, plain): (i64, i64) = (row.get(0), row.get(1));
    assert!(
        encrypted >= 2,
        "the listener and a worker session at least: {encrypted}"
    );
    assert_eq!(plain, 0);
    daemon.stop().await;
}
