//! Who agentk acts as for one Kubernetes API request, when not as itself.
//!
//! kas decides it (from the caller's identity and the agent's `ci_access` / `user_access`) and
//! sends it in the tunnel's request metadata under the `kas-impersonate-*` keys; agentk turns it
//! into the API server's `Impersonate-*` headers. Callers cannot set these keys: kas forwards
//! only [`crate::metadata::FORWARDED_METADATA`] of a caller's metadata, and agentk never forwards
//! a caller's `Impersonate-*` headers.

use std::collections::BTreeMap;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::tunnel::pb::MetadataValues;

/// The user name (required when impersonating).
pub const USER: &str = "kas-impersonate-user";
/// The user's uid (optional).
pub const UID: &str = "kas-impersonate-uid";
/// The groups, one value each.
pub const GROUP: &str = "kas-impersonate-group";
/// `kas-impersonate-extra-<key>`: the values of one extra key (the key as is, not escaped).
pub const EXTRA_PREFIX: &str = "kas-impersonate-extra-";

/// An identity to impersonate (Kubernetes' `user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Impersonation {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Impersonation metadata agentk cannot apply (kas sent something it should not have).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid impersonation metadata: {0}")]
pub struct InvalidImpersonation(String);

impl Impersonation {
    /// Adds this identity to a tunnel's request metadata.
    pub fn insert_into(&self, metadata: &mut BTreeMap<String, MetadataValues>) {
        metadata.insert(USER.to_owned(), MetadataValues { values: vec![self.user.clone()] });
        if let Some(uid) = &self.uid {
            metadata.insert(UID.to_owned(), MetadataValues { values: vec![uid.clone()] });
        }
        if !self.groups.is_empty() {
            metadata.insert(GROUP.to_owned(), MetadataValues { values: self.groups.clone() });
        }
        for (key, values) in &self.extra {
            metadata.insert(format!("{EXTRA_PREFIX}{key}"), MetadataValues { values: values.clone() });
        }
    }

    /// The identity in a tunnel's request metadata: `None` when there is none (agentk acts as
    /// itself); an error when some `kas-impersonate-*` key is there without a single user name.
    pub fn from_metadata(metadata: &BTreeMap<String, MetadataValues>) -> Result<Option<Self>, InvalidImpersonation> {
        let mut user = None;
        let mut identity = Self::default();
        for (key, values) in metadata {
            let Some(name) = key.strip_prefix("kas-impersonate-") else { continue };
            let values = &values.values;
            match name {
                "user" => user = Some(values.clone()),
                "uid" => match values.as_slice() {
                    [uid] => identity.uid = Some(uid.clone()),
                    _ => return Err(InvalidImpersonation(format!("{UID} needs exactly one value"))),
                },
                "group" => identity.groups.clone_from(values),
                _ => match key.strip_prefix(EXTRA_PREFIX).filter(|k| !k.is_empty()) {
                    Some(extra) => {
                        identity.extra.insert(extra.to_owned(), values.clone());
                    }
                    None => return Err(InvalidImpersonation(format!("unknown key {key}"))),
                },
            }
        }
        match user {
            None if identity == Self::default() => Ok(None),
            Some(values) if values.len() == 1 && !values[0].is_empty() => {
                identity.user.clone_from(&values[0]);
                Ok(Some(identity))
            }
            _ => Err(InvalidImpersonation(format!("{USER} needs exactly one non-empty value"))),
        }
    }

    /// The API server's impersonation headers: `Impersonate-User`, `Impersonate-Uid`,
    /// `Impersonate-Group` (one per group), `Impersonate-Extra-<key>` (one per value; the key
    /// percent-encoded where a header name cannot hold it, as client-go does).
    pub fn headers(&self) -> Result<HeaderMap, InvalidImpersonation> {
        let value = |v: &str| {
            HeaderValue::from_str(v).map_err(|_| InvalidImpersonation(format!("{v:?} cannot be a header value")))
        };
        let mut headers = HeaderMap::new();
        headers.insert("impersonate-user", value(&self.user)?);
        if let Some(uid) = &self.uid {
            headers.insert("impersonate-uid", value(uid)?);
        }
        for group in &self.groups {
            headers.append("impersonate-group", value(group)?);
        }
        for (key, values) in &self.extra {
            let name = HeaderName::from_bytes(format!("impersonate-extra-{}", escape_header_key(key)).as_bytes())
                .map_err(|_| InvalidImpersonation(format!("extra key {key:?} cannot be a header name")))?;
            for v in values {
                headers.append(name.clone(), value(v)?);
            }
        }
        Ok(headers)
    }
}

/// client-go's `headerKeyEscape`: bytes that are not legal in a header name become `%XX`, so
/// `agent.gitlab.com/id` is sent as `Impersonate-Extra-agent.gitlab.com%2Fid`, and the API
/// server unescapes it.
fn escape_header_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        let legal = b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
        if legal {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ci_job() -> Impersonation {
        Impersonation {
            user: "gitlab:ci_job:42".into(),
            uid: None,
            groups: vec!["gitlab:ci_job".into(), "gitlab:project:7".into()],
            extra: BTreeMap::from([
                ("agent.gitlab.com/id".to_owned(), vec!["1".to_owned()]),
                ("agent.gitlab.com/ci_job_id".to_owned(), vec!["42".to_owned()]),
            ]),
        }
    }

    #[test]
    fn metadata_round_trip_and_headers() {
        let mut md = BTreeMap::new();
        md.insert("x-request-id".to_owned(), MetadataValues { values: vec!["r".into()] });
        assert_eq!(Impersonation::from_metadata(&md).unwrap(), None, "no keys: agentk acts as itself");
        ci_job().insert_into(&mut md);
        assert_eq!(Impersonation::from_metadata(&md).unwrap(), Some(ci_job()));

        let h = ci_job().headers().unwrap();
        assert_eq!(h["impersonate-user"], "gitlab:ci_job:42");
        let groups: Vec<_> = h.get_all("impersonate-group").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(groups, ["gitlab:ci_job", "gitlab:project:7"]);
        assert_eq!(h["impersonate-extra-agent.gitlab.com%2fid"], "1");
        assert_eq!(h["impersonate-extra-agent.gitlab.com%2fci_job_id"], "42");
        assert!(!h.contains_key("impersonate-uid"));
    }

    #[test]
    fn incomplete_metadata_is_refused() {
        let mut md = BTreeMap::new();
        md.insert(GROUP.to_owned(), MetadataValues { values: vec!["g".into()] });
        assert!(Impersonation::from_metadata(&md).unwrap_err().to_string().contains(USER));
        md.insert(USER.to_owned(), MetadataValues { values: vec!["a".into(), "b".into()] });
        assert!(Impersonation::from_metadata(&md).is_err(), "two user names");
        md.insert(USER.to_owned(), MetadataValues { values: vec!["a".into()] });
        assert_eq!(Impersonation::from_metadata(&md).unwrap().unwrap().groups, ["g"]);
        md.insert("kas-impersonate-everything".to_owned(), MetadataValues { values: vec![] });
        assert!(Impersonation::from_metadata(&md).unwrap_err().to_string().contains("unknown key"));
    }

    #[test]
    fn header_values_that_cannot_be_sent_are_errors() {
        let mut i = ci_job();
        i.user = "bad\nname".into();
        assert!(i.headers().is_err());
        assert_eq!(escape_header_key("a b/c%"), "a%20b%2Fc%25");
    }
}
