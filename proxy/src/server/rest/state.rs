//! What the REST gateway's handlers share with the feature modules that add routes to it (the
//! Kubernetes API proxy): kept apart from `mod.rs`, which assembles those routes, so that the
//! modules do not depend on the file that depends on them.

use std::collections::BTreeMap;

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::HeaderMap;
use kas_proto::tunnel::pb::MetadataValues;

use super::config::RestConfig;
use crate::auth::JwtVerifier;
use crate::error::KasError;
use crate::router::Router;

/// What the REST handlers share. The Kubernetes API proxy routes use the same state. axum
/// clones it for every request: one reference count, not one per part (a dozen atomic updates
/// and as many back per proxied request).
#[derive(Clone)]
pub struct RestState(std::sync::Arc<RestStateParts>);

impl RestState {
    pub fn new(parts: RestStateParts) -> Self {
        Self(std::sync::Arc::new(parts))
    }
}

impl std::ops::Deref for RestState {
    type Target = RestStateParts;

    fn deref(&self) -> &RestStateParts {
        &self.0
    }
}

/// The parts of [`RestState`].
pub struct RestStateParts {
    /// The one router (the same `KasApi` uses).
    pub router: Router,
    /// Verifies callers' JWTs (GitLab's: the api listener's rules).
    pub verifier: JwtVerifier,
    pub config: std::sync::Arc<RestConfig>,
    /// Verifies the other callers of the Kubernetes API proxy (CI jobs, people).
    pub callers: crate::modules::kubernetes_api::callers::CallerVerifiers,
    /// GitOps status and push events (the same state `KasApi` uses).
    pub gitops: std::sync::Arc<crate::modules::gitops::state::GitopsState>,
    /// Agents' cluster state (the same hub the `ClusterState` gRPC service uses).
    pub cluster_state: std::sync::Arc<crate::modules::cluster_state::hub::ClusterStateHub>,
}

/// The whitelisted caller headers (`FORWARDED_METADATA`) as tunnel metadata for agentk.
pub fn forwarded_metadata(headers: &HeaderMap) -> BTreeMap<String, MetadataValues> {
    kas_proto::metadata::FORWARDED_METADATA
        .iter()
        .filter_map(|key| {
            let values: Vec<String> =
                headers.get_all(*key).iter().filter_map(|v| v.to_str().ok().map(str::to_owned)).collect();
            (!values.is_empty()).then(|| ((*key).to_owned(), MetadataValues { values }))
        })
        .collect()
}

/// The text of a one-segment path parameter (an id, parsed by its type), or 400 when axum
/// could not decode the path.
pub fn path_text(path: Result<Path<String>, PathRejection>) -> Result<String, KasError> {
    let Path(raw) = path.map_err(|e| KasError::InvalidArgument(format!("bad path: {}", e.body_text())))?;
    Ok(raw)
}
