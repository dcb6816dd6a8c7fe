//! Metrics of the cluster state feature.

pub const VIEWS: &str = "kas_cluster_state_views";
pub const AGENTS: &str = "kas_cluster_state_agents";
pub const PUSHED: &str = "kas_cluster_state_pushed_messages_total";
pub const EVENTS: &str = "kas_cluster_state_events_total";
pub const RESNAPSHOTS: &str = "kas_cluster_state_subscriber_snapshots_total";
pub const SUBSCRIBERS: &str = "kas_cluster_state_subscribers";

pub fn describe() {
    metrics::describe_gauge!(VIEWS, "Object views this kas holds, over all agents (sampled every 30 s)");
    metrics::describe_gauge!(
        AGENTS,
        "Agents whose cluster state this kas holds, live or retained (sampled every 30 s)"
    );
    metrics::describe_counter!(PUSHED, "Messages of agentk's cluster state streams received");
    metrics::describe_counter!(
        EVENTS,
        "Changes to the views (upserts, deletes, removed resources, freshness) made into events for subscribers"
    );
    metrics::describe_counter!(
        RESNAPSHOTS,
        "Snapshots sent to subscribers instead of the changes they fell behind on (slow readers coalesced to the \
         current state), by where the subscriber is (local, peer)"
    );
    metrics::describe_gauge!(SUBSCRIBERS, "Open watches of cluster state (SSE, gRPC, peers) on this kas");
}

pub fn pushed(events: usize) {
    metrics::counter!(PUSHED).increment(1);
    metrics::counter!(EVENTS).increment(events as u64);
}

pub fn held(agents: usize, views: usize) {
    metrics::gauge!(AGENTS).set(agents as f64);
    metrics::gauge!(VIEWS).set(views as f64);
}

pub fn resnapshot() {
    metrics::counter!(RESNAPSHOTS).increment(1);
}

/// A watch opened (+1) or closed (-1).
pub fn subscribers(delta: f64) {
    metrics::gauge!(SUBSCRIBERS).increment(delta);
}
