//! JWT verification for the api listener (GitLab -> kas) and the internal listener (kas -> kas).
//!
//! HS256 only; issuer, audience and expiry are required and checked. `alg: none` and every other
//! algorithm are rejected. Each listener has its own verifier (its own secret, issuer and
//! audience), so a token valid on one listener is rejected on another.

use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::secret::Secret;
use crate::error::KasError;

/// Issuer and audience of tokens GitLab sends to kas.
pub const GITLAB_ISSUER: &str = "gitlab";
pub const KAS_AUDIENCE: &str = "gitlab-kas";
/// Issuer (and audience) of kas -> kas tokens.
pub const KAS_ISSUER: &str = "gitlab-kas";
/// Clock skew tolerated on `exp`/`nbf`: small, because tokens are short-lived.
const LEEWAY_SECS: u64 = 5;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    aud: String,
    exp: u64,
    iat: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
}

#[derive(Clone)]
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
    issuer: &'static str,
    audience: &'static str,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier").field("issuer", &self.issuer).field("audience", &self.audience).finish()
    }
}

impl JwtVerifier {
    pub fn new(secret: &Secret, issuer: &'static str, audience: &'static str) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        Self { key: DecodingKey::from_secret(secret.bytes()), validation, issuer, audience }
    }

    /// The api listener's verifier: tokens from GitLab.
    pub fn gitlab(secret: &Secret) -> Self {
        Self::new(secret, GITLAB_ISSUER, KAS_AUDIENCE)
    }

    /// The internal listener's verifier: tokens from other kas.
    pub fn internal(secret: &Secret) -> Self {
        Self::new(secret, KAS_ISSUER, KAS_AUDIENCE)
    }

    /// Verifies `Bearer <jwt>` from an `authorization` value.
    pub fn verify_authorization(&self, authorization: Option<&str>) -> Result<(), KasError> {
        let Some(raw) = authorization else {
            return Err(KasError::Unauthenticated("missing authorization: expected \"Bearer <JWT>\"".into()));
        };
        let token = kas_proto::metadata::bearer_token(Some(raw))
            .ok_or_else(|| KasError::Unauthenticated("malformed authorization: expected \"Bearer <JWT>\"".into()))?;
        self.verify(token)
    }

    pub fn verify(&self, token: &str) -> Result<(), KasError> {
        match jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation) {
            Ok(_) => Ok(()),
            Err(e) => Err(KasError::Unauthenticated(self.describe(e.kind()))),
        }
    }

    fn describe(&self, kind: &ErrorKind) -> String {
        let why = match kind {
            ErrorKind::ExpiredSignature => "token has expired".to_owned(),
            ErrorKind::ImmatureSignature => "token is not valid yet (nbf)".to_owned(),
            ErrorKind::InvalidIssuer => format!("wrong issuer, expected \"{}\"", self.issuer),
            ErrorKind::InvalidAudience => format!("wrong audience, expected \"{}\"", self.audience),
            ErrorKind::InvalidSignature => "invalid signature".to_owned(),
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName | ErrorKind::UnsupportedAlgorithm => {
                "algorithm not allowed, expected HS256".to_owned()
            }
            ErrorKind::MissingRequiredClaim(c) => format!("missing required claim \"{c}\""),
            ErrorKind::InvalidClaimFormat(c) => format!("invalid claim \"{c}\""),
            // A header with `alg: none` fails to parse as a known algorithm; it lands here.
            ErrorKind::Json(_) | ErrorKind::Base64(_) | ErrorKind::Utf8(_) | ErrorKind::InvalidToken => {
                "malformed token (only HS256-signed JWTs are accepted)".to_owned()
            }
            _ => "token rejected".to_owned(),
        };
        format!("invalid JWT: {why}")
    }
}

/// Mints an HS256 JWT (for GitLab-style callers, kas -> kas calls, tests and `kas mint-jwt`).
pub fn mint_jwt(secret: &Secret, issuer: &str, audience: &str, ttl: Duration) -> Result<String, KasError> {
    let now = jsonwebtoken::get_current_timestamp();
    let claims = Claims {
        iss: issuer.to_owned(),
        aud: audience.to_owned(),
        iat: now,
        exp: now + ttl.as_secs().max(1),
        nbf: None,
    };
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.bytes()))
        .map_err(|e| KasError::Internal(format!("signing JWT: {e}")))
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    fn claims(iss: &str, aud: &str, exp_offset: i64) -> Claims {
        let now = jsonwebtoken::get_current_timestamp();
        Claims { iss: iss.into(), aud: aud.into(), iat: now, exp: (now as i64 + exp_offset) as u64, nbf: None }
    }

    fn sign(secret: &Secret, c: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), c, &EncodingKey::from_secret(secret.bytes())).unwrap()
    }

    fn err(v: &JwtVerifier, token: &str) -> String {
        v.verify(token).unwrap_err().to_string()
    }

    #[test]
    fn accepts_valid_and_rejects_each_failure() {
        let secret = Secret::generate();
        let v = JwtVerifier::gitlab(&secret);
        v.verify(&mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(60)).unwrap()).unwrap();

        assert!(err(&v, &sign(&secret, &claims("evil", "gitlab-kas", 60))).contains("wrong issuer"));
        assert!(err(&v, &sign(&secret, &claims("gitlab", "other", 60))).contains("wrong audience"));
        assert!(err(&v, &sign(&secret, &claims("gitlab", "gitlab-kas", -600))).contains("expired"));
        assert!(err(&v, &sign(&Secret::generate(), &claims("gitlab", "gitlab-kas", 60))).contains("invalid signature"));
        assert!(err(&v, "garbage").contains("malformed"));

        // alg: none, unsigned.
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let body = b64.encode(serde_json::to_vec(&claims("gitlab", "gitlab-kas", 60)).unwrap());
        let none = format!("{header}.{body}.");
        assert!(v.verify(&none).is_err());

        // HS512 with the right secret is still not HS256.
        let hs512 = jsonwebtoken::encode(
            &Header::new(Algorithm::HS512),
            &claims("gitlab", "gitlab-kas", 60),
            &EncodingKey::from_secret(secret.bytes()),
        )
        .unwrap();
        assert!(err(&v, &hs512).contains("algorithm not allowed"));
    }

    #[test]
    fn listeners_do_not_accept_each_others_tokens() {
        let secret = Secret::generate();
        let gitlab = mint_jwt(&secret, GITLAB_ISSUER, KAS_AUDIENCE, Duration::from_secs(60)).unwrap();
        let kas = mint_jwt(&secret, KAS_ISSUER, KAS_AUDIENCE, Duration::from_secs(60)).unwrap();
        // Even with the same secret, issuers differ.
        assert!(JwtVerifier::internal(&secret).verify(&gitlab).is_err());
        assert!(JwtVerifier::gitlab(&secret).verify(&kas).is_err());
    }

    #[test]
    fn authorization_header_forms() {
        let v = JwtVerifier::gitlab(&Secret::generate());
        assert!(v.verify_authorization(None).unwrap_err().to_string().contains("missing authorization"));
        assert!(v.verify_authorization(Some("Basic x")).unwrap_err().to_string().contains("malformed authorization"));
    }
}
