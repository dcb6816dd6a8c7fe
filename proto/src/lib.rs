//! The wire protocol shared by kas and agentk.
//!
//! - [`kas`]: the public API of the routing specification (`KasApi`, `KasInternal`, ...).
//! - [`tunnel`]: the agent-facing service (`AgentTunnel`) and the frame-order state machine.
//! - [`get_pods`]: the agentk half of GetPods, served through a tunnel.
//! - [`ids`]: newtypes for the ids that travel everywhere.

pub mod flow;
pub mod ids;
pub mod metadata;
pub mod tunnel;

/// Generated code for `kas.v1`.
pub mod kas {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/api/kas.v1.rs"));
}

/// Generated code for `kas.registry.v1` (what kas stores in Redis and publishes).
pub mod registry {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/base/kas.registry.v1.rs"));
}

/// Generated code for `kas.kubernetes_api.v1`, and the HTTP <-> frame adapters.
pub mod kubernetes_api {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/base/kas.kubernetes_api.v1.rs"));

    /// Tunnel method name of the agentk half of the Kubernetes API proxy.
    pub const METHOD: &str = "/kas.kubernetes_api.v1.KubernetesApi/MakeRequest";

    pub use crate::http::*;
}

pub mod http;

/// Generated code for `kas.get_pods.v1`.
pub mod get_pods {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/features/kas.get_pods.v1.rs"));

    /// Tunnel method name of the agentk half of GetPods.
    pub const METHOD: &str = "/kas.get_pods.v1.GetPodsAgent/GetPods";
}

pub use ids::{AgentId, ConnectionId, InvalidId, ProjectId};
