//! Which kinds the API server serves, and how (resource name, scope): aggregated discovery (two
//! requests; Kubernetes 1.26+), else the per-group-version documents. Read once per sync, and
//! again while waiting for a CustomResourceDefinition applied by the sync to be served.

use std::time::Duration;

use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope};
use tokio::time::Instant;

/// Waits for a new kind start here and grow to the cap (the API server serves a CRD's kinds a
/// moment after it is Established).
const WAIT_FIRST: Duration = Duration::from_millis(50);
const WAIT_CAP: Duration = Duration::from_secs(2);

pub struct Resolver {
    client: kube::Client,
    discovery: Discovery,
}

impl Resolver {
    pub async fn new(client: kube::Client) -> Result<Self, kube::Error> {
        let discovery = run(&client).await?;
        Ok(Self { client, discovery })
    }

    async fn refresh(&mut self) -> Result<(), kube::Error> {
        self.discovery = run(&self.client).await?;
        Ok(())
    }

    /// (group, version, kind) → how it is served.
    pub fn resolve(&self, group: &str, version: &str, kind: &str) -> Option<(ApiResource, bool)> {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        self.discovery.resolve_gvk(&gvk).map(|(ar, caps)| (ar, namespaced(&caps)))
    }

    /// The kind at `version` if served, else at any version the group serves (an object recorded
    /// at a version the API server no longer serves is still reachable at another).
    pub fn resolve_any_version(&self, group: &str, version: &str, kind: &str) -> Option<(ApiResource, bool)> {
        self.resolve(group, version, kind).or_else(|| {
            let g = self.discovery.get(group)?;
            let found = g.versions().find_map(|v| g.versioned_resources(v).into_iter().find(|(ar, _)| ar.kind == kind));
            found.map(|(ar, caps)| (ar, namespaced(&caps)))
        })
    }

    /// Waits until the kind is served (its CRD was just applied), reading discovery again with
    /// growing pauses, until `deadline`.
    pub async fn wait_for(
        &mut self,
        group: &str,
        version: &str,
        kind: &str,
        deadline: Instant,
    ) -> Option<(ApiResource, bool)> {
        let mut pause = WAIT_FIRST;
        loop {
            if let Some(found) = self.resolve(group, version, kind) {
                return Some(found);
            }
            if Instant::now() + pause > deadline {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(WAIT_CAP);
            if let Err(e) = self.refresh().await {
                tracing::debug!(error = %e, "discovery failed while waiting for a new kind");
            }
        }
    }
}

fn namespaced(caps: &ApiCapabilities) -> bool {
    caps.scope == Scope::Namespaced
}

async fn run(client: &kube::Client) -> Result<Discovery, kube::Error> {
    match Discovery::new(client.clone()).run_aggregated().await {
        Ok(d) => Ok(d),
        Err(e) => {
            tracing::debug!(error = %e, "aggregated discovery failed; reading each group version");
            Discovery::new(client.clone()).run().await
        }
    }
}
