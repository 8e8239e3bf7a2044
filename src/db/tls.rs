//! TLS to PostgreSQL with libpq's `sslmode` meanings, over rustls.
//!
//! tokio-postgres knows only `disable`, `prefer` and `require`, and no root certificate
//! option; this module takes `sslmode` and `sslrootcert` out of the connection string (or
//! `PGSSLMODE` / `PGSSLROOTCERT`) and builds the connector that honours them:
//!
//! | sslmode | TLS | the server's certificate |
//! | --- | --- | --- |
//! | `disable` | never | - |
//! | `allow`, `prefer` (default) | when the server offers it | not checked |
//! | `require` | always | not checked, unless `sslrootcert` is given: then as `verify-ca` |
//! | `verify-ca` | always | signed by a trusted root |
//! | `verify-full` | always | signed by a trusted root and issued for the host name |
//!
//! Trusted roots: the PEM file `sslrootcert`, else `~/.postgresql/root.crt` when it exists,
//! else the system's store (libpq would refuse without a root file; managed services sign
//! with public CAs, so the system store is the useful default).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's six `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// Parse a libpq `sslmode` value.
    pub fn parse(text: &str) -> Option<SslMode> {
        Some(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// What tokio-postgres is told: whether TLS is tried, and whether it is required.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Allow | SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        }
    }
}

/// A TLS setting that cannot be used (exit 78).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "invalid sslmode {0:?} (use disable, allow, prefer, require, verify-ca or verify-full)"
    )]
    SslMode(String),
    #[error("cannot read the root certificate file {path}")]
    RootCert {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("the root certificate file {0} holds no usable certificate")]
    NoRootCert(PathBuf),
    #[error("invalid TLS configuration")]
    Rustls(#[source] rustls::Error),
}

/// The TLS options found in a connection string, and the string without them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub rest: String,
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
}

/// Take `sslmode` and `sslrootcert` out of a URL or key=value connection string. A string
/// this cannot read is returned whole, for tokio-postgres to report its error.
pub fn split(conninfo: &str) -> Split {
    let whole = || Split {
        rest: conninfo.to_string(),
        sslmode: None,
        sslrootcert: None,
    };
    let pairs = if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        return split_url(conninfo).unwrap_or_else(whole);
    } else {
        match keyword_pairs(conninfo) {
            Some(pairs) => pairs,
            None => return whole(),
        }
    };
    let mut split = Split {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let mut kept = Vec::new();
    for (key, value) in pairs {
        match key.as_str() {
            "sslmode" => split.sslmode = Some(value),
            "sslrootcert" => split.sslrootcert = Some(value),
            _ => kept.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            )),
        }
    }
    split.rest = kept.join(" ");
    split
}

fn split_url(url: &str) -> Option<Split> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    let mut split = Split {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => split.sslmode = Some(percent_decode(value)?),
            "sslrootcert" => split.sslrootcert = Some(percent_decode(value)?),
            _ => kept.push(pair),
        }
    }
    split.rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Some(split)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The `key = value` pairs of a libpq keyword string (values may be single-quoted, with
/// backslash escapes).
fn keyword_pairs(text: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Some(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        chars.next_if_eq(&'=')?;
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next()? {
                    '\\' => value.push(chars.next()?),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.push(chars.next()?);
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// The connector for `mode`, trusting `root_cert` (a PEM file) when given.
///
/// # Errors
///
/// An unreadable or empty root certificate file.
pub fn connector(mode: SslMode, root_cert: Option<&Path>) -> Result<MakeRustlsConnect, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?;
    let default_root = home_root_cert();
    let root_file = root_cert.map(Path::to_path_buf).or(default_root);
    let verify_chain = match mode {
        SslMode::VerifyCa | SslMode::VerifyFull => true,
        SslMode::Require => root_cert.is_some(),
        SslMode::Disable | SslMode::Allow | SslMode::Prefer => false,
    };
    let config = if verify_chain {
        let roots = Arc::new(root_store(root_file.as_deref())?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|err| TlsError::Rustls(rustls::Error::General(err.to_string())))?;
        let verifier: Arc<dyn ServerCertVerifier> = if mode == SslMode::VerifyFull {
            webpki
        } else {
            Arc::new(ChainOnly(webpki))
        };
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    };
    Ok(MakeRustlsConnect::new(config))
}

fn home_root_cert() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("HOME")?).join(".postgresql/root.crt");
    path.exists().then_some(path)
}

fn root_store(file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
                .map_err(|source| TlsError::RootCert {
                    path: path.to_path_buf(),
                    source,
                })?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsError::NoRootCert(path.to_path_buf()));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for err in &native.errors {
                tracing::warn!(error = %err, "cannot load a system root certificate");
            }
            store.add_parsable_certificates(native.certs);
        }
    }
    Ok(store)
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root: encrypted, the server's identity unchecked (as
/// libpq does). The handshake's signatures are still verified.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_a_url() {
        let found = split("postgres://u:p@db.example:5433/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(
            found.rest,
            "postgres://u:p@db.example:5433/app?application_name=x"
        );
        assert_eq!(found.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(found.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        let plain = split("postgresql://localhost/app");
        assert_eq!(plain.rest, "postgresql://localhost/app");
        assert_eq!(plain.sslmode, None);
    }

    #[test]
    fn tls_options_are_taken_out_of_a_keyword_string() {
        let found =
            split("host=db user='it''s' sslmode = verify-ca  sslrootcert='/my ca.pem' dbname=app");
        assert_eq!(
            found.sslmode, None,
            "a doubled quote is not libpq syntax: the string is left whole"
        );
        let found = split(
            "host=db user='o\\'brien' sslmode = verify-ca  sslrootcert='/my ca.pem' dbname=app",
        );
        assert_eq!(found.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(found.sslrootcert.as_deref(), Some("/my ca.pem"));
        assert_eq!(found.rest, "host='db' user='o\\'brien' dbname='app'");
        let config: tokio_postgres::Config = found.rest.parse().unwrap();
        assert_eq!(config.get_user(), Some("o'brien"));
    }

    #[test]
    fn every_libpq_sslmode_parses_and_maps_to_a_negotiation() {
        use tokio_postgres::config::SslMode as Negotiation;
        for (text, negotiation) in [
            ("disable", Negotiation::Disable),
            ("allow", Negotiation::Prefer),
            ("prefer", Negotiation::Prefer),
            ("require", Negotiation::Require),
            ("verify-ca", Negotiation::Require),
            ("verify-full", Negotiation::Require),
        ] {
            assert_eq!(
                SslMode::parse(text).unwrap().negotiation(),
                negotiation,
                "{text}"
            );
        }
        assert_eq!(SslMode::parse("verify_full"), None);
    }

    #[test]
    fn a_missing_root_certificate_file_is_an_error() {
        let Err(err) = connector(SslMode::VerifyFull, Some(Path::new("/nonexistent/ca.pem")))
        else {
            panic!("a missing root file was accepted");
        };
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }
}
