//! Secrets are read from files and kept in a type whose `Debug` never shows them.

use std::path::Path;

use base64::Engine;

/// The decoded length of GitLab/kas shared secrets (as GitLab generates them).
pub const SECRET_LEN: usize = 32;

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read secret file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("secret file {path} must contain base64 text: {source}")]
    Base64 { path: String, source: base64::DecodeError },
    #[error("secret file {path} must decode to {SECRET_LEN} bytes, it decodes to {len}")]
    Length { path: String, len: usize },
}

impl Secret {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// A new random secret.
    pub fn generate() -> Self {
        Self((0..SECRET_LEN).map(|_| rand::random::<u8>()).collect())
    }

    /// The file form: base64 text with a trailing newline.
    pub fn to_file_text(&self) -> String {
        format!("{}\n", base64::engine::general_purpose::STANDARD.encode(&self.0))
    }

    /// Reads a base64 secret file (surrounding whitespace ignored) that decodes to 32 bytes.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read { path: p.clone(), source })?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|source| SecretError::Base64 { path: p.clone(), source })?;
        if bytes.len() != SECRET_LEN {
            return Err(SecretError::Length { path: p, len: bytes.len() });
        }
        Ok(Self(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_masks() {
        assert_eq!(format!("{:?}", Secret::generate()), "Secret(***)");
    }

    #[test]
    fn file_round_trip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let s = Secret::generate();
        std::fs::write(&p, s.to_file_text()).unwrap();
        assert_eq!(Secret::from_file(&p).unwrap(), s);

        std::fs::write(&p, "not base64!").unwrap();
        assert!(Secret::from_file(&p).unwrap_err().to_string().contains("base64"));
        std::fs::write(&p, "YWJj").unwrap();
        assert!(Secret::from_file(&p).unwrap_err().to_string().contains("must decode to 32 bytes, it decodes to 3"));
        assert!(Secret::from_file(&dir.path().join("missing")).unwrap_err().to_string().contains("cannot read"));
    }
}
