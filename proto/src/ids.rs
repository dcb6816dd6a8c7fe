//! Id newtypes. They are plain `i64`s on the wire (as in the specification); the types keep an
//! agent id from being passed where a project id is expected.
//!
//! Ids that callers send are validated here and nowhere else, by the same rules on every
//! listener and route: [`AgentId::from_wire`] for integers of protobuf messages and
//! [`AgentId::parse`] for text (paths, queries, metadata: decimal digits only, no sign, no
//! spaces). Agent, project and connection ids are positive; where a request may leave the
//! connection open, 0 means any ([`ConnectionId::from_wire_or_any`]).

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

/// What an id must be.
const POSITIVE: &str = "a positive integer";
const POSITIVE_OR_ANY: &str = "a non-negative integer (0: any connection)";

/// A caller sent an id that is not valid for its field (INVALID_ARGUMENT / 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be {rule}{text}, got {got}", text = if *.from_text { " (decimal digits)" } else { "" })]
pub struct InvalidId {
    field: String,
    rule: &'static str,
    from_text: bool,
    got: String,
}

fn check(field: &str, v: i64, min: i64, rule: &'static str) -> Result<i64, InvalidId> {
    if v < min {
        return Err(InvalidId { field: field.to_owned(), rule, from_text: false, got: v.to_string() });
    }
    Ok(v)
}

/// Decimal digits only (`+1`, ` 1`, `1.0` and `0x1` are refused), at least `min`.
fn parse(field: &str, raw: &str, min: i64, rule: &'static str) -> Result<i64, InvalidId> {
    let invalid = || InvalidId { field: field.to_owned(), rule, from_text: true, got: format!("{raw:?}") };
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    raw.parse::<i64>().ok().filter(|v| *v >= min).ok_or_else(invalid)
}

macro_rules! positive_id {
    ($name:ident) => {
        impl $name {
            /// The id of a message field: positive, or [`InvalidId`] naming `field`.
            pub fn from_wire(field: &str, v: i64) -> Result<Self, InvalidId> {
                check(field, v, 1, POSITIVE).map(Self)
            }

            /// The id in a path, query or metadata value: positive decimal digits.
            pub fn parse(field: &str, raw: &str) -> Result<Self, InvalidId> {
                parse(field, raw, 1, POSITIVE).map(Self)
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

positive_id!(AgentId);
positive_id!(ConnectionId);
positive_id!(ProjectId);

impl ConnectionId {
    /// A message field that may name a connection: 0 (any) or a connection id.
    pub fn from_wire_or_any(field: &str, v: i64) -> Result<Self, InvalidId> {
        check(field, v, 0, POSITIVE_OR_ANY).map(Self)
    }

    /// A query that may name a connection: decimal digits, 0 for any.
    pub fn parse_or_any(field: &str, raw: &str) -> Result<Self, InvalidId> {
        parse(field, raw, 0, POSITIVE_OR_ANY).map(Self)
    }

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
    fn every_id_follows_one_rule() {
        assert_eq!(AgentId::parse("agent_id", "17"), Ok(AgentId(17)));
        assert_eq!(AgentId::from_wire("agent_id", 17), Ok(AgentId(17)));
        for raw in ["", "0", "-1", "+1", " 1", "1.5", "0x1", "99999999999999999999"] {
            let e = AgentId::parse("agent_id", raw).unwrap_err().to_string();
            assert_eq!(e, format!("agent_id must be a positive integer (decimal digits), got {raw:?}"));
        }
        assert_eq!(
            ProjectId::from_wire("project_id", 0).unwrap_err().to_string(),
            "project_id must be a positive integer, got 0"
        );
        // A hop or a presence stream names one connection: 0 is not "any" there.
        assert!(ConnectionId::parse("kas-hop-connection-id", "0").is_err());
        assert!(ConnectionId::from_wire("connection_id", 0).is_err());
        assert_eq!(ConnectionId::from_wire_or_any("connection_id", 0), Ok(ConnectionId::ANY));
        assert_eq!(ConnectionId::parse_or_any("connection_id", "0"), Ok(ConnectionId::ANY));
        assert_eq!(
            ConnectionId::parse_or_any("connection_id", "-1").unwrap_err().to_string(),
            "connection_id must be a non-negative integer (0: any connection) (decimal digits), got \"-1\""
        );
    }

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

        /// Any text a caller can put in a path, query or metadata value: an id exactly when it
        /// is decimal digits of a value in range, never a panic.
        #[test]
        fn ids_from_arbitrary_text(raw in prop_oneof![
            "[0-9]{0,20}",
            "[+-]?[0-9]{1,20}",
            "[ -~]{0,12}",
            any::<i64>().prop_map(|v| v.to_string()),
        ]) {
            let digits = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit());
            let value = raw.parse::<i64>().ok().filter(|_| digits);
            prop_assert_eq!(AgentId::parse("agent_id", &raw).ok(), value.filter(|v| *v > 0).map(AgentId));
            prop_assert_eq!(ProjectId::parse("project_id", &raw).ok(), value.filter(|v| *v > 0).map(ProjectId));
            prop_assert_eq!(ConnectionId::parse("id", &raw).ok(), value.filter(|v| *v > 0).map(ConnectionId));
            prop_assert_eq!(ConnectionId::parse_or_any("id", &raw).ok(), value.map(ConnectionId));
        }

        /// Message fields: positive ids, and 0 only where "any connection" is allowed.
        #[test]
        fn ids_from_arbitrary_wire_values(v in any::<i64>()) {
            prop_assert_eq!(AgentId::from_wire("agent_id", v).is_ok(), v > 0);
            prop_assert_eq!(ConnectionId::from_wire("connection_id", v).is_ok(), v > 0);
            prop_assert_eq!(ConnectionId::from_wire_or_any("connection_id", v).is_ok(), v >= 0);
        }
    }
}
