//! TLS material from PEM files: listener identities (server certificate chain + key, optional
//! client CA) and CA bundles that clients trust. One place, so every file is read and checked
//! the same way and every error names the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tokio_rustls::TlsAcceptor;

/// PEM files of a listener's certificate chain and private key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub certificate_file: PathBuf,
    pub key_file: PathBuf,
}

/// ALPN of HTTP listeners that speak both HTTP/2 and HTTP/1.1.
pub const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// A listener's TLS for HTTP (HTTP/2 and HTTP/1.1 by ALPN).
pub fn tls_acceptor(tls: &TlsConfig) -> Result<TlsAcceptor, String> {
    server_tls(&tls.certificate_file, &tls.key_file, None, HTTP_ALPN)
}

/// rustls for a listener: its certificate chain and key, the ALPN protocols it offers, and when
/// `client_ca` is given, client certificates required and verified against that CA.
pub fn server_tls(
    certificate_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<TlsAcceptor, String> {
    let certs = read_certificates(certificate_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("cannot read the private key from {}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certificates(ca)? {
                roots.add(cert).map_err(|e| format!("{}: unusable CA certificate: {e}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not form a usable identity: {e}"))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The certificates of a PEM file: at least one, or an error naming the file.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    certificates_in(path, &pem)
}

/// The certificates of PEM bytes read from `path`: at least one, or an error naming the file.
fn certificates_in(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no usable PEM certificate", path.display()));
    }
    Ok(certs)
}

/// A CA bundle for a client to trust: the PEM file's bytes (read once), checked to hold at least
/// one certificate (a wrong or empty file fails at startup, not at the first connection).
pub fn read_ca_bundle(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    certificates_in(path, &pem)?;
    Ok(pem)
}
