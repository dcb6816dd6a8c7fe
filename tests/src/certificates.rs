//! Test certificates, made fresh for each use with rcgen: self-signed server certificates (each
//! its own CA), a private CA issuing leaf certificates, their PEM files in a directory, and
//! rustls acceptors serving them. The one place the harness and the scenarios make certificates.
#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

/// The names of a certificate for a server reached as `localhost` or `127.0.0.1`.
pub const LOCALHOST_AND_IP: &[&str] = &["localhost", "127.0.0.1"];

/// A certificate and its private key.
pub struct Certificate {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// The files [`Certificate::write`] wrote.
#[derive(Debug, Clone)]
pub struct CertificateFiles {
    pub certificate_file: PathBuf,
    pub key_file: PathBuf,
}

impl CertificateFiles {
    /// As kas's TLS configuration of a listener (or its GitLab client's).
    pub fn tls_config(&self) -> kas::config::TlsConfig {
        kas::config::TlsConfig { certificate_file: self.certificate_file.clone(), key_file: self.key_file.clone() }
    }
}

impl Certificate {
    /// A self-signed certificate (its own CA) for these DNS names and IP addresses.
    pub fn self_signed(names: &[&str]) -> Self {
        let names: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
        let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(names).unwrap();
        Self { cert, key: signing_key }
    }

    /// The certificate, PEM (for a self-signed one, also the CA a client must trust).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// The private key, PEM (PKCS#8).
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// Writes `<name>.crt` and `<name>.key` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> CertificateFiles {
        let files = CertificateFiles {
            certificate_file: dir.join(format!("{name}.crt")),
            key_file: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.certificate_file, self.pem()).unwrap();
        std::fs::write(&files.key_file, self.key_pem()).unwrap();
        files
    }

    /// A TLS acceptor serving this certificate, offering these ALPN protocols (none: HTTP/1.1).
    pub fn acceptor(&self, alpn: &[&[u8]]) -> tokio_rustls::TlsAcceptor {
        let key = PrivatePkcs8KeyDer::from(self.key.serialize_der());
        // The provider explicitly: the process-wide default may be unset (or ambiguous).
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![CertificateDer::clone(self.cert.der())], key.into())
                .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }
}

/// A self-signed certificate for `localhost`, written as `<name>.crt` and `<name>.key` into
/// `dir`: kas's TLS configuration for a listener (the certificate file is also the CA).
pub fn localhost_tls(dir: &Path, name: &str) -> kas::config::TlsConfig {
    Certificate::self_signed(&["localhost"]).write(dir, name).tls_config()
}

/// A private certificate authority that issues leaf certificates.
pub struct TestCa {
    cert: rcgen::Certificate,
    issuer: Issuer<'static, KeyPair>,
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    pub fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).unwrap();
        Self { cert, issuer: Issuer::new(params, key) }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA certificate to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.pem()).unwrap();
    }

    /// A certificate for these names signed by this CA, usable by servers and clients alike.
    pub fn issue(&self, names: &[&str]) -> Certificate {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>()).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Certificate { cert, key }
    }
}
