//! JWT verification for the api listener (GitLab -> kas) and the internal listener (kas -> kas).
//!
//! HS256 only; issuer, audience and expiry are required and checked. `alg: none` and every other
//! algorithm are rejected. Each listener has its own verifier (its own secret, issuer and
//! audience), so a token valid on one listener is rejected on another.
//!
//! `aud` may be a string or an array containing our audience (RFC 7519 §4.1.3). Tokens must be
//! short-lived: `iat` may not be more than [`LEEWAY_SECS`] ahead of this kas's clock, and the
//! lifetime (`exp - iat`, or `exp - now` without `iat`) may not exceed the configured maximum
//! ([`DEFAULT_JWT_MAX_LIFETIME`]), so a leaked token (or one minted with a far `exp`) stops
//! working soon. Refusals are counted (`kas_auth_failures_total`) and logged, rate-limited.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::failures::FailureLog;
use super::secret::Secret;
use crate::error::KasError;

/// Issuer and audience of tokens GitLab sends to kas.
pub const GITLAB_ISSUER: &str = "gitlab";
pub const KAS_AUDIENCE: &str = "gitlab-kas";
/// Issuer (and audience) of kas -> kas tokens.
pub const KAS_ISSUER: &str = "gitlab-kas";
/// Clock skew tolerated on `exp`/`nbf`/`iat`: small, because tokens are short-lived.
pub const LEEWAY_SECS: u64 = 5;
/// Longest accepted JWT lifetime. GitLab mints 1-minute tokens for kas and kas -> kas tokens live
/// 60 s; an hour also admits `kas mint-jwt` tokens (1 h by default) used by hand with kubectl,
/// while a leaked or far-`exp` token stops working within the hour.
pub const DEFAULT_JWT_MAX_LIFETIME: Duration = Duration::from_secs(3600);
/// The maximum may not be set below the lifetime of the tokens GitLab and kas mint.
pub const MIN_JWT_MAX_LIFETIME: Duration = Duration::from_secs(60);

/// `aud`: one audience or several (RFC 7519 §4.1.3).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    aud: Audience,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
}

#[derive(Clone)]
pub struct JwtVerifier {
    // Shared: the verifier is cloned into every request's handler state.
    key: Arc<DecodingKey>,
    validation: Arc<Validation>,
    issuer: &'static str,
    audience: &'static str,
    max_lifetime: Duration,
    failures: Arc<FailureLog>,
    verified: Arc<VerifiedTokens>,
}

/// Tokens this verifier accepted, until they expire: a caller sends the same JWT with every
/// request for its lifetime, and decoding and checking it again was ~7 % of kas's CPU per
/// proxied request (issue 14). Keyed by the token's SHA-256 (the map holds no token, and a
/// lookup compares digests, not token bytes); only accepted tokens are kept, each until its
/// `exp` (plus the leeway), as the full check would accept it until then. Bounded: when full,
/// expired entries go, and if none did, all of them.
#[derive(Default)]
struct VerifiedTokens {
    valid_until: std::sync::Mutex<foldhash::HashMap<[u8; 32], u64>>,
}

/// Accepted tokens kept per verifier.
const VERIFIED_TOKENS_MAX: usize = 4096;

