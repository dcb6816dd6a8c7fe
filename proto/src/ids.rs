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

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every id prints as its decimal value, which parses back to the same id.
        #[test]
        fn ids_print_and_parse_back(v in any::<i64>()) {
            prop_assert_eq!(AgentId(v).to_string().parse::<i64>().map(AgentId), Ok(AgentId(v)));
            prop_assert_eq!(ConnectionId(v).to_string().parse::<i64>().map(ConnectionId), Ok(ConnectionId(v)));
            prop_assert_eq!(ProjectId(v).to_string(), v.to_string());
            prop_assert_eq!(ConnectionId(v).is_any(), v == 0);
        }
    }
}
