//! Features agentk serves through tunnels. Each has a kas half under the same name in kas.
//! The one list of modules of this binary is [`all`].

pub mod get_pods;
pub mod kubernetes_api;

use std::sync::Arc;

use async_trait::async_trait;

use crate::tunnel::{Responder, TunnelRequest};

#[async_trait]
pub trait Module: Send + Sync + 'static {
    /// Full method names this module serves (advertised in every tunnel's Descriptor).
    fn methods(&self) -> &'static [&'static str];
    /// Serves one request. Errors are reported to kas through the responder.
    async fn handle(&self, request: &mut TunnelRequest, responder: &Responder);
}

/// Every module of agentk; `configuration` is the agent configuration as kas last sent it.
pub fn all(
    kube_config: &kube::Config,
    configuration: &tokio::sync::watch::Sender<Option<kas_proto::tunnel::pb::ConfigurationResponse>>,
    api_timeouts: kubernetes_api::ApiTimeouts,
) -> Result<Vec<Arc<dyn Module>>, kube::Error> {
    let client = kube::Client::try_from(kube_config.clone())?;
    Ok(vec![
        Arc::new(get_pods::GetPods::new(client)),
        Arc::new(kubernetes_api::KubernetesApi::new(kube_config, configuration.subscribe(), api_timeouts)?),
    ])
}

/// Maps a Kubernetes client error to the status agentk reports to kas.
pub fn kube_status(err: &kube::Error) -> tonic::Status {
    match err {
        kube::Error::Api(s) => {
            let message = format!("Kubernetes API: {} ({})", s.message, s.reason);
            match s.code {
                401 => tonic::Status::unauthenticated(message),
                403 => tonic::Status::permission_denied(message),
                404 => tonic::Status::not_found(message),
                429 => tonic::Status::resource_exhausted(message),
                _ => tonic::Status::unavailable(message),
            }
        }
        other => tonic::Status::unavailable(format!("Kubernetes API unreachable: {other}")),
    }
}