impl VerifiedTokens {
    fn digest(token: &str) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::digest(token.as_bytes()).into()
    }

    fn is_verified(&self, digest: &[u8; 32], now: u64) -> bool {
        let map = self.valid_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(digest).is_some_and(|until| now <= *until)
    }

    fn insert(&self, digest: [u8; 32], until: u64, now: u64) {
        let mut map = self.valid_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= VERIFIED_TOKENS_MAX {
            map.retain(|_, until| now <= *until);
            if map.len() >= VERIFIED_TOKENS_MAX {
                map.clear();
            }
        }
        map.insert(digest, until);
    }
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
        Self {
            key: Arc::new(DecodingKey::from_secret(secret.bytes())),
            validation: Arc::new(validation),
            issuer,
            audience,
            max_lifetime: DEFAULT_JWT_MAX_LIFETIME,
            failures: Arc::new(FailureLog::new("jwt")),
            verified: Arc::default(),
        }
    }

    /// Tokens living longer than this are refused (`auth.jwt_max_lifetime`).
    #[must_use]
    pub fn with_max_lifetime(mut self, max_lifetime: Duration) -> Self {
        self.max_lifetime = max_lifetime;
        // What was accepted under the old maximum is checked again.
        self.verified = Arc::default();
        self
    }

    /// Names the listener in the refusal metric and log (`api`, `rest`, `internal`).
    #[must_use]
    pub fn for_listener(mut self, listener: &'static str) -> Self {
        self.failures = Arc::new(FailureLog::new(listener));
        self
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
        self.verify_authorization_from(None, authorization)
    }

    /// [`Self::verify_authorization`], naming the caller's address in the refusal log.
    pub fn verify_authorization_from(&self, peer: Option<IpAddr>, authorization: Option<&str>) -> Result<(), KasError> {
        let Some(raw) = authorization else {
            let message = "missing authorization: expected \"Bearer <JWT>\"".into();
            return Err(self.refused(peer, "missing_token", message));
        };
        let Some(token) = kas_proto::metadata::bearer_token(Some(raw)) else {
            let message = "malformed authorization: expected \"Bearer <JWT>\"".into();
            return Err(self.refused(peer, "malformed", message));
        };
        self.verify_from(peer, token)
    }

    pub fn verify(&self, token: &str) -> Result<(), KasError> {
        self.verify_from(None, token)
    }

    fn verify_from(&self, peer: Option<IpAddr>, token: &str) -> Result<(), KasError> {
        let now = jsonwebtoken::get_current_timestamp();
        let digest = VerifiedTokens::digest(token);
        if self.verified.is_verified(&digest, now) {
            return Ok(());
        }
        let claims = match jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation) {
            Ok(data) => data.claims,
            Err(e) => {
                let (reason, why) = self.describe(e.kind());
                return Err(self.refused(peer, reason, why));
            }
        };
        self.check_lifetime(&claims, now)
            .map_err(|(reason, why)| self.refused(peer, reason, format!("invalid JWT: {why}")))?;
        // Accepted until `exp` plus the leeway, as `decode` would accept it.
        self.verified.insert(digest, claims.exp.saturating_add(self.validation.leeway), now);
        Ok(())
    }

    /// `iat` not in the future (beyond the skew) and a lifetime within the maximum.
    fn check_lifetime(&self, claims: &Claims, now: u64) -> Result<(), (&'static str, String)> {
        let max = self.max_lifetime.as_secs();
        if let Some(iat) = claims.iat
            && iat > now.saturating_add(LEEWAY_SECS)
        {
            return Err((
                "iat_in_future",
                format!(
                    "token issued in the future (iat is {}s ahead of this kas's clock; at most {LEEWAY_SECS}s of \
                         clock skew is tolerated)",
                    iat - now
                ),
            ));
        }
        // Without iat the token could have been minted any time: count from now.
        let (start, basis) = match claims.iat {
            Some(iat) => (iat, "exp - iat"),
            None => (now, "exp - now, no iat"),
        };
        let lifetime = claims.exp.saturating_sub(start);
        if lifetime > max.saturating_add(LEEWAY_SECS) {
            return Err((
                "lifetime_too_long",
                format!(
                    "token lifetime of {} ({basis}) exceeds the maximum of {} (auth.jwt_max_lifetime)",
                    humantime::format_duration(Duration::from_secs(lifetime.min(u64::MAX / 2))),
                    humantime::format_duration(self.max_lifetime)
                ),
            ));
        }
        Ok(())
    }

    /// Counts and logs (rate-limited) a refusal; the token itself is never logged.
    fn refused(&self, peer: Option<IpAddr>, reason: &'static str, message: String) -> KasError {
        self.failures.record(peer, reason);
        KasError::Unauthenticated(message)
    }

    /// The metric reason and the caller's message for a refusal by the JWT library.
    fn describe(&self, kind: &ErrorKind) -> (&'static str, String) {
        let (reason, why) = match kind {
            ErrorKind::ExpiredSignature => ("expired", "token has expired".to_owned()),
            ErrorKind::ImmatureSignature => ("not_yet_valid", "token is not valid yet (nbf)".to_owned()),
            ErrorKind::InvalidIssuer => ("wrong_issuer", format!("wrong issuer, expected \"{}\"", self.issuer)),
            ErrorKind::InvalidAudience => (
                "wrong_audience",
                format!("wrong audience, expected \"{}\" (or an array containing it)", self.audience),
            ),
            ErrorKind::InvalidSignature => ("invalid_signature", "invalid signature".to_owned()),
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName | ErrorKind::UnsupportedAlgorithm => {
                ("wrong_algorithm", "algorithm not allowed, expected HS256".to_owned())
            }
            ErrorKind::MissingRequiredClaim(c) => ("malformed", format!("missing required claim \"{c}\"")),
            ErrorKind::InvalidClaimFormat(c) => ("malformed", format!("invalid claim \"{c}\"")),
            // A header with `alg: none` fails to parse as a known algorithm; it lands here.
            ErrorKind::Json(_) | ErrorKind::Base64(_) | ErrorKind::Utf8(_) | ErrorKind::InvalidToken => {
                ("malformed", "malformed token (only HS256-signed JWTs are accepted)".to_owned())
            }
            _ => ("other", "token rejected".to_owned()),
        };
        (reason, format!("invalid JWT: {why}"))
    }
}

