//! agentk's features. Each has a kas half under the same name in kas. Most serve requests
//! that come through tunnels (`methods` + `handle`); a feature that works on its own, such as
//! GitOps (streams it opens to kas, writes to the cluster), does it in `run`. The one list of
//! modules of this binary is [`all`].

pub mod cluster_state;
pub mod get_pods;
pub mod gitops;
pub mod kubernetes_api;

use std::sync::Arc;

use async_trait::async_trait;
use kas_proto::tunnel::pb::ConfigurationResponse;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::status::GitopsState;
use crate::tunnel::{Responder, TunnelRequest};

#[async_trait]
pub trait Module: Send + Sync + 'static {
    /// Full method names this module serves (advertised in every tunnel's Descriptor).
    fn methods(&self) -> &'static [&'static str] {
        &[]
    }
    /// Serves one request. Errors are reported to kas through the responder. Only called with a
    /// method of [`Module::methods`].
    async fn handle(&self, request: &mut TunnelRequest, responder: &Responder) {
        let status = tonic::Status::unimplemented(format!("agentk does not serve {}", request.method));
        let _ = responder.error(&status).await;
    }
    /// The module's own work, started once by `App::run`; returns soon after `shutdown`.
    async fn run(self: Arc<Self>, _context: RunContext, _shutdown: CancellationToken) {}
}

/// What modules are built with.
pub struct ModuleContext<'a> {
    pub kube_config: &'a kube::Config,
    /// The agent configuration as kas last sent it.
    pub configuration: &'a watch::Sender<Option<ConfigurationResponse>>,
    pub api_timeouts: kubernetes_api::ApiTimeouts,
    pub gitops: gitops::GitopsSettings,
    /// From the downward API (empty outside Kubernetes).
    pub pod_name: &'a str,
    pub pod_namespace: &'a str,
    /// What the GitOps module tells `Status`.
    pub gitops_state: &'a watch::Sender<GitopsState>,
}

impl ModuleContext<'_> {
    /// Where a feature's Lease lives: the pod's namespace, else the kubeconfig's.
    pub fn lease_namespace(&self) -> String {
        if self.pod_namespace.is_empty() {
            self.kube_config.default_namespace.clone()
        } else {
            self.pod_namespace.to_owned()
        }
    }

    /// This replica's identity as a Lease holder: the pod name (unique among replicas), else a
    /// random one.
    pub fn lease_identity(&self) -> String {
        if self.pod_name.is_empty() {
            format!("agentk-{:016x}", rand::random::<u64>())
        } else {
            self.pod_name.to_owned()
        }
    }
}

/// What a module's `run` may use to call kas.
#[derive(Clone)]
pub struct RunContext {
    /// One lazily connected channel per `--kas-address`, in order.
    pub kas: Arc<[(String, Channel)]>,
    /// The agent token (sent as `authorization: Bearer`).
    pub token: Arc<str>,
}

impl RunContext {
    /// `message` with the agent token, as kas's agent listener wants every call.
    pub fn authorized<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Ok(v) = format!("Bearer {}", self.token).parse() {
            request.metadata_mut().insert(kas_proto::metadata::AUTHORIZATION, v);
        }
        request
    }
}

/// Every module of agentk.
pub fn all(context: &ModuleContext) -> Result<Vec<Arc<dyn Module>>, kube::Error> {
    let client = kube::Client::try_from(context.kube_config.clone())?;
    Ok(vec![
        Arc::new(get_pods::GetPods::new(client.clone())),
        Arc::new(kubernetes_api::KubernetesApi::new(
            context.kube_config,
            context.configuration.subscribe(),
            context.api_timeouts,
        )?),
        Arc::new(gitops::Gitops::new(client.clone(), context)),
        Arc::new(cluster_state::ClusterState::new(client, context)),
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
