//! TLS to PostgreSQL with libpq's `sslmode` meanings, over rustls.
//!
//! tokio-postgres knows only `disable`, `prefer` and `require`, and no root certificate
//! option; this module builds the rustls connector that honours what
//! [`super::settings`] found for `sslmode` and `sslrootcert`:
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
