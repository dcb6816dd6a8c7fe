//! Features. Each has a kas half here and an agentk half under the same name in agentk.

pub mod configuration;
pub mod get_pods;
pub mod kubernetes_api;