/// Mints an HS256 JWT (for GitLab-style callers, kas -> kas calls, tests and `kas mint-jwt`).
pub fn mint_jwt(secret: &Secret, issuer: &str, audience: &str, ttl: Duration) -> Result<String, KasError> {
    let now = jsonwebtoken::get_current_timestamp();
    let claims = Claims {
        iss: issuer.to_owned(),
        aud: Audience::One(audience.to_owned()),
        iat: Some(now),
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
        Claims {
            iss: iss.into(),
            aud: Audience::One(aud.into()),
            iat: Some(now),
            exp: (now as i64 + exp_offset) as u64,
            nbf: None,
        }
    }

    fn sign(secret: &Secret, c: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), c, &EncodingKey::from_secret(secret.bytes())).unwrap()
    }

    fn err(v: &JwtVerifier, token: &str) -> String {
        v.verify(token).unwrap_err().to_string()
    }

    /// An accepted token is kept (by digest) until its `exp` plus the leeway, and checked in
    /// full again after that; refused tokens are never kept; the map stays bounded.
    #[test]
    fn accepted_tokens_are_kept_until_they_expire() {
        let secret = Secret::generate();
        let v = JwtVerifier::gitlab(&secret);
        let kept = || v.verified.valid_until.lock().unwrap().clone();
        let token = mint_jwt(&secret, "gitlab", "gitlab-kas", Duration::from_secs(60)).unwrap();
        v.verify(&token).unwrap();
        let now = jsonwebtoken::get_current_timestamp();
        let digest = VerifiedTokens::digest(&token);
        let until = kept()[&digest];
        assert!((now + 60..=now + 61 + LEEWAY_SECS).contains(&until), "{until} vs now {now}");
        // From the cache, the same clone or another: one map per verifier.
        v.clone().verify(&token).unwrap();
        assert_eq!(kept().len(), 1);
        assert!(v.verified.is_verified(&digest, until) && !v.verified.is_verified(&digest, until + 1));

        let other_key = sign(&Secret::generate(), &claims("gitlab", "gitlab-kas", 60));
        assert!(err(&v, &other_key).contains("invalid signature"));
        let expired = sign(&secret, &claims("gitlab", "gitlab-kas", -60));
        assert!(err(&v, &expired).contains("expired"));
        assert_eq!(kept().len(), 1, "refused tokens are not kept");

        // Full: expired entries go first; if none did, all of them.
        let tokens = VerifiedTokens::default();
        for i in 0..VERIFIED_TOKENS_MAX {
            tokens.insert(VerifiedTokens::digest(&i.to_string()), if i == 0 { 5 } else { 100 }, 10);
        }
        tokens.insert(VerifiedTokens::digest("next"), 100, 10);
        let map = tokens.valid_until.lock().unwrap().clone();
        assert_eq!(map.len(), VERIFIED_TOKENS_MAX);
        assert!(!map.contains_key(&VerifiedTokens::digest("0")) && map.contains_key(&VerifiedTokens::digest("next")));
        tokens.insert(VerifiedTokens::digest("one more"), 100, 10);
        assert_eq!(tokens.valid_until.lock().unwrap().len(), 1);
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

    fn sign_json(secret: &Secret, claims: &serde_json::Value) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(secret.bytes())).unwrap()
    }

    fn now() -> i64 {
        jsonwebtoken::get_current_timestamp() as i64
    }

    #[test]
    fn audience_may_be_an_array_containing_ours() {
        let secret = Secret::generate();
        let v = JwtVerifier::gitlab(&secret);
        let t = now();
        let ok = serde_json::json!({"iss": "gitlab", "aud": ["other", "gitlab-kas"], "iat": t, "exp": t + 60});
        v.verify(&sign_json(&secret, &ok)).unwrap();
        let single = serde_json::json!({"iss": "gitlab", "aud": ["gitlab-kas"], "iat": t, "exp": t + 60});
        v.verify(&sign_json(&secret, &single)).unwrap();
        let wrong = serde_json::json!({"iss": "gitlab", "aud": ["other", "gitlab"], "iat": t, "exp": t + 60});
        assert!(err(&v, &sign_json(&secret, &wrong)).contains("wrong audience"));
        let empty = serde_json::json!({"iss": "gitlab", "aud": [], "iat": t, "exp": t + 60});
        assert!(err(&v, &sign_json(&secret, &empty)).contains("wrong audience"));
    }

    #[test]
    fn iat_in_the_future_is_refused_beyond_the_clock_skew() {
        let secret = Secret::generate();
        let v = JwtVerifier::gitlab(&secret);
        let t = now();
        let future = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": t + 3600, "exp": t + 3660});
        let e = err(&v, &sign_json(&secret, &future));
        assert!(e.contains("issued in the future") && e.contains("iat"), "{e}");
        // A clock a couple of seconds ahead is tolerated.
        let skewed = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": t + 2, "exp": t + 62});
        v.verify(&sign_json(&secret, &skewed)).unwrap();
    }

    #[test]
    fn lifetime_longer_than_the_maximum_is_refused() {
        let secret = Secret::generate();
        let v = JwtVerifier::gitlab(&secret);
        let t = now();
        // exp in year 9999.
        let forever = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": t, "exp": 253_402_300_799_i64});
        let e = err(&v, &sign_json(&secret, &forever));
        assert!(e.contains("lifetime") && e.contains("maximum"), "{e}");
        let day = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": t, "exp": t + 86_400});
        assert!(err(&v, &sign_json(&secret, &day)).contains("lifetime"));
        // Without iat, the time left until exp counts.
        let no_iat = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "exp": t + 86_400});
        assert!(err(&v, &sign_json(&secret, &no_iat)).contains("lifetime"));
        let no_iat_short = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "exp": t + 60});
        v.verify(&sign_json(&secret, &no_iat_short)).unwrap();
        // Exactly the maximum (the default TTL of `kas mint-jwt`) is fine.
        let hour = serde_json::json!({"iss": "gitlab", "aud": "gitlab-kas", "iat": t, "exp": t + 3600});
        v.verify(&sign_json(&secret, &hour)).unwrap();
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
