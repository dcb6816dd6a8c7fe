//! GitOps, kas's half (issue 16): kas polls the agent's manifest projects and streams the
//! objects of a new commit to agentk, which applies them. So far: reading a manifest project's
//! files and objects at a commit, within the limits ([`manifests`]). Polling, the stream to
//! agentk and agentk's half are not built yet.

pub mod manifests;
