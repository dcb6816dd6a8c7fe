//! Id newtypes. They are plain `i64`s on the wire (as in the specification); the types keep an
//! agent id from being passed where a project id is expected.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<i64> for $name {
            fn from(v: i64) -> Self {
                Self(v)
            }
        }
    };
}

id_type!(
    /// The id GitLab gives an agent. Several agentk replicas share one.
    AgentId
);
id_type!(
    /// Identifies one agentk process connection (one `GetConfiguration` stream). 0 means "any".
    ConnectionId
);
id_type!(
    /// The id of an agent's configuration project.
    ProjectId
);

impl ConnectionId {
    /// "Any connection" in requests that may name one.
    pub const ANY: ConnectionId = ConnectionId(0);

    /// A random, positive, non-zero id (positive so it prints and parses the same everywhere).
    pub fn random() -> Self {
        loop {
            let v = rand::random::<i64>() & i64::MAX;
            if v != 0 {
                return Self(v);
            }
        }
    }

    pub fn is_any(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_connection_ids_are_positive() {
        for _ in 0..1000 {
            assert!(ConnectionId::random().0 > 0);
        }
    }
}
