//! The wire protocol shared by kas and agentk.
//!
//! - [`kas`]: the public API of the routing specification (`KasApi`, `KasInternal`, ...).
//! - [`tunnel`]: the agent-facing service (`AgentTunnel`) and the frame-order state machine.
//! - [`get_pods`]: the agentk half of GetPods, served through a tunnel.
//! - [`ids`]: newtypes for the ids that travel everywhere, validated in one place.
//! - [`pb`]: the generated code of every package, nested by package name
//!   (`kas.get_pods.v1` is `pb::kas::get_pods::v1`); the modules above name the ones kas and
//!   agentk use most.

pub mod flow;
pub mod ids;
pub mod impersonation;
pub mod metadata;
pub mod runtime_thread;
pub mod tunnel;

/// Generated code of every package under `proto/` (see `build.rs`).
pub mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/packages.rs"));
}

/// `kas.v1`: the routing specification's API.
pub mod kas {
    pub use crate::pb::kas::v1::*;
}

/// `kas.registry.v1`: what kas stores in Redis and publishes.
pub mod registry {
    pub use crate::pb::kas::registry::v1::*;
}

/// `kas.kubernetes_api.v1`, and the HTTP <-> frame adapters.
pub mod kubernetes_api {
    pub use crate::pb::kas::kubernetes_api::v1::*;

    /// Tunnel method name of the agentk half of the Kubernetes API proxy.
    pub const METHOD: &str = "/kas.kubernetes_api.v1.KubernetesApi/MakeRequest";

    pub use crate::http::*;
}

pub mod http;

/// `kas.get_pods.v1`: the agentk half of GetPods.
/// GitOps: agentk pulls the objects of its manifest projects.
pub mod gitops {
    pub use crate::pb::kas::gitops::v1::*;
}

pub mod get_pods {
    pub use crate::pb::kas::get_pods::v1::*;

    /// Tunnel method name of the agentk half of GetPods.
    pub const METHOD: &str = "/kas.get_pods.v1.GetPodsAgent/GetPods";
}

pub use ids::{AgentId, ConnectionId, InvalidId, ProjectId};

/// `kas.cluster_state.v1`: agentk's informer views and callers' reads of them.
pub mod cluster_state {
    pub use crate::pb::kas::cluster_state::v1::*;
}
